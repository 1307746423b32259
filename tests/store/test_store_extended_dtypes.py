"""bfloat16 and float8 gradients through real Kubo daemons: the CID is `ipfs add`'s, bits survive."""

from __future__ import annotations

import asyncio
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from gradstore.format import Gradient, encode
from gradstore.node import KuboDaemon
from gradstore.store import GradientStore

pytestmark = pytest.mark.kubo
SEED = 17


def _gradient() -> Gradient:
    rng = np.random.default_rng(SEED)
    every_bf16 = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16)
    return Gradient(
        {
            "w": rng.standard_normal((700, 1000)).astype(ml_dtypes.bfloat16),  # 1.4 MB: 2 leaves
            "all": every_bf16,  # NaN payloads, infinities and -0 too
            "e4": np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn),
            "e5": np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e5m2),
        },
        {"peer": "p", "round": 3},
    )


def test_put_on_a_get_on_b_is_bit_identical_and_the_cid_is_ipfs_adds(
    kubo_factory,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    a, b = kubo_factory(2, connect=True)
    g = _gradient()
    doc = tmp_path / "doc"
    with open(doc, "wb") as f:
        encode(g).write_to(f)

    async def go() -> str:
        async with a.node() as na, b.node() as nb:
            cid = await GradientStore(na).put(g)
            got = await GradientStore(nb).get(cid)
            assert got == g  # names, dtypes, shapes and every byte
            for name, array in g.tensors.items():
                assert got.tensors[name].dtype == array.dtype
                assert got.tensors[name].tobytes() == array.tobytes()
            return str(cid)

    cid = asyncio.run(go())
    daemon: KuboDaemon = a
    assert cid == daemon.run("add", "--only-hash", "-Q", str(doc)).stdout.decode().strip()
    assert daemon.run("cat", cid).stdout == doc.read_bytes()
