"""The public face of gradstore.dag: the names other layers code against."""

from __future__ import annotations

import gradstore.dag as dag


def test_all_is_sorted_and_complete() -> None:
    assert dag.__all__ == sorted(dag.__all__, key=lambda n: (not n.isupper(), n))
    for name in dag.__all__:
        assert hasattr(dag, name), name
    contract = {
        "CID", "Block", "CHUNK_SIZE", "MAX_LINKS", "chunks", "build_file", "file_cid",
        "PBLink", "PBNode", "encode_pbnode", "decode_pbnode", "UnixFSData", "decode_unixfs",
        "encode_unixfs_file", "write_car", "CarReader", "FileAssembler", "block_links",
    }  # fmt: skip
    assert contract <= set(dag.__all__)


def test_profile_constants() -> None:
    assert dag.CHUNK_SIZE == 1 << 20 == dag.UNIXFS_V1_2025.chunk_size
    assert dag.MAX_LINKS == 1024 == dag.UNIXFS_V1_2025.max_links
    assert dag.UNIXFS_V1_2025.name == "unixfs-v1-2025"
    assert (dag.UNIXFS_V1_2025.cid_version, dag.UNIXFS_V1_2025.raw_leaves) == (1, True)
