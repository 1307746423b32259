"""Builders for hand-made documents, so refusal tests can write exactly the bytes they need.

They use the ``msgpack`` package (not gradstore's encoder), so a shared mistake
cannot hide in both the builder and the code under test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import pytest


@dataclass(frozen=True)
class Raw:
    """Bytes written verbatim in place of a packed value or key."""

    data: bytes
    head: int = 0  # for a Raw ``data`` value: how many of its bytes are the bin header


AUTO: Any = object()  # a pad of the right (smallest aligning) length


def _pack(v: Any) -> bytes:
    """msgpack's encoding of ``v``, with any Raw inside (keys too) written verbatim."""
    if isinstance(v, Raw):
        return v.data
    if isinstance(v, dict):
        out = msgpack.Packer().pack_map_header(len(v))
        return out + b"".join(_pack(k) + _pack(x) for k, x in v.items())
    if isinstance(v, list):
        return msgpack.Packer().pack_array_header(len(v)) + b"".join(_pack(x) for x in v)
    return msgpack.packb(v, use_bin_type=True)


def _data_header_len(data: Any) -> int:
    if isinstance(data, Raw):
        return data.head
    if isinstance(data, bytes):
        return 2 if len(data) < 256 else 3 if len(data) < 65536 else 5
    return 0  # not a bin: the document is refused before alignment matters


class Docs:
    Raw = Raw
    AUTO = AUTO

    @staticmethod
    def tensor(
        name: Any = "w", dtype: Any = "<f4", shape: Any = (2,), data: Any = None, pad: Any = AUTO
    ) -> list[tuple[Any, Any]]:
        """Entries of one tensor map in canonical order; data defaults to the right zeros."""
        if data is None:
            data = bytes(int(np.prod(shape)) * np.dtype(dtype).itemsize)
        shape = list(shape) if isinstance(shape, tuple) else shape
        return [("name", name), ("dtype", dtype), ("shape", shape), ("pad", pad), ("data", data)]

    @staticmethod
    def build(
        tensors: Any = None, meta: Any = None, top: list[tuple[Any, Any]] | None = None
    ) -> bytes:
        """A document from ordered entries; tensors are lists of (key, value) pairs."""
        if top is None:
            top = [
                ("format", "gradstore/1"),
                ("meta", {} if meta is None else meta),
                ("tensors", [Docs.tensor()] if tensors is None else tensors),
            ]
        out = bytearray(msgpack.Packer().pack_map_header(len(top)))
        for key, value in top:
            out += _pack(key)
            if key == "tensors" and isinstance(value, list):
                out += msgpack.Packer().pack_array_header(len(value))
                for t in value:
                    if not isinstance(t, list):
                        out += _pack(t)
                        continue
                    out += msgpack.Packer().pack_map_header(len(t))
                    data = dict((k, v) for k, v in t if isinstance(k, str)).get("data", b"")
                    for tk, tv in t:
                        out += _pack(tk)
                        if tv is AUTO:
                            after = 2 + len(_pack("data")) + _data_header_len(data)
                            tv = bytes(-(len(out) + after) % 64)
                        out += _pack(tv)
            else:
                out += _pack(value)
        return bytes(out)


@pytest.fixture
def docs() -> type[Docs]:
    return Docs
