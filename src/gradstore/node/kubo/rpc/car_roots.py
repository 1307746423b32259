"""A CAR stream's header roots, learnt from its first bytes as the stream goes by to Kubo."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ....dag.car import MAX_HEADER_BYTES, decode_header
from ....dag.chunker import as_bytes_view
from ....dag.cid import CID
from ....dag.varint import MAX_VARINT_BYTES, read_varint
from ....errors import DAGError

if TYPE_CHECKING:
    from typing_extensions import Buffer


class CarRoots:
    """Learns a CAR stream's header roots from its first bytes as the stream goes by.

    ``KuboNode.import_car`` imports with ``pin-roots=false`` (Kubo 0.42 pins
    imported roots *online* and hangs on an incomplete DAG) and then pins the
    roots itself with ``offline=true``; this is how it knows them. Only the
    header's bytes are copied.
    """

    def __init__(self) -> None:
        self.roots: list[CID] | None = None
        self._head = bytearray()

    def see(self, piece: Buffer) -> None:
        if self.roots is not None:
            return
        view = as_bytes_view(piece)
        self._head += view[: MAX_HEADER_BYTES + MAX_VARINT_BYTES - len(self._head)]
        try:
            length, start = read_varint(self._head, 0, "CAR header length")
        except DAGError:
            if len(self._head) < MAX_VARINT_BYTES:
                return  # the varint is still arriving
            raise
        if not 0 < length <= MAX_HEADER_BYTES:
            raise DAGError(f"CAR header length {length} out of range (1..{MAX_HEADER_BYTES})")
        if len(self._head) >= start + length:
            self.roots = decode_header(self._head[start : start + length])
            self._head = bytearray()
