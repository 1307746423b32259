"""multipart/form-data request bodies around streamed file content, never joined."""

from __future__ import annotations

import os
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import TYPE_CHECKING

from ....dag.chunker import as_bytes_view
from ..settings import UPLOAD_CHUNK

if TYPE_CHECKING:
    from typing_extensions import Buffer


def new_boundary() -> str:
    return "gradstore-" + os.urandom(12).hex()


def multipart_content_type(boundary: str) -> str:
    return f"multipart/form-data; boundary={boundary}"


def multipart_head(boundary: str, *, filename: str = "file") -> bytes:
    """The framing before a file part's content (one file field named ``file``)."""
    return (
        f"--{boundary}\r\n"
        f'Content-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode("ascii")


def multipart_tail(boundary: str) -> bytes:
    return f"\r\n--{boundary}--\r\n".encode("ascii")


def multipart_length(pieces: Iterable[Buffer], boundary: str, *, filename: str = "file") -> int:
    """The size in bytes of ``multipart_stream(pieces, boundary, filename=filename)``."""
    content = sum(as_bytes_view(piece).nbytes for piece in pieces)
    head = multipart_head(boundary, filename=filename)
    return len(head) + content + len(multipart_tail(boundary))


def multipart_parts(
    pieces: Iterable[Buffer], boundary: str, *, filename: str = "file"
) -> list[memoryview]:
    """A body given whole: head, the pieces (views, not copies), tail, for a scattered send."""
    head, tail = multipart_head(boundary, filename=filename), multipart_tail(boundary)
    return [memoryview(head), *(as_bytes_view(p) for p in pieces), memoryview(tail)]


def slices(piece: Buffer, size: int = UPLOAD_CHUNK) -> Iterable[memoryview]:
    """Zero-copy slices of at most ``size`` bytes (keeps every copy in the HTTP stack small)."""
    view = as_bytes_view(piece)
    for start in range(0, len(view), size):
        yield view[start : start + size]


async def multipart_stream(
    pieces: AsyncIterable[Buffer] | Iterable[Buffer], boundary: str, *, filename: str = "file"
) -> AsyncIterator[bytes | memoryview]:
    """The multipart/form-data body around streamed file content: head, slices of pieces, tail.

    The content is never joined: each piece is sent as memoryview slices.
    """
    yield multipart_head(boundary, filename=filename)
    if isinstance(pieces, AsyncIterable):
        async for piece in pieces:
            for part in slices(piece):
                yield part
    else:
        for piece in pieces:
            for part in slices(piece):
                yield part
    yield multipart_tail(boundary)
