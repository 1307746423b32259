"""UnixFS file DAGs under the unixfs-v1-2025 profile: chunk, build, verify, reassemble; CAR v1 I/O.

Pure and offline: ``file_cid(pieces)`` equals ``ipfs add --only-hash`` on a
Kubo node initialised with ``--profile=unixfs-v1-2025``.

Names are loaded on first use (``_lazy_exports``): only ``FileAssembler`` needs NumPy, so
``gradstore cid`` hashes a file without loading it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy_exports import lazy_exports

if TYPE_CHECKING:
    from .assemble import MAX_DEPTH, FileAssembler
    from .block import Block, block_links
    from .builder import EMPTY_FILE, build_file, file_cid, layout
    from .car import CarReader, car_header, car_sections, decode_header, encode_header, write_car
    from .chunker import chunks
    from .cid import CID, DAG_CBOR, DAG_PB, RAW, verify_block
    from .dagpb import PBLink, PBNode, decode_pbnode, encode_pbnode
    from .profile import CHUNK_SIZE, MAX_LINKS, UNIXFS_V1_2025, Profile
    from .unixfs import DataType, UnixFSData, decode_unixfs, encode_unixfs_file

_HOMES = {
    "MAX_DEPTH": "assemble",
    "FileAssembler": "assemble",
    "Block": "block",
    "block_links": "block",
    "EMPTY_FILE": "builder",
    "build_file": "builder",
    "file_cid": "builder",
    "layout": "builder",
    "CarReader": "car",
    "car_header": "car",
    "car_sections": "car",
    "decode_header": "car",
    "encode_header": "car",
    "write_car": "car",
    "chunks": "chunker",
    "CID": "cid",
    "DAG_CBOR": "cid",
    "DAG_PB": "cid",
    "RAW": "cid",
    "verify_block": "cid",
    "PBLink": "dagpb",
    "PBNode": "dagpb",
    "decode_pbnode": "dagpb",
    "encode_pbnode": "dagpb",
    "CHUNK_SIZE": "profile",
    "MAX_LINKS": "profile",
    "UNIXFS_V1_2025": "profile",
    "Profile": "profile",
    "DataType": "unixfs",
    "UnixFSData": "unixfs",
    "decode_unixfs": "unixfs",
    "encode_unixfs_file": "unixfs",
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

__all__ = [
    "CHUNK_SIZE",
    "CID",
    "DAG_CBOR",
    "DAG_PB",
    "EMPTY_FILE",
    "MAX_DEPTH",
    "MAX_LINKS",
    "RAW",
    "UNIXFS_V1_2025",
    "Block",
    "CarReader",
    "DataType",
    "FileAssembler",
    "PBLink",
    "PBNode",
    "Profile",
    "UnixFSData",
    "block_links",
    "build_file",
    "car_header",
    "car_sections",
    "chunks",
    "decode_header",
    "decode_pbnode",
    "decode_unixfs",
    "encode_header",
    "encode_pbnode",
    "encode_unixfs_file",
    "file_cid",
    "layout",
    "verify_block",
    "write_car",
]
