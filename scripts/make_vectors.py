#!/usr/bin/env python3
"""Write gradstore's conformance vectors: tests/vectors/<name>.car and vectors.json.

Each vector is one round built by the coordinator's own code (tests/audit/rounds.py) on a
LocalNode, exported as a CAR v1 whose root is the signed round record and whose blocks are
the record, every input document and the aggregate (and, for a chain, the rounds before).
A stepped round (tests/audit/stepped.py) holds its round/5 record, every step record with
its inputs and aggregate, and the model-level document.
Everything is fixed (seeds, keys, sent_at), so running this again gives the same bytes:

    python -m scripts.make_vectors            # rewrite tests/vectors/
    python -m scripts.make_vectors --check    # exit 1 unless tests/vectors/ is what it writes

Run it from the repository root as a module: the round builders are imported from
``tests.audit``, which the root (first on the path under ``-m``) holds.

tests/vectors/README.md says what the files are and how an auditor uses them.
"""

from __future__ import annotations

import argparse
import asyncio
import filecmp
import json
import sys
import tempfile
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final

import numpy as np

from gradstore.audit import fetch_any_record, fetch_step_record
from gradstore.dag import CID, block_links, write_car
from gradstore.dag.block import Block
from gradstore.format import Gradient, numpy_dtype
from gradstore.messages import RoundRecord, SteppedRoundRecord, StepRecord
from gradstore.node import LocalNode

try:  # the round builders live with the tests
    from tests.audit.rounds import (
        COORDINATOR,
        JOB,
        RUN,
        Round,
        key,
        legacy_round,
        signed_round,
    )
    from tests.audit.stepped import Model, Stepped, stepped_round
    from tests.audit.vector_features import describe, step_outputs
except ModuleNotFoundError as error:  # run as a file: the repository root is not on the path
    if error.name != "tests":
        raise
    raise SystemExit(
        "make_vectors: run it from the repository root: python -m scripts.make_vectors"
    ) from None

ROOT: Final = Path(__file__).resolve().parents[1]
VECTORS_DIR: Final = ROOT / "tests" / "vectors"
FORMAT: Final = "gradstore/conformance-vectors/1"

#: The small layout most vectors use: two tensors, 30 elements (int8 blocks and top-k chunks
#: of 8 and 16 elements end part-way through it).
SMALL: Final = {"layer.weight": (4, 6), "layer.bias": (6,)}

Build = Callable[[LocalNode], Awaitable[Round | Stepped]]


@dataclass(frozen=True)
class Vector:
    name: str
    about: str
    build: Build


def rng(name: str) -> np.random.Generator:
    """A generator seeded by the vector's name: each vector's values are its own."""
    return np.random.default_rng(zlib.crc32(name.encode()))


def dtype(name: str) -> np.dtype[Any]:
    found = numpy_dtype({"float16": "<f2", "float32": "<f4", "float64": "<f8"}.get(name, name))
    assert found is not None, name
    return found


def normal(
    name: str,
    n: int,
    dt: str = "float32",
    shapes: dict[str, tuple[int, ...]] = SMALL,
    scales: Sequence[float] | None = None,
) -> list[Gradient]:
    """``n`` gradients of standard normal values (times ``scales[i]``) in dtype ``dt``."""
    gen = rng(name)
    out = []
    for i in range(n):
        scale = 1.0 if scales is None else scales[i]
        out.append(
            Gradient(
                {t: (gen.standard_normal(s) * scale).astype(dtype(dt)) for t, s in shapes.items()}
            )
        )
    return out


def points(rows: Sequence[Sequence[float]], dt: str = "float32") -> list[Gradient]:
    """One single-tensor gradient per row: exact, hand-placed inputs (Krum ties, zeros)."""
    return [Gradient({"w": np.array(r, dtype=np.float64).astype(dtype(dt))}) for r in rows]


def peers(n: int) -> list[str]:
    return [key(i).did for i in range(n)]


def signed(
    grads: Callable[[], list[Gradient]], samples: Sequence[int], method: str, **kw: Any
) -> Build:
    async def build(node: LocalNode) -> Round:
        return await signed_round(node, grads(), samples, method, **kw)

    return build


def legacy(
    grads: Callable[[], list[Gradient]], samples: Sequence[int], method: str, **kw: Any
) -> Build:
    async def build(node: LocalNode) -> Round:
        return await legacy_round(node, grads(), samples, method, **kw)

    return build


def _zero_patterns(n: int) -> list[Gradient]:
    """Every sign pattern of +0.0/-0.0 over ``n`` inputs, one coordinate each, in three dtypes."""
    rows = [[-0.0 if (c >> i) & 1 else 0.0 for c in range(1 << n)] for i in range(n)]
    return [
        Gradient({t: np.array(r, np.float64).astype(dtype(t)) for t in ZERO_DTYPES}) for r in rows
    ]


ZERO_DTYPES: Final = ("float32", "bfloat16", "float8_e4m3fn")


def _all_negative_zero(n: int) -> list[Gradient]:
    return [
        Gradient({t: np.full((3, 4), -0.0, np.float64).astype(dtype(t)) for t in ZERO_DTYPES})
        for _ in range(n)
    ]


def _mixed_dtypes(name: str, n: int) -> list[Gradient]:
    """Every float dtype the format holds, one tensor each, in one document per input."""
    gen = rng(name)
    names = ("float16", "float32", "float64", "bfloat16", "float8_e4m3fn", "float8_e5m2")
    return [
        Gradient({f"t.{d}": gen.standard_normal(7).astype(dtype(d)) for d in names})
        for _ in range(n)
    ]


def _layout(name: str, n: int) -> list[Gradient]:
    """Tensor names that sort differently as UTF-8 bytes than as text, a scalar, an empty one."""
    gen = rng(name)
    shapes = {"b": (3,), "B": (2, 2), "é": (), "z/ä": (0, 3), "Z": (1, 1, 2)}
    return [
        Gradient({t: gen.standard_normal(s).astype(np.float32) for t, s in shapes.items()})
        for _ in range(n)
    ]


def _multiblock() -> list[Gradient]:
    """Two documents over one 1 MiB chunk: tensor "b" straddles the boundary. Five distinct
    values, so git stores the CAR compressed."""
    gen = np.random.default_rng(23)
    shapes = {"a": (1024, 160), "b": (1024, 120)}
    return [
        Gradient({t: (gen.integers(-2, 3, s) / 4).astype(np.float32) for t, s in shapes.items()})
        for _ in range(2)
    ]


def _norm_sum_inputs() -> list[Gradient]:
    return normal("legacy-round2-fedavg-clip", 3, "float64", shapes={"w": (40, 60)})


def _krum_tie() -> list[Gradient]:
    """Five orthogonal unit vectors: every distance 2, every score equal; the lowest index wins."""
    return points(np.eye(5).tolist())


def _multikrum_boundary_tie() -> list[Gradient]:
    """A centre and four points around it: the centre scores 2, the others all 3, so
    multikrum's second pick is a four-way tie (lowest index wins)."""
    return points([[1, 0, 0], [0, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0]])


def _excluded() -> Build:
    async def build(node: LocalNode) -> Round:
        from gradstore.dag import file_cid
        from gradstore.format import encode

        nan = Gradient({"w": np.array([np.nan, 1.0], np.float32)})  # never stored anywhere
        exclusions = [
            (key(7).did, "timeout", None),
            (key(8).did, "non-finite", str(file_cid(encode(nan)))),
        ]
        grads = normal("excluded-peers", 3)
        return await signed_round(node, grads, [5, 6, 7], "fedavg", excluded=exclusions)

    return build


def _chain() -> Build:
    async def build(node: LocalNode) -> Round:
        first = await signed_round(node, normal("chain/0", 3), [4, 4, 4], "mean", round_=0)
        return await signed_round(
            node, normal("chain/1", 3), [4, 4, 4], "mean", round_=1, prev=first.record_cid
        )

    return build


def _stepped_model() -> Model:
    """Three steps of other methods over five peers (the last step over three of them), with
    a bfloat16 and a float16 tensor and input clipping in the median step."""
    every = peers(5)
    some = every[0::2]
    return Model(
        shapes={"head.weight": (4, 6), "head.bias": (4,), "body.weight": (6, 5),
                "body.norm": (5,), "embed.table": (10, 5)},
        dtypes={"body.norm": dtype("bfloat16"), "embed.table": dtype("float16")},
        peers=5,
        steps=(
            {"name": "head", "tensors": ["head.*"], "method": "krum", "byzantine": 1},
            {"name": "body", "tensors": ["body.weight", "body.norm"], "method": "median",
             "clip_input_norm": 4.0},
            {"name": "embed", "tensors": ["embed.*"], "method": "weighted", "peers": some,
             "weights": dict(zip(some, [0.5, 2.0, 1.25], strict=True))},
        ),
    )  # fmt: skip


def _stepped_compressed_model() -> Model:
    """Three steps over four peers: fedavg over every codec family and a dense input, median
    with clip_input_norm over four compressed inputs (a bfloat16 tensor among them; the
    norms, of decompressed values, bind on two), and a dense mean step beside them."""
    return Model(
        shapes={"head.weight": (4, 6), "head.bias": (6,), "body.weight": (5, 8),
                "body.bias": (8,), "embed.table": (10, 4)},
        dtypes={"body.bias": dtype("bfloat16")},
        peers=4,
        steps=(
            {"name": "head", "tensors": ["head.*"], "method": "fedavg"},
            {"name": "body", "tensors": ["body.*"], "method": "median", "clip_input_norm": 6.0},
            {"name": "embed", "tensors": ["embed.table"], "method": "mean"},
        ),
        codecs={
            "head": ["int8:8", _topk(8, 3, "2bit", 12), None, "bf16"],
            "body": ["fp16", _topk(16, 5, "int8", 16), "int8:16", _topk(16, 4, "bf16", 12)],
        },
    )  # fmt: skip


#: Elements of the multi-block step's large tensor: 2 MiB + 16 KiB of float32, so a dense
#: document of it is three leaves and an fp16-compressed one two.
MULTIBLOCK_ELEMENTS: Final = (2 * 1_048_576 + 16_384) // 4
#: Non-zero elements at each end of that tensor: the rest is zeros.
MULTIBLOCK_ENDS: Final = 2048


def _sparse_ends(gen: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Standard normal values, except the large tensor: zeros but for its first and last
    ``MULTIBLOCK_ENDS`` elements, so every document's middle leaf is the same all-zero MiB
    (one block, linked from each) and git stores the CAR compressed."""
    if name != "big.w":
        return np.asarray(gen.standard_normal(shape))
    values = np.zeros(shape)
    values[:MULTIBLOCK_ENDS] = gen.standard_normal(MULTIBLOCK_ENDS)
    values[-MULTIBLOCK_ENDS:] = gen.standard_normal(MULTIBLOCK_ENDS)
    return values


def _stepped_multiblock_model() -> Model:
    """Two peers and two steps: a fedavg step whose inputs (one dense, three leaves; one
    fp16-compressed, two leaves) and output span several blocks, and a one-block mean step;
    the model-level document spans three blocks."""
    return Model(
        shapes={"big.w": (MULTIBLOCK_ELEMENTS,), "big.b": (16,), "small.w": (3, 4)},
        peers=2,
        steps=(
            {"name": "big", "tensors": ["big.*"], "method": "fedavg"},
            {"name": "small", "tensors": ["small.w"], "method": "mean"},
        ),
        codecs={"big": [None, "fp16"]},
        values=_sparse_ends,
    )


def _stepped(
    model: Model, failed: dict[str, str] | None = None, after_round4: bool = False
) -> Build:
    async def build(node: LocalNode) -> Stepped:
        if not after_round4:
            return await stepped_round(node, model=model, failed=failed)
        first = await signed_round(node, normal("steps/round-0", 3), [10, 20, 30], "mean")
        return await stepped_round(node, 1, first.record_cid, model=model, failed=failed)

    return build


def _codecs_text(codecs: Sequence[str | None]) -> str:
    if len(set(codecs)) == 1:
        return f"all compressed with {codecs[0]}"
    return "per input " + ", ".join(c or "dense" for c in codecs)


def _topk(chunk: int, k: int, values: str, index: int) -> str:
    return f"topk:chunk={chunk},k={k},values={values},index={index}"


def vectors() -> list[Vector]:
    """Every vector, in the order vectors.json lists them."""
    v: list[Vector] = []

    def add(name: str, about: str, build: Build) -> None:
        v.append(Vector(name, about, build))

    # one per method: float32, dense, five inputs (odd)
    five = [3, 1, 4, 1, 5]
    for method, kw in (
        ("sum", {}),
        ("mean", {}),
        ("fedavg", {}),
        ("weighted", {"weights": dict(zip(peers(5), [0.5, 2.0, 1.0, 0.0, 3.25], strict=True))}),
        ("median", {}),
        ("trimmed_mean", {"trim_ratio": 0.2}),
        ("krum", {"byzantine": 1}),
        ("multikrum", {"byzantine": 1, "select": 3}),
    ):
        name = f"method-{method}"
        add(
            name,
            f"{method} over five float32 inputs (one of them an outlier at 20x)",
            signed(partial(normal, name, 5, scales=[1, 1, 20, 1, 1]), five, method, **kw),
        )
    # even and odd counts for the order statistics
    add(
        "median-even",
        "median of four inputs: the mean of the two middle values, rounded once",
        signed(lambda: normal("median-even", 4), [1] * 4, "median"),
    )
    add(
        "median-odd-3",
        "median of three inputs (the fewest it takes)",
        signed(lambda: normal("median-odd-3", 3), [1] * 3, "median"),
    )
    add(
        "trimmed_mean-even",
        "trimmed_mean of six inputs, trim_ratio 0.2 (one per side)",
        signed(lambda: normal("trimmed_mean-even", 6), [1] * 6, "trimmed_mean", trim_ratio=0.2),
    )
    add(
        "trimmed_mean-ratio-0",
        "trimmed_mean with trim_ratio 0 (trims nothing: the mean, as an order statistic)",
        signed(lambda: normal("trimmed_mean-ratio-0", 4), [1] * 4, "trimmed_mean", trim_ratio=0.0),
    )
    # every float dtype: fedavg (one rounding from float64 to the dtype) and an even median
    for dt in ("float16", "float64", "bfloat16", "float8_e4m3fn", "float8_e5m2"):
        name = f"dtype-{dt}"
        add(
            name,
            f"fedavg over three {dt} inputs: float64 accumulation, one rounding to {dt}",
            signed(partial(normal, name, 3, dt), [1, 2, 4], "fedavg"),
        )
    add(
        "dtypes-mixed-median",
        "median of four inputs whose documents hold one tensor of every float dtype",
        signed(lambda: _mixed_dtypes("dtypes-mixed-median", 4), [1] * 4, "median"),
    )
    add(
        "layout-names-scalar-empty",
        "tensor names in UTF-8 byte order, a scalar and an empty tensor (mean)",
        signed(lambda: _layout("layout-names-scalar-empty", 3), [1] * 3, "mean"),
    )
    # every codec, and top-k's every value format and index width
    for name, codecs, method, dt in (
        ("codec-bf16", ["bf16", "bf16", "bf16"], "mean", "float32"),
        ("codec-fp16", ["fp16", "fp16", "fp16"], "fedavg", "float64"),
        ("codec-int8", ["int8:8", "int8:8", "int8:8"], "mean", "float32"),
        ("codec-int8-bfloat16", ["int8:16", "int8:16", None], "fedavg", "bfloat16"),
        ("codec-topk-bf16-index12", [_topk(16, 4, "bf16", 12)] * 3, "sum", "float32"),
        ("codec-topk-int8-index16", [_topk(16, 5, "int8", 16)] * 3, "mean", "float16"),
        ("codec-topk-2bit", [_topk(8, 3, "2bit", 12)] * 3, "mean", "float32"),
        ("codec-mixed-median", [None, "int8:8", _topk(16, 6, "bf16", 12), "fp16"], "median", "float32"),
        ("codec-mixed-krum", [None, "bf16", "int8:8", _topk(16, 8, "int8", 12), None], "krum", "float32"),
    ):  # fmt: skip
        krum = {"byzantine": 1} if method == "krum" else {}
        add(
            name,
            f"{method} over {dt} inputs: {_codecs_text(codecs)}",
            signed(
                partial(normal, name, len(codecs), dt),
                [1, 2, 3, 4, 5][: len(codecs)],
                method,
                codecs=codecs,
                **krum,
            ),
        )
    # clipping
    add(
        "clip-input-fedavg",
        "fedavg with clip_input_norm binding on two of three inputs",
        signed(
            lambda: normal("clip-input-fedavg", 3, scales=[0.1, 1, 3]),
            [2, 3, 5],
            "fedavg",
            clip_input_norm=4.0,
        ),
    )
    add(
        "clip-output-mean",
        "mean with clip_output_norm binding",
        signed(lambda: normal("clip-output-mean", 3, scales=[5, 5, 5]), [1] * 3, "mean",
               clip_output_norm=1.5),
    )  # fmt: skip
    add(
        "clip-both-multikrum",
        "multikrum with input clipping (scales the distances) and output clipping",
        signed(
            lambda: normal("clip-both-multikrum", 5, scales=[1, 2, 30, 1, 4]),
            [1] * 5,
            "multikrum",
            byzantine=1,
            clip_input_norm=6.0,
            clip_output_norm=2.0,
        ),
    )
    add(
        "clip-input-median-compressed",
        "median of int8-compressed inputs with clip_input_norm (norms of decompressed values)",
        signed(
            lambda: normal("clip-input-median-compressed", 4, scales=[1, 3, 0.5, 8]),
            [1] * 4,
            "median",
            codecs=["int8:8", None, "int8:8", "int8:8"],
            clip_input_norm=5.0,
        ),
    )
    # signed zeros
    add(
        "zeros-all-negative-sum",
        "sum of inputs whose every element is -0.0 (float32, bfloat16, float8_e4m3fn)",
        signed(lambda: _all_negative_zero(3), [1] * 3, "sum"),
    )
    add(
        "zeros-all-negative-fedavg-clip",
        "fedavg of all -0.0 inputs with both clippings (zero norms)",
        signed(lambda: _all_negative_zero(3), [1, 2, 3], "fedavg", clip_input_norm=1.0,
               clip_output_norm=1.0),
    )  # fmt: skip
    add(
        "zeros-all-negative-krum",
        "krum over all -0.0 inputs: every distance 0, a tie",
        signed(lambda: _all_negative_zero(5), [1] * 5, "krum", byzantine=1),
    )
    for n, method, args in ((3, "median", {}), (4, "median", {}), (5, "trimmed_mean", {"trim_ratio": 0.2})):  # fmt: skip
        name = f"zeros-mixed-{method}-{n}"
        add(
            name,
            f"{method} of {n} inputs of +0.0 and -0.0: every sign pattern, one per coordinate",
            signed(partial(_zero_patterns, n), [1] * n, method, **args),
        )
    add(
        "zeros-mixed-mean-4",
        "mean of four inputs of +0.0 and -0.0: every sign pattern, one per coordinate",
        signed(lambda: _zero_patterns(4), [1] * 4, "mean"),
    )
    # Krum ties
    add(
        "krum-tie",
        "krum over five equidistant inputs: all scores equal, the lowest index is selected",
        signed(_krum_tie, [1] * 5, "krum", byzantine=1),
    )
    add(
        "multikrum-boundary-tie",
        "multikrum select 2: a four-way tie for the second place",
        signed(_multikrum_boundary_tie, [1] * 5, "multikrum", byzantine=1, select=2),
    )
    # multi-block documents
    add(
        "multiblock-mean-clip",
        "mean of a dense and a top-k input, documents over one 1 MiB chunk, clip_input_norm",
        signed(
            _multiblock,
            [1, 1],
            "mean",
            codecs=[None, _topk(4096, 64, "int8", 12)],
            clip_input_norm=100.0,
        ),
    )
    # an excluded peer, a chain of rounds
    add("excluded-peers", "fedavg with two excluded announcements (one with a CID)", _excluded())
    add("chain-two-rounds", "round 1 of a chain: prev links round 0's record", _chain())
    # older record versions stay auditable
    # the same inputs under round/4's sequential and round/2's blockwise-pairwise norm sums:
    # float64, so the clip factors' last bits reach the output (the two outputs differ)
    add(
        "clip-input-norm-sum-float64",
        "fedavg, clip_input_norm: round/4 sums squares in order (other bits than round/2's)",
        signed(_norm_sum_inputs, [3, 4, 5], "fedavg", clip_input_norm=40.0),
    )
    add(
        "legacy-round2-fedavg-clip",
        "a round/2 record (no peer signatures; norms summed blockwise-pairwise), the same "
        "inputs as clip-input-norm-sum-float64",
        legacy(_norm_sum_inputs, [3, 4, 5], "fedavg", clip_input_norm=40.0),
    )
    add(
        "legacy-round2-multikrum",
        "a round/2 multikrum record",
        legacy(
            lambda: normal("legacy-round2-multikrum", 5, scales=[1, 1, 9, 1, 1]),
            [1] * 5,
            "multikrum",
            byzantine=1,
            select=3,
        ),
    )
    add(
        "legacy-round3-codecs-clip",
        "a round/3 record: compressed inputs (codec in every input), clip_input_norm",
        legacy(
            lambda: normal("legacy-round3-codecs-clip", 3, shapes={"w": (40, 60)}),
            [3, 4, 5],
            "fedavg",
            codecs=["int8", None, "fp16"],
            clip_input_norm=40.0,
        ),
    )
    # stepped rounds (docs/spec.md section 9): round/5 records, their step records and
    # model-level documents
    add(
        "steps-three-methods",
        "a round/5 record of three steps: krum, median with clip_input_norm (a bfloat16 "
        "tensor), weighted over three of the five peers (float16); the model-level document",
        _stepped(_stepped_model()),
    )
    add(
        "steps-failed-step-after-round4",
        "round 1 of a chain whose round 0 is a round/4 record: a round/5 record of three steps "
        "(fedavg, mean), the middle one failed, so the model holds the other two steps' tensors",
        _stepped(Model(), {"mid": "quorum not met: 1 of 3 peers by the deadline"}, True),
    )
    add(
        "steps-compressed-inputs",
        "a round/5 record whose step inputs are compressed: fedavg over int8, top-k 2bit, "
        "bf16 and a dense input; median with clip_input_norm (binding on two) over fp16, "
        "top-k int8, top-k bf16 and int8 inputs (a bfloat16 tensor); a dense mean step",
        _stepped(_stepped_compressed_model()),
    )
    add(
        "steps-multiblock",
        "a round/5 record whose fedavg step's inputs (dense: three leaves; fp16: two) and "
        "output span several 1 MiB blocks, mostly zeros (one all-zero leaf linked from every "
        "document); a one-block mean step; the model-level document of three leaves",
        _stepped(_stepped_multiblock_model()),
    )
    return v


async def _blocks(node: LocalNode, root: CID) -> list[Block]:
    """The DAG under ``root``, depth-first, each block once (the order of ``export_car``)."""
    seen: set[CID] = set()
    stack, out = [root], []
    while stack:
        cid = stack.pop()
        if cid in seen:
            continue
        seen.add(cid)
        block = Block(cid, await node.get_block(cid))
        out.append(block)
        stack.extend(reversed(block_links(block)))
    return out


def _inputs(record: RoundRecord | StepRecord) -> list[dict[str, Any]]:
    return [
        {
            "peer": i.peer,
            "cid": str(i.gradient),
            "num_samples": i.num_samples,
            "weight": i.weight,
            "codec": None if i.codec is None else i.codec.fields(),
        }
        for i in record.inputs
    ]


def _excluded_entries(record: RoundRecord | StepRecord) -> list[dict[str, Any]]:
    return [
        {"peer": e.peer, "reason": e.reason, "cid": None if e.cid is None else str(e.cid)}
        for e in record.excluded
    ]


async def _steps(node: LocalNode, cid: CID, record: SteppedRoundRecord) -> list[dict[str, Any]]:
    """A round/5 record's steps as vectors.json lists them: a closed step's record, method,
    inputs and output (with its tensors), or a failed step's reason."""
    outputs = await step_outputs(node, cid)
    out: list[dict[str, Any]] = []
    for entry in record.steps:
        if entry.record is None:
            out.append({"step": entry.step, "failed": entry.failed})
            continue
        _, step = await fetch_step_record(node, entry.record, entry.step)
        out.append(
            {
                "step": step.step,
                "record": str(entry.record),
                "record_type": step.type,
                "tensors": list(step.tensors),
                "method": step.method,
                "params": step.params,
                "inputs": _inputs(step),
                "excluded": _excluded_entries(step),
                "output": str(step.output),
                "output_tensors": outputs[step.step],
            }
        )
    return out


async def make(vector: Vector, out: Path, scratch: Path) -> dict[str, Any]:
    """Build one vector in a fresh LocalNode, write its CAR, return its vectors.json entry."""
    node = LocalNode(scratch / vector.name)
    built = await vector.build(node)
    record = built.record
    blocks = await _blocks(node, built.record_cid)
    with open(out / f"{vector.name}.car", "wb") as f:
        for piece in write_car([built.record_cid], blocks):
            f.write(piece)
    covers, output_tensors = await describe(node, built.record_cid)
    chain = []
    prev = record.prev
    while prev is not None:  # the rounds before, newest first (all in the CAR)
        _, earlier = await fetch_any_record(node, prev)
        chain.append({"round": earlier.round, "record": str(prev), "output": str(earlier.output)})
        prev = earlier.prev
    if isinstance(record, SteppedRoundRecord):
        what: dict[str, Any] = {"steps": await _steps(node, built.record_cid, record)}
    else:
        what = {
            "method": record.method,
            "params": record.params,
            "inputs": _inputs(record),
            "excluded": _excluded_entries(record),
        }
    return {
        "name": vector.name,
        "about": vector.about,
        "car": f"{vector.name}.car",
        "record": str(built.record_cid),
        "record_type": record.type,
        "coordinator": record.coordinator,
        "job": record.job,
        "run": record.run,
        "round": record.round,
        **what,
        "prev": None if record.prev is None else str(record.prev),
        "history": chain,
        "output": str(record.output),
        "output_tensors": output_tensors,
        "blocks": len(blocks),
        "covers": covers,
    }


async def generate(out: Path) -> list[dict[str, Any]]:
    """Write every vector's CAR and vectors.json into ``out``; return the entries."""
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    with tempfile.TemporaryDirectory(prefix="gradstore-vectors-") as scratch:
        for vector in vectors():
            entries.append(await make(vector, out, Path(scratch)))
    document = {
        "format": FORMAT,
        "generator": "scripts/make_vectors.py",
        "job": JOB,
        "run": RUN,
        "coordinator": COORDINATOR.did,
        "vectors": entries,
    }
    text = json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    (out / "vectors.json").write_text(text, encoding="utf-8")
    return entries


def generated_files(directory: Path) -> list[str]:
    """The files the generator owns in ``directory`` (the CARs and vectors.json)."""
    return [*sorted(p.name for p in directory.iterdir() if p.suffix == ".car"), "vectors.json"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=VECTORS_DIR, help="directory to write")
    parser.add_argument(
        "--check", action="store_true", help="regenerate elsewhere and compare with --out"
    )
    args = parser.parse_args(argv)
    if not args.check:
        entries = asyncio.run(generate(args.out))
        size = sum((args.out / e["car"]).stat().st_size for e in entries)
        print(f"wrote {len(entries)} vectors ({size} bytes of CAR) to {args.out}")
        return 0
    with tempfile.TemporaryDirectory(prefix="gradstore-vectors-check-") as tmp:
        fresh = Path(tmp)
        asyncio.run(generate(fresh))
        want, have = generated_files(fresh), generated_files(args.out)
        differ = [
            n for n in want if n not in have or not filecmp.cmp(fresh / n, args.out / n, False)
        ]
        stale = [n for n in have if n not in want]
        for name in differ + stale:
            print(f"differs: {name}", file=sys.stderr)
        return 1 if differ or stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
