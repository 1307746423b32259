"""The ``unixfs-v1-2025`` import profile (IPIP-499), the only one gradstore writes.

Kubo's ``ipfs init --profile=unixfs-v1-2025`` sets the same values: CIDv1,
sha2-256, raw leaves, ``size-1048576`` chunker, balanced layout, 1024 links
per node. Changing any of them changes every CID, so they live here, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Profile:
    """How a byte stream becomes a UnixFS file DAG."""

    name: str
    chunk_size: int
    max_links: int
    cid_version: int = 1
    raw_leaves: bool = True
    layout: str = "balanced"


UNIXFS_V1_2025: Final = Profile(
    name="unixfs-v1-2025",
    # Kubo Import.UnixFSChunker = "size-1048576": a raw leaf is one 1 MiB block,
    # half of bitswap's 2 MiB block limit, so every block travels as-is.
    chunk_size=1 << 20,
    # Kubo Import.UnixFSFileMaxLinks = 1024. A link costs at most 49 bytes
    # (2 framing + 38 hash + 2 empty name + 7 tsize) plus a <= 6-byte blocksizes
    # entry, so a full node is ~56 KiB: far below the 1 MiB block limit.
    max_links=1024,
)

CHUNK_SIZE: Final = UNIXFS_V1_2025.chunk_size  # 1 << 20
MAX_LINKS: Final = UNIXFS_V1_2025.max_links  # 1024
