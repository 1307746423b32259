"""Golden CIDs: Kubo's own test vectors for the unixfs-v1-2025 profile, and a pinned node.

Vectors from ipfs/kubo ``test/cli/cid_profiles_test.go`` (``ipfs add`` with
``--profile=unixfs-v1-2025``); data is Kubo's ``DeterministicRandomReader``:
a ChaCha20 keystream with key = sha256(seed) and a zero nonce.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from gradstore.dag import (
    CHUNK_SIZE,
    DAG_PB,
    MAX_LINKS,
    RAW,
    build_file,
    decode_pbnode,
    decode_unixfs,
    file_cid,
)

MiB = 1 << 20


def kubo_random(size: int, seed: str, step: int = 16 * MiB) -> Iterator[bytearray]:
    """Kubo's testutils.DeterministicRandomReader(size, seed), in pieces of ``step`` bytes."""
    key = hashlib.sha256(seed.encode()).digest()
    # cryptography's 16-byte ChaCha20 nonce = 4-byte counter (0) + Go's 12-byte zero nonce.
    enc = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    left = size
    while left:
        n = min(step, left)
        out = bytearray(n)
        enc.update_into(bytes(n), out)
        yield out
        left -= n


def test_kubo_random_matches_chacha20_keystream() -> None:
    # RFC 7539 appendix A.1 vector #1 (zero key, zero nonce): the keystream starts 76 b8 e0 ad.
    enc = Cipher(algorithms.ChaCha20(bytes(32), bytes(16)), mode=None).encryptor()
    assert enc.update(bytes(4)).hex() == "76b8e0ad"
    # Pieces of any size give the same stream.
    whole = b"".join(kubo_random(1000, "s"))
    assert b"".join(kubo_random(1000, "s", step=7)) == whole


def test_hello_world_is_one_raw_block() -> None:
    # SmallFileCID: "hello world" raw leaf.
    cid = file_cid([b"hello world"])
    assert str(cid) == "bafkreifzjut3te2nhyekklss27nh3k72ysco7y32koao5eei66wof36n5e"


def test_empty_file_is_the_empty_raw_block() -> None:
    blocks = list(build_file([]))
    assert len(blocks) == 1
    assert str(blocks[0].cid) == "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"
    assert bytes(blocks[0].data) == b""
    assert file_cid([b"", b""]) == blocks[0].cid


def test_file_at_chunk_size_is_a_raw_leaf() -> None:
    # FileAtChunkSizeCID: 1048576 bytes, seed "chunk-v1-seed".
    blocks = list(build_file(kubo_random(CHUNK_SIZE, "chunk-v1-seed")))
    assert len(blocks) == 1
    assert blocks[0].cid.codec == RAW
    assert str(blocks[0].cid) == "bafkreiacndfy443ter6qr2tmbbdhadvxxheowwf75s6zehscklu6ezxmta"


def test_file_one_byte_over_chunk_size() -> None:
    # FileOverChunkSizeCID: 1048577 bytes, seed "chunk-v1-seed": a dag-pb root with 2 raw leaves.
    blocks = list(build_file(kubo_random(CHUNK_SIZE + 1, "chunk-v1-seed")))
    root = blocks[-1]
    assert str(root.cid) == "bafybeigmix7t42i6jacydtquhet7srwvgpizfg7gjbq7627d35mjomtu64"
    node = decode_pbnode(root.data)
    assert [link.hash.codec for link in node.links] == [RAW, RAW]
    assert [link.tsize for link in node.links] == [CHUNK_SIZE, 1]
    assert node.data is not None
    fs = decode_unixfs(node.data)
    assert (fs.filesize, fs.blocksizes) == (CHUNK_SIZE + 1, (CHUNK_SIZE, 1))
    assert file_cid(kubo_random(CHUNK_SIZE + 1, "chunk-v1-seed", step=12345)) == root.cid


def test_pinned_internal_node_bytes() -> None:
    """Stability: any change to dag-pb / UnixFS encoding changes this node and every CID."""
    blocks = list(build_file([np.zeros(CHUNK_SIZE + 1, dtype=np.uint8)]))
    root = blocks[-1]
    assert bytes(root.data).hex() == (
        "122c0a240155122030e14955ebf1352266dc2ff8067e68104607e750abb9d3b36582b8af909fcb58"
        "1200188080401"  # link 1: Hash (raw, sha256 of 1 MiB zeros), Name "", Tsize 1048576
        "22a0a24015512206e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"
        "12001801"  # link 2: Hash (raw, sha256 of b"\0"), Name "", Tsize 1
        "0a0c080218818040208080402001"  # Data: Type=File, filesize, blocksizes 1048576, 1
    )
    assert root.cid.codec == DAG_PB
    assert str(root.cid) == "bafybeihd4yzq7n5umhjngdum4r6k2to7egxfkf2jz6thvwzf6djus22cmq"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("size", "expected", "root_links"),
    [
        # FileAtMaxLinksCID: 1024 x 1 MiB, one layer with exactly 1024 links.
        (MAX_LINKS * MiB, "bafybeihmf37wcuvtx4hpu7he5zl5qaf2ineo2lqlfrapokkm5zzw7zyhvm", 1024),
        # FileOverMaxLinksCID: 1024 x 1 MiB + 1, a full node plus a node holding one 1-byte leaf.
        (MAX_LINKS * MiB + 1, "bafybeibdsi225ugbkmpbdohnxioyab6jsqrmkts3twhpvfnzp77xtzpyhe", 2),
        # Older Kubo vector (1025 MiB): same layout, second node holds one full leaf.
        ((MAX_LINKS + 1) * MiB, "bafybeihmzokxxjqwxjcryerhp5ezpcog2wcawfryb2xm64xiakgm4a5jue", 2),
    ],
)
def test_max_links_boundary(size: int, expected: str, root_links: int) -> None:
    root = None
    for block in build_file(kubo_random(size, "v1-2025-seed"), threads=2):
        root = block
    assert root is not None
    assert str(root.cid) == expected
    assert len(decode_pbnode(root.data).links) == root_links
