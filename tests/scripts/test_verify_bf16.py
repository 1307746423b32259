"""scripts/verify_round.py re-derives a bfloat16 round bit for bit, on a real Kubo.

The round's record names the output an independent computation gives: float64
accumulation in record order, then one rounding to bfloat16 done here with exact
fractions (ties to even). The audit must reach the same CID, and must reject a record
whose output was rounded through float32 (ml_dtypes' cast before 0.7), which differs only in the
elements where double rounding bites.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import ml_dtypes
import numpy as np

from gradstore.dag import CID, DAG_CBOR, file_cid
from gradstore.format import Gradient, encode
from gradstore.messages import (
    RecordInput,
    RoundRecord,
    SigningKey,
    aggregate_meta,
    encode_record,
)
from gradstore.node import KuboDaemon
from gradstore.store import GradientStore

ROOT = Path(__file__).resolve().parents[2]
BF16 = np.dtype(ml_dtypes.bfloat16)
SEED = 23
BIG = 1 << 30  # sample counts BIG and BIG + 1 put fedavg just above a bfloat16 midpoint


def _round_bf16(x: float) -> float:
    """``x`` to the nearest bfloat16 value (ties to even), by exact arithmetic."""
    if x == 0 or not math.isfinite(x):
        return x
    exponent = max(math.frexp(x)[1] - 1, -126)  # subnormals share the smallest quantum
    quantum = Fraction(2) ** (exponent - 7)
    return math.copysign(float(round(Fraction(x) / quantum) * quantum), x)  # round(): ties even


def _inputs() -> list[Gradient]:
    rng = np.random.default_rng(SEED)
    a = rng.standard_normal(4000).astype(BF16)
    b = rng.standard_normal(4000).astype(BF16)
    # the first 100 elements: 1 + k ulp and 1 + (k + 1) ulp, so every mean lies 2^-35 past
    # a midpoint: one rounding goes up, two (through float32) go to the even neighbour
    ks = np.arange(100)
    a[:100] = (1.0 + ks * 2.0**-7).astype(BF16)
    b[:100] = (1.0 + (ks + 1) * 2.0**-7).astype(BF16)
    return [Gradient({"w": a.reshape(40, 100)}), Gradient({"w": b.reshape(40, 100)})]


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "verify_round.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_verify_round_recomputes_a_bf16_fedavg_bit_for_bit(kubo: KuboDaemon) -> None:
    coordinator = SigningKey.generate()
    peers = sorted(SigningKey.generate().did for _ in range(2))  # record order: by peer id
    counts = [BIG, BIG + 1]
    inputs = _inputs()

    # float64 accumulation in record order, divided once, then one rounding to bfloat16
    xs = [g.tensors["w"].astype(np.float64).reshape(-1).tolist() for g in inputs]
    exact = [
        (counts[0] * x0 + counts[1] * x1) / (counts[0] + counts[1])
        for x0, x1 in zip(*xs, strict=True)
    ]
    honest = np.array([_round_bf16(v) for v in exact]).astype(BF16).reshape(40, 100)
    twice = np.array(exact).astype(np.float32).astype(BF16).reshape(40, 100)  # rounded twice
    differ = int((honest.view(np.uint16) != twice.view(np.uint16)).sum())
    assert differ >= 100, "the inputs must exercise double rounding"

    RUN = "bf16audit0run0000000000000"

    async def go() -> tuple[CID, CID]:
        async with kubo.node() as node:
            store = GradientStore(node)
            cids = [await store.put(g) for g in inputs]
            meta = aggregate_meta("bf16-audit", 0, "fedavg", cids, run=RUN)
            records = []
            for output in (honest, twice):
                out_cid = await store.put(Gradient({"w": output}, meta))
                assert out_cid == file_cid(encode(Gradient({"w": output}, meta)))
                record = RoundRecord(
                    job="bf16-audit",
                    run=RUN,
                    round=0,
                    method="fedavg",
                    params={},
                    inputs=tuple(
                        RecordInput(p, c, n, n / sum(counts))
                        for p, c, n in zip(peers, cids, counts, strict=True)
                    ),
                    excluded=(),
                    output=out_cid,
                    prev=None,
                    coordinator=coordinator.did,
                )
                rcid, data = encode_record(record, coordinator)
                assert await node.put_block(data, DAG_CBOR) == rcid
                records.append(rcid)
            return records[0], records[1]

    good, double_rounded = asyncio.run(go())
    done = _script(str(good), "--api", kubo.api_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok round 0 of job bf16-audit") and "2 inputs" in done.stdout
    done = _script(str(double_rounded), "--api", kubo.api_url)
    assert done.returncode == 1
    assert "check output-cid failed" in done.stderr
