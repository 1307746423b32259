"""Bulk HTTP/1.1 transfers to Kubo on a blocking socket, for a worker thread.

httpx moves large bodies through several small copies per 64 KiB on the event
loop (about 4x slower than ``ipfs cat`` for a 256 MiB file). Here the answer
body is read straight into the caller's buffer with ``readinto`` (the kernel
copies once), and the request ends with ``Connection: close`` so nothing is
pooled. Only plain ``http://`` APIs. Failures become the node layer's errors
through ``rpc.error_map``, the same table as httpx's.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable
from typing import BinaryIO, cast
from urllib.parse import quote, urlsplit

from ...dag.cid import CID
from ...errors import NodeError
from . import rpc
from .counts import count
from .settings import Timeouts

_MAX_LINE = 64 * 1024  # status, header, chunk-size and trailer lines
#: A transfer's progress is told once at least this many more bytes are in (and at its end):
#: Kubo sends ``cat`` in 4 KiB chunks, and a call per chunk (a lock and a check in the
#: caller's hasher) cost about 0.25 ms of CPU a MiB.
PROGRESS_STEP = 64 * 1024
_MAX_ERROR_BODY = 1 << 20


def supported(api: str) -> bool:
    """Whether ``api`` (``KuboNode.api``) can use this path (plain http)."""
    return urlsplit(api).scheme == "http"


class _Answer:
    def __init__(self, status: int, headers: dict[str, str], stream: BinaryIO) -> None:
        self.status = status
        self.headers = headers
        self.stream = stream


def _line(stream: BinaryIO, what: str) -> bytes:
    line = stream.readline(_MAX_LINE + 1)
    if len(line) > _MAX_LINE:
        raise NodeError(f"kubo answered with a {what} line over {_MAX_LINE} bytes")
    if not line.endswith(b"\n"):
        raise ConnectionAbortedError(f"the node closed the connection in a {what} line")
    return line.rstrip(b"\r\n")


def _headers(stream: BinaryIO, what: str) -> dict[str, str]:
    headers: dict[str, str] = {}
    while line := _line(stream, what):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return headers


class _Throttled:
    """Passes a growing count on to ``progress`` once it grew by ``PROGRESS_STEP``, and the
    last count at ``end``."""

    def __init__(self, progress: Callable[[int], None]) -> None:
        self.progress = progress
        self.told = 0

    def __call__(self, pos: int) -> None:
        if pos - self.told >= PROGRESS_STEP:
            self.told = pos
            self.progress(pos)

    def end(self, pos: int) -> None:
        if pos != self.told:
            self.told = pos
            self.progress(pos)


class BulkRead:
    """POST ``command`` to Kubo and read the answer's body into a caller's buffer.

    An error answer about ``cid`` may be ``BlockNotFoundError`` (``error_from_response``).
    """

    def __init__(
        self,
        api: str,
        command: str,
        params: rpc.Params,
        *,
        auth: str | None,
        cid: CID | None = None,
    ) -> None:
        parts = urlsplit(api)
        self.api = api
        self.command = command
        self.cid = cid
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        query = "&".join(f"{quote(k)}={quote(v, safe='')}" for k, v in params)
        lines = [
            f"POST {parts.path}{rpc.API_PREFIX}{command}?{query} HTTP/1.1",
            f"Host: {parts.netloc}",
            "Content-Length: 0",
            "Connection: close",
            "User-Agent: gradstore",
        ]
        if auth:
            lines.append(f"Authorization: {auth}")
        self.request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self._sock: socket.socket | None = None
        self._aborted = False

    def abort(self) -> None:
        """Stop a transfer from another thread: the blocked read returns at once and ``into`` raises."""
        self._aborted = True
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def into(
        self,
        out: memoryview,
        timeouts: Timeouts,
        *,
        overflow: Callable[[], Exception],
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Fill ``out`` from the body; return the bytes read.

        ``overflow()`` builds the exception for a body longer than ``out``.
        ``progress(n)`` is called (in this thread) as the filled prefix grows, once at
        least ``PROGRESS_STEP`` more bytes are in, and with the whole length at the end.
        """
        count(self.command)
        try:
            sock = socket.create_connection((self.host, self.port), timeout=timeouts.connect)
        except OSError as exc:
            raise rpc.error_from_socket(exc, self.command, self.api, connecting=True) from exc
        self._sock = sock
        if self._aborted:
            sock.close()
            raise NodeError(f"kubo {self.command}: transfer aborted")
        try:
            sock.settimeout(timeouts.read)
            sock.sendall(self.request)
            with sock.makefile("rb", buffering=256 * 1024) as stream:
                return self._read(cast(BinaryIO, stream), out, overflow, progress)
        except OSError as exc:
            raise rpc.error_from_socket(exc, self.command, self.api, connecting=False) from exc
        finally:
            self._sock = None
            sock.close()

    def _read(
        self,
        stream: BinaryIO,
        out: memoryview,
        overflow: Callable[[], Exception],
        progress: Callable[[int], None] | None,
    ) -> int:
        status_line = _line(stream, "status").decode("latin-1").split(" ", 2)
        if len(status_line) < 2 or not status_line[1].isdigit():
            raise NodeError(f"kubo {self.command}: not an HTTP answer: {status_line!r}")
        status = int(status_line[1])
        headers = _headers(stream, "header")
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        if status != 200:
            limit = min(int(length), _MAX_ERROR_BODY) if length and length.isdigit() else None
            body = bytearray(_MAX_ERROR_BODY)
            n = self._body(stream, memoryview(body), chunked, limit, lambda: None, None)
            raise rpc.error_from_response(self.command, status, bytes(body[:n]), cid=self.cid)
        total = int(length) if length and length.isdigit() and not chunked else None
        told = None if progress is None else _Throttled(progress)
        n = self._body(stream, out, chunked, total, overflow, told)
        if told is not None:
            told.end(n)
        if chunked:
            trailers = _headers(stream, "trailer")
            failure = trailers.get("x-stream-error")
            if failure:
                raise rpc.error_from_response(
                    self.command, 500, failure.encode("utf-8", "replace"), cid=self.cid
                )
        return n

    def _body(
        self,
        stream: BinaryIO,
        out: memoryview,
        chunked: bool,
        total: int | None,
        overflow: Callable[[], Exception | None],
        progress: Callable[[int], None] | None,
    ) -> int:
        """Copy the body into ``out`` (stops at ``len(out)`` if ``overflow()`` gives None)."""
        pos = 0
        cap = len(out)

        def fill(n: int | None) -> bool:
            """Read ``n`` bytes (None: to EOF) into out[pos:]; False at EOF."""
            nonlocal pos
            while n is None or n > 0:
                want = cap - pos if n is None else min(n, cap - pos)
                if want == 0:
                    exc = overflow()
                    if exc is not None:
                        raise exc
                    return False
                got = stream.readinto(out[pos : pos + want])  # type: ignore[attr-defined]
                if not got:
                    if n is None:
                        return False
                    raise ConnectionAbortedError(f"the node closed the connection {n} bytes early")
                pos += got
                if n is not None:
                    n -= got
                if progress is not None:
                    progress(pos)
            return True

        if not chunked:
            fill(total)
            return pos
        while True:
            size_text = _line(stream, "chunk size").split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise NodeError(f"kubo {self.command}: bad chunk size {size_text!r}") from None
            if size == 0:
                return pos
            if not fill(size):
                return pos
            if _line(stream, "chunk end"):
                raise NodeError(f"kubo {self.command}: malformed chunked body")
