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
import mmap
import socket
import threading
import time
from collections.abc import Callable
from typing import BinaryIO, Final, cast
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
#: A chunked body is staged this many bytes at a time at most (``_Staged``).
_STAGE_BYTES = 256 * 1024
#: The buffer of a socket's reader: at least ``_STAGE_BYTES``, or ``readinto1`` (which
#: ``_Staged`` reads with) reads the socket again after handing out what it had buffered,
#: and waits there for bytes a kept-alive connection's node will not send.
STREAM_BUFFER = _STAGE_BYTES
#: A read that brought less than this ...
PACE_BELOW = 64 * 1024
#: ... is followed by this pause before the next one (see ``_Staged.more``).
PACE_S = 0.0002


#: The largest block Kubo stores (what a thread's block buffer holds).
MAX_BLOCK_BYTES: Final = 4 << 20

_threads = threading.local()


def thread_buffer() -> memoryview:
    """This thread's buffer of ``MAX_BLOCK_BYTES`` (mapped once, lazily touched): a block's
    or a small answer's bytes land there before they are copied out. A mapping per block
    cost its unmapping, 0.4 ms on the event loop, for every input's root."""
    view: memoryview | None = getattr(_threads, "block", None)
    if view is None:
        view = _threads.block = memoryview(mmap.mmap(-1, MAX_BLOCK_BYTES))
    return view


def supported(api: str) -> bool:
    """Whether ``api`` (``KuboNode.api``) can use this path (plain http)."""
    return urlsplit(api).scheme == "http"


def request_head(
    api: str,
    command: str,
    params: rpc.Params,
    *,
    auth: str | None,
    length: int = 0,
    content_type: str | None = None,
    keep_alive: bool = False,
) -> bytes:
    """The HTTP/1.1 head of a POST of ``command`` to ``api`` with a body of ``length`` bytes
    (``Connection: close`` unless ``keep_alive``)."""
    parts = urlsplit(api)
    query = "&".join(f"{quote(k)}={quote(v, safe='')}" for k, v in params)
    lines = [
        f"POST {parts.path}{rpc.API_PREFIX}{command}?{query} HTTP/1.1",
        f"Host: {parts.netloc}",
        f"Content-Length: {length}",
        "User-Agent: gradstore",
    ]
    if content_type:
        lines.append(f"Content-Type: {content_type}")
    if not keep_alive:
        lines.append("Connection: close")
    if auth:
        lines.append(f"Authorization: {auth}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _line(stream: BinaryIO, what: str) -> bytes:
    line = stream.readline(_MAX_LINE + 1)
    if len(line) > _MAX_LINE:
        raise NodeError(f"kubo answered with a {what} line over {_MAX_LINE} bytes")
    if not line.endswith(b"\n"):
        raise ConnectionAbortedError(f"the node closed the connection in a {what} line")
    return line.rstrip(b"\r\n")


def _headers(line: Callable[[str], bytes], what: str) -> dict[str, str]:
    """Header (or trailer) lines up to an empty one, each read by ``line(what)``."""
    headers: dict[str, str] = {}
    while text := line(what):
        name, _, value = text.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return headers


class _Staged:
    """A chunked body read from ``stream`` in large pieces (``readinto1``: what the socket
    has) into a buffer of its own, where ``_dechunk`` parses Kubo's 4 KiB chunks: one
    Python loop turn per chunk, where a line read, a read and a line read each were."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.buf = bytearray(_STAGE_BYTES)
        self.view = memoryview(self.buf)
        self.at = 0  # the first byte not yet parsed
        self.end = 0  # the end of the bytes read
        self.short = False  # the last read brought less than PACE_BELOW
        self.reads = 0  # reads of the stream so far

    def more(self) -> bool:
        """Read what the stream has next (False at its end), making room first.

        After a short read (under ``PACE_BELOW``) it first pauses ``PACE_S``: Kubo writes
        and flushes 4 KiB at a time, and a reader that takes each piece as it lands wakes
        for every one (330 reads and 2.5 ms of CPU for a 1 MiB ``cat``, and more of
        Kubo's: 3.5 ms); pausing, it takes them 100 KiB or so at a time (10 reads, 0.7 ms,
        Kubo 2.1 ms, and sooner done). A body that comes faster is never paused for.
        """
        if self.short:
            time.sleep(PACE_S)
        if self.at == self.end:
            self.at = self.end = 0
        elif self.end == len(self.buf) or self.at > len(self.buf) // 2:
            n = self.end - self.at
            self.view[:n] = self.view[self.at : self.end]
            self.at, self.end = 0, n
        got = self.stream.readinto1(self.view[self.end :])  # type: ignore[attr-defined]
        self.reads += 1
        if not got:
            return False
        self.end += got
        self.short = got < PACE_BELOW
        return True

    def line(self, what: str) -> bytes:
        """The next line, without its end (``_line``'s bounds and errors)."""
        while True:
            nl = self.buf.find(b"\n", self.at, self.end)
            if nl >= 0 and nl - self.at <= _MAX_LINE:
                line = bytes(self.view[self.at : nl])
                self.at = nl + 1
                return line.rstrip(b"\r")
            if self.end - self.at > _MAX_LINE:
                raise NodeError(f"kubo answered with a {what} line over {_MAX_LINE} bytes")
            if not self.more():
                raise ConnectionAbortedError(f"the node closed the connection in a {what} line")

    def take(self, out: memoryview) -> int:
        """Fill ``out`` from what is staged, then from the stream: the bytes filled (fewer
        only where the stream ended)."""
        n = min(len(out), self.end - self.at)
        out[:n] = self.view[self.at : self.at + n]
        self.at += n
        while n < len(out):
            got = self.stream.readinto(out[n:])  # type: ignore[attr-defined]
            if not got:
                break
            n += got
        return n


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
        length: int = 0,
        content_type: str | None = None,
        keep_alive: bool = False,
    ) -> None:
        parts = urlsplit(api)
        self.api = api
        self.command = command
        self.cid = cid
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.request = request_head(
            api,
            command,
            params,
            auth=auth,
            length=length,
            content_type=content_type,
            keep_alive=keep_alive,
        )
        #: after ``read_answer``: whether the node keeps the connection open for another call
        self.reusable = False
        self._sock: socket.socket | None = None
        self._aborted = False
        self.reads = 0  # reads of a chunked body's stream (``_Staged``), for measuring

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
        body: list[memoryview] | None = None,
    ) -> int:
        """Fill ``out`` from the body; return the bytes read (``body``: the request's, as
        pieces sent scattered by ``send_all``, its length the head's).

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
            send_all(sock, [memoryview(self.request), *(body or ())])
            with sock.makefile("rb", buffering=STREAM_BUFFER) as stream:
                return self.read_answer(cast(BinaryIO, stream), out, overflow, progress)
        except OSError as exc:
            raise rpc.error_from_socket(exc, self.command, self.api, connecting=False) from exc
        finally:
            self._sock = None
            sock.close()

    def read_answer(
        self,
        stream: BinaryIO,
        out: memoryview,
        overflow: Callable[[], Exception],
        progress: Callable[[int], None] | None = None,
        *,
        partial: bool = False,
    ) -> int:
        """The answer on ``stream``: its body into ``out`` (the bytes read), or the node
        layer's error for an error answer; with ``partial``, a stream that failed after its
        status (Kubo's ``X-Stream-Error`` trailer) gives what it sent before, as httpx's
        answer does (``pin/ls`` lists the CIDs pinned up to the first that is not)."""
        status_line = _line(stream, "status").decode("latin-1").split(" ", 2)
        if len(status_line) < 2 or not status_line[1].isdigit():
            raise NodeError(f"kubo {self.command}: not an HTTP answer: {status_line!r}")
        status = int(status_line[1])
        headers = _headers(lambda what: _line(stream, what), "header")
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        framed = chunked or "content-length" in headers
        self.reusable = framed and headers.get("connection", "").lower() != "close"
        staged = _Staged(stream) if chunked else None
        length = headers.get("content-length")
        if status != 200:
            limit = min(int(length), _MAX_ERROR_BODY) if length and length.isdigit() else None
            body = bytearray(_MAX_ERROR_BODY)
            n = self._body(stream, staged, memoryview(body), limit, lambda: None, None)
            raise rpc.error_from_response(self.command, status, bytes(body[:n]), cid=self.cid)
        total = int(length) if length and length.isdigit() and not chunked else None
        told = None if progress is None else _Throttled(progress)
        n = self._body(stream, staged, out, total, overflow, told)
        if told is not None:
            told.end(n)
        if staged is not None:
            trailers = _headers(staged.line, "trailer")
            self.reads = staged.reads
            failure = trailers.get("x-stream-error")
            if failure and not partial:
                raise rpc.error_from_response(
                    self.command, 500, failure.encode("utf-8", "replace"), cid=self.cid
                )
        return n

    def _body(
        self,
        stream: BinaryIO,
        staged: _Staged | None,
        out: memoryview,
        total: int | None,
        overflow: Callable[[], Exception | None],
        progress: Callable[[int], None] | None,
    ) -> int:
        """Copy the body (chunked when ``staged``) into ``out`` (stops at ``len(out)`` if
        ``overflow()`` gives None)."""
        if staged is not None:
            return self._dechunk(staged, out, overflow, progress)
        pos = 0
        cap = len(out)
        n = total
        while n is None or n > 0:
            want = cap - pos if n is None else min(n, cap - pos)
            if want == 0:
                exc = overflow()
                if exc is not None:
                    raise exc
                return pos
            got = stream.readinto(out[pos : pos + want])  # type: ignore[attr-defined]
            if not got:
                if n is None:
                    return pos
                raise ConnectionAbortedError(f"the node closed the connection {n} bytes early")
            pos += got
            if n is not None:
                n -= got
            if progress is not None:
                progress(pos)
        return pos

    def _dechunk(
        self,
        staged: _Staged,
        out: memoryview,
        overflow: Callable[[], Exception | None],
        progress: Callable[[int], None] | None,
    ) -> int:
        """A chunked body's data into ``out``, up to its last chunk (the trailers are left
        in ``staged``). A chunk whose size line and data are staged whole takes one loop
        turn: a search for its line's end, a copy and a check of its end."""
        buf, view = staged.buf, staged.view
        pos, cap = 0, len(out)
        while True:
            at = staged.at
            nl = buf.find(b"\r\n", at, staged.end)
            try:
                if not 0 < nl - at <= 16:
                    raise ValueError  # not all staged, or not plain: the slow way
                size = int(buf[at:nl], 16)
                staged.at = nl + 2
            except ValueError:
                size_text = staged.line("chunk size").split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    size = -1
                if size < 0:
                    raise NodeError(f"kubo {self.command}: bad chunk size {size_text!r}") from None
            if size < 0:
                raise NodeError(f"kubo {self.command}: bad chunk size {size}")
            if size == 0:
                return pos
            start = staged.at
            if start + size + 2 <= staged.end and pos + size <= cap:  # all staged: one copy
                out[pos : pos + size] = view[start : start + size]
                if not buf.startswith(b"\r\n", start + size):
                    raise NodeError(f"kubo {self.command}: malformed chunked body")
                staged.at = start + size + 2
                pos += size
            else:
                take = min(size, cap - pos)
                got = staged.take(out[pos : pos + take])
                pos += got
                if got < take:
                    raise ConnectionAbortedError(
                        f"the node closed the connection {size - got} bytes early"
                    )
                if take < size:  # longer than ``out``
                    exc = overflow()
                    if exc is not None:
                        raise exc
                    return pos
                if staged.line("chunk end"):
                    raise NodeError(f"kubo {self.command}: malformed chunked body")
            if progress is not None:
                progress(pos)


def send_all(sock: socket.socket, pieces: list[memoryview]) -> None:
    """Send every piece, in order, a few system calls in all (``sendmsg`` takes up to 1024
    buffers at a time and may send part of them: the rest goes again)."""
    at = 0
    while at < len(pieces):
        batch = pieces[at : at + 1024]
        sent = sock.sendmsg(batch)
        for piece in batch:
            if sent < len(piece):
                pieces[at] = piece[sent:]
                break
            sent -= len(piece)
            at += 1
