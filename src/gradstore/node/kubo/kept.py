"""Small RPC calls on one kept-alive connection, from a thread of their own.

httpx spends about 0.8 ms of the event loop's CPU on one small call (its request and
response objects, h11's framing, anyio's wrappers); the same ``pubsub/pub`` over a blocking
socket kept open costs 0.25 ms, in a worker thread (300 publishes of 400 bytes to one Kubo
0.42, docs/design/storage.md). A coordinator of a 64-step round publishes 200-300 messages
and its peers announce 256, one at a time (``KuboNode.publish``): those go this way. The
answer is read whole, into the thread's buffer (at most ``bulk.MAX_BLOCK_BYTES``); failures
become the node layer's errors through ``rpc.error_map``, as httpx's do.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO, cast

from ...dag.cid import CID
from ...errors import NodeError
from . import rpc
from .bulk import STREAM_BUFFER, BulkRead, send_all, thread_buffer
from .counts import count
from .settings import Timeouts


class KeptCalls:
    """Calls to ``api`` one at a time on one connection, reopened when the node closed it."""

    def __init__(self, api: str, *, auth: str | None, timeouts: Timeouts) -> None:
        self.api = api
        self.auth = auth
        self.timeouts = timeouts
        self._executor: ThreadPoolExecutor | None = None
        self._sock: socket.socket | None = None
        self._stream: BinaryIO | None = None

    async def call(
        self,
        command: str,
        params: rpc.Params,
        body: list[memoryview] | None = None,
        *,
        content_type: str | None = None,
        cid: CID | None = None,
        partial: bool = False,
    ) -> bytes:
        """``command`` with ``body`` (pieces, sent scattered); its answer's body (with
        ``partial``: what a stream sent before it failed, ``BulkRead.read_answer``). Calls
        queue for the one thread: a cancelled caller's call still runs to its end, so the
        connection stays in step."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="gradstore-kubo-kept")
        call = functools.partial(
            self._call, command, params, body or [], content_type, cid, partial
        )
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def close(self) -> None:
        """Close the connection once the calls queued are done (the thread then ends)."""
        if self._executor is not None:
            self._executor.submit(self._drop)
            self._executor.shutdown(wait=False)
            self._executor = None

    def _call(
        self,
        command: str,
        params: rpc.Params,
        body: list[memoryview],
        content_type: str | None,
        cid: CID | None,
        partial: bool,
    ) -> bytes:
        count(command)
        read = BulkRead(
            self.api,
            command,
            params,
            auth=self.auth,
            cid=cid,
            length=sum(piece.nbytes for piece in body),
            content_type=content_type,
            keep_alive=True,
        )

        def overflow() -> Exception:
            return NodeError(f"kubo {command}: an answer over {len(out)} bytes")

        out = thread_buffer()
        for _ in range(2):
            kept = self._sock is not None  # reused: the node may have closed it while idle
            stream = self._connect(read)
            began = False  # an answer began: whatever happens now, the call is not sent again
            try:
                send_all(self._sock, [memoryview(read.request), *body])  # type: ignore[arg-type]
                began = bool(stream.peek(1))  # type: ignore[attr-defined]
                if not began:
                    raise ConnectionResetError("the node closed the connection")
                n = read.read_answer(stream, out, overflow, partial=partial)
            except OSError as exc:
                self._drop()
                if kept and not began and not isinstance(exc, TimeoutError):
                    continue  # closed before it answered this call: once more, anew
                raise rpc.error_from_socket(exc, command, self.api, connecting=False) from exc
            except BaseException:
                self._drop()  # an error answer, or a bad one: the connection is out of step
                raise
            if not read.reusable:
                self._drop()
            return bytes(out[:n])
        raise NodeError(f"kubo {command}: the node closed the connection twice before answering")

    def _connect(self, read: BulkRead) -> BinaryIO:
        if self._stream is not None:
            return self._stream
        try:
            sock = socket.create_connection((read.host, read.port), timeout=self.timeouts.connect)
        except OSError as exc:
            raise rpc.error_from_socket(exc, read.command, self.api, connecting=True) from exc
        sock.settimeout(self.timeouts.read)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        self._stream = cast(BinaryIO, sock.makefile("rb", buffering=STREAM_BUFFER))
        return self._stream

    def _drop(self) -> None:
        stream, sock = self._stream, self._sock
        self._stream = self._sock = None
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
