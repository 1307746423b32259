"""CAR v1 streams (what Kubo's ``dag/import`` takes and ``dag/export`` sends).

    CAR     = varint(len(header)) header  section*
    header  = dag-cbor {"roots": [CID, ...], "version": 1}
    section = varint(len(cid) + len(data)) cid data

The writer passes block data through untouched (zero-copy); the reader is
incremental so it can sit on a network stream, and bounds every length it is
told before allocating for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence
from typing import Any

from ..errors import CIDError, DAGError
from . import cbor
from .block import Block
from .cid import CID
from .varint import MAX_VARINT_BYTES, encode_varint

MAX_CID_BYTES = (
    1 + 2 + 2 + 32
)  # version, codec (<= 2-byte varint), sha2-256 multihash header + digest
MAX_HEADER_BYTES = 1 << 20  # a header is a list of roots; 1 MiB holds ~27k of them


def encode_header(roots: Sequence[CID]) -> bytes:
    """The dag-cbor header ``{"roots": [...], "version": 1}``."""
    return cbor.encode({"roots": list(roots), "version": 1})


def write_car(roots: Sequence[CID], blocks: Iterable[Block]) -> Iterator[bytes | memoryview]:
    """Stream a CAR v1: the header, then one section per block; block data is yielded as-is."""
    yield car_header(roots)
    yield from car_sections(blocks)


async def write_car_async(
    roots: Sequence[CID], blocks: AsyncIterable[Block]
) -> AsyncIterator[bytes | memoryview]:
    """``write_car`` for blocks that arrive asynchronously (e.g. while they are hashed)."""
    yield car_header(roots)
    async for block in blocks:
        for piece in car_sections((block,)):
            yield piece


def car_header(roots: Sequence[CID]) -> bytes:
    """The length-prefixed CAR v1 header naming ``roots``."""
    header = encode_header(roots)
    return encode_varint(len(header)) + header


def car_sections(blocks: Iterable[Block]) -> Iterator[bytes | memoryview]:
    """One CAR section per block (length, CID, data); the data is passed through zero-copy."""
    for block in blocks:
        cid = block.cid.bytes
        yield encode_varint(len(cid) + len(block.data)) + cid
        if len(block.data):
            yield block.data


def decode_header(raw: bytes | bytearray | memoryview) -> list[CID]:
    """Parse a CAR v1 header; return its roots. DAGError unless it is {roots, version: 1}."""
    try:
        value: Any = cbor.decode(raw)
    except DAGError as exc:
        raise DAGError(f"CAR header is not valid dag-cbor ({exc})") from None
    if not isinstance(value, dict):
        raise DAGError("CAR header is not a map")
    version = value.get("version")
    if type(version) is not int or version != 1:
        raise DAGError(f"unsupported CAR version {version!r} (expected a CAR v1 stream)")
    if set(value) != {"roots", "version"}:
        raise DAGError(f"unexpected CAR header keys {sorted(set(value) - {'roots', 'version'})}")
    roots = value["roots"]
    if not isinstance(roots, list) or not all(isinstance(r, CID) for r in roots):
        raise DAGError("CAR header roots must be a list of CIDs")
    return roots


class CarReader:
    """Incremental CAR v1 parser: ``feed`` it bytes as they arrive, get whole blocks back.

    Blocks are not verified here (the consumer hashes them against their CID);
    a section or header longer than its bound is refused before any buffer is
    allocated for it.
    """

    def __init__(self, max_block_size: int = 2 << 20) -> None:
        self.max_block_size = max_block_size
        self.roots: list[CID] | None = None
        self._varint = 0
        self._varint_bytes = 0
        self._body: bytearray | None = None  # the header or section being filled
        self._fill = 0
        self._offset = 0  # bytes consumed so far, for error messages
        self._closed = False

    def feed(self, chunk: bytes | bytearray | memoryview) -> list[Block]:
        """Consume ``chunk``; return the blocks it completed. DAGError on malformed input."""
        if self._closed:
            raise DAGError("CarReader.feed after close")
        view = memoryview(chunk).cast("B")
        # Sections wholly inside an immutable chunk are sliced from it, not copied.
        immutable = isinstance(chunk, bytes) or (
            isinstance(chunk, memoryview) and chunk.readonly and isinstance(chunk.obj, bytes)
        )
        pos, end = 0, len(view)
        out: list[Block] = []
        while pos < end:
            if self._body is not None:
                take = min(len(self._body) - self._fill, end - pos)
                self._body[self._fill : self._fill + take] = view[pos : pos + take]
                self._fill += take
                pos += take
                self._offset += take
                if self._fill == len(self._body):
                    body, self._body = self._body, None
                    block = self._finish(memoryview(body))
                    if block is not None:
                        out.append(block)
                continue
            byte = view[pos]
            pos += 1
            self._offset += 1
            self._varint |= (byte & 0x7F) << (7 * self._varint_bytes)
            self._varint_bytes += 1
            if byte & 0x80:
                if self._varint_bytes >= MAX_VARINT_BYTES:
                    raise DAGError(f"CAR length varint too long at byte {self._offset}")
                continue
            if byte == 0 and self._varint_bytes > 1:
                raise DAGError(f"non-minimal CAR length varint at byte {self._offset}")
            length = self._varint
            self._varint = self._varint_bytes = 0
            self._check(length)
            if immutable and self.roots is not None and end - pos >= length:
                pos += length
                self._offset += length
                block = self._finish(view[pos - length : pos])
                assert block is not None
                out.append(block)
            else:
                self._body = bytearray(length)
                self._fill = 0
        return out

    def _check(self, length: int) -> None:
        if self.roots is None:
            if not 0 < length <= MAX_HEADER_BYTES:
                raise DAGError(f"CAR header length {length} out of range (1..{MAX_HEADER_BYTES})")
        elif length == 0:
            raise DAGError(f"empty CAR section at byte {self._offset}")
        elif length > self.max_block_size + MAX_CID_BYTES:
            raise DAGError(
                f"CAR section of {length} bytes at byte {self._offset} is over the "
                f"{self.max_block_size}-byte block limit"
            )

    def _finish(self, raw: memoryview) -> Block | None:
        if self.roots is None:
            self.roots = decode_header(raw)
            return None
        try:
            cid, start = CID.read(raw, 0)
        except CIDError as exc:
            raise DAGError(f"bad CID in CAR section ending at byte {self._offset}: {exc}") from exc
        data = raw[start:]
        if len(data) > self.max_block_size:
            raise DAGError(
                f"block {cid} of {len(data)} bytes is over the {self.max_block_size}-byte limit"
            )
        return Block(cid, data)

    def close(self) -> None:
        """End of stream: DAGError if it stopped mid-section or before a header."""
        self._closed = True
        if self.roots is None:
            raise DAGError("CAR stream ended before its header")
        if self._body is not None or self._varint_bytes:
            raise DAGError(f"CAR stream truncated mid-section at byte {self._offset}")
