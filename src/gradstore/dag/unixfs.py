"""UnixFS ``Data`` messages (the payload of a dag-pb node): encode file nodes, decode strictly.

    message Data {
      required DataType Type = 1;  optional bytes Data = 2;  optional uint64 filesize = 3;
      repeated uint64 blocksizes = 4;  optional uint64 hashType = 5;  optional uint64 fanout = 6;
      optional uint32 mode = 7;  optional UnixTime mtime = 8;
    }

The profile's internal file node writes only Type=File, filesize and one
unpacked ``blocksizes`` entry per child: no Data, no mode, no mtime.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum
from typing import NamedTuple

from ..errors import DAGError
from .varint import encode_varint, read_varint


class DataType(IntEnum):
    """UnixFS node types."""

    RAW = 0
    DIRECTORY = 1
    FILE = 2
    METADATA = 3
    SYMLINK = 4
    HAMT_SHARD = 5


class UnixFSData(NamedTuple):
    """A decoded UnixFS ``Data`` message (``mtime`` kept as its raw message bytes)."""

    type: int
    data: bytes | None = None
    filesize: int | None = None
    blocksizes: tuple[int, ...] = ()
    hashtype: int | None = None
    fanout: int | None = None
    mode: int | None = None
    mtime: bytes | None = None


def encode_unixfs_file(filesize: int, blocksizes: Iterable[int]) -> bytes:
    """A file node as Kubo writes it: ``08 02``, ``18 filesize``, then ``20 size`` per child."""
    parts = [b"\x08\x02\x18", encode_varint(filesize)]
    for size in blocksizes:
        parts += [b"\x20", encode_varint(size)]
    return b"".join(parts)


_VARINT_FIELDS = {1: "type", 3: "filesize", 5: "hashtype", 6: "fanout", 7: "mode"}


def decode_unixfs(payload: bytes | bytearray | memoryview) -> UnixFSData:
    """Parse a UnixFS ``Data`` message; DAGError on unknown fields, duplicates or bad wire types."""
    buf = memoryview(payload).cast("B")
    pos = 0
    scalars: dict[str, int] = {}
    data: bytes | None = None
    mtime: bytes | None = None
    blocksizes: list[int] = []
    while pos < len(buf):
        tag, pos = read_varint(buf, pos, "UnixFS tag")
        field, wire = tag >> 3, tag & 7
        if field in _VARINT_FIELDS and wire == 0:
            name = _VARINT_FIELDS[field]
            if name in scalars:
                raise DAGError(f"UnixFS field {name} appears twice")
            scalars[name], pos = read_varint(buf, pos, f"UnixFS {name}")
        elif field == 4 and wire == 0:
            size, pos = read_varint(buf, pos, "UnixFS blocksize")
            blocksizes.append(size)
        elif field in (2, 4, 8) and wire == 2:
            n, pos = read_varint(buf, pos, "UnixFS field length")
            end = pos + n
            if end > len(buf):
                raise DAGError(f"UnixFS field {field} overruns the message at byte {pos}")
            if field == 4:  # packed blocksizes: legal protobuf, accepted on input
                while pos < end:
                    size, pos = read_varint(buf[:end], pos, "UnixFS blocksize")
                    blocksizes.append(size)
            elif (data if field == 2 else mtime) is not None:
                raise DAGError(f"UnixFS field {field} appears twice")
            elif field == 2:
                data = bytes(buf[pos:end])
            else:
                mtime = bytes(buf[pos:end])
            pos = end
        else:
            raise DAGError(f"UnixFS: unexpected field {field} with wire type {wire}")
    if "type" not in scalars:
        raise DAGError("UnixFS Data without a Type")
    return UnixFSData(
        type=scalars["type"],
        data=data,
        filesize=scalars.get("filesize"),
        blocksizes=tuple(blocksizes),
        hashtype=scalars.get("hashtype"),
        fanout=scalars.get("fanout"),
        mode=scalars.get("mode"),
        mtime=mtime,
    )
