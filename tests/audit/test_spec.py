"""docs/spec.md is enough to audit a round: ``spec_reference`` (written from it alone, standard
library only) re-derives the output CID of honest rounds bit for bit.

Rounds are closed by the coordinator's own code (``rounds.signed_round``, round/4) or written
as an earlier coordinator did (``rounds.legacy_round``, round/2 and round/3), on an embedded
node. They cover every method, the float dtypes, every codec, input and output clipping,
signed zeros, even and odd counts, Krum ties and documents of several blocks. When the
reference disagrees, the spec's words (or, where a rule could not be stated simply, the
round/4 implementation) are what changes, never this test.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import json
import math
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from gradstore.aggregate import AggregationParams, aggregate, global_norm
from gradstore.aggregate._rounding import round_into
from gradstore.aggregate.methods import trimmed_per_side
from gradstore.audit import verify_round
from gradstore.compress import parse_spec
from gradstore.dag import CID, RAW
from gradstore.dag.builder import _leaves_inline, layout
from gradstore.dag.chunker import chunks
from gradstore.dag.cid import DAG_PB
from gradstore.errors import AuditError
from gradstore.format import Gradient, encode
from gradstore.job import Selector
from gradstore.messages import (
    Announce,
    SigningKey,
    announcement_signature,
    encode_message,
    model_meta,
)
from gradstore.node import LocalNode
from gradstore.store import GradientStore, put_model

from . import spec_reference as ref
from .rounds import COORDINATOR, JOB, RUN, Round, key, legacy_round, put_record, signed_round
from .stepped import (
    DEFAULT,
    PEERS,
    SEED,
    Model,
    StepDone,
    Stepped,
    announcement,
    close_step,
    peer_documents,
    publish_round,
    replace_step,
    resigned,
    sign_round,
    sign_step,
    step_config,
    stepped_round,
)

SHAPES = {"a/w": (6, 7), "b.bias": (13,), "é": (2, 2), "Z": ()}
#: float64 and large enough that the norm rules of round/4 and round/2 give other clip
#: factors, whose last bits then reach the output
LARGE = {"w": (300, 70), "v": (70_001,)}


def getter(path: Path) -> ref.GetBlock:
    node = LocalNode(path)
    return lambda cid: asyncio.run(node.get_block(CID.from_bytes(cid)))


def gradients(
    n: int, dtype: Any, seed: int, shapes: dict[str, tuple[int, ...]] = SHAPES
) -> list[Gradient]:
    """Inputs with signed zeros where they matter: an element that is -0.0 in every input
    (a linear method keeps it), one of mixed signs, one whose median is -0.0, and a tiny
    negative one that output clipping scales to zero."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        tensors = {}
        for name, shape in shapes.items():
            values = rng.standard_normal(shape) * rng.uniform(0.2, 3.0)
            flat = values.reshape(-1)
            if flat.size >= 4:
                flat[0] = -0.0
                flat[1] = 0.0 if i % 2 else -0.0
                flat[2] = -0.0 if i == n // 2 else (1.0 if i > n // 2 else -1.0)
                flat[3] = -1e-45  # float32's smallest: a clip scale rounds it to -0.0
            tensors[name] = values.astype(dtype)
        out.append(Gradient(tensors))
    return out


def audited(path: Path, done: Round) -> ref.Audit:
    """The reference's audit of ``done``; it must name the record's own output."""
    result = ref.audit_round(getter(path), str(done.record_cid))
    assert isinstance(result, ref.Audit)
    assert ref.cid_text(result.output) == str(done.record.output.to_v1())
    return result


F8 = np.dtype(ml_dtypes.float8_e4m3fn)
E5 = np.dtype(ml_dtypes.float8_e5m2)
BF = np.dtype(ml_dtypes.bfloat16)

ROUNDS: list[tuple[str, dict[str, Any]]] = [
    ("sum-f32", {"method": "sum", "n": 3, "dtype": np.float32}),
    ("mean-f16-even", {"method": "mean", "n": 4, "dtype": np.float16}),
    ("fedavg-bf16", {"method": "fedavg", "n": 3, "dtype": BF}),
    ("weighted-f64-zero-weight", {"method": "weighted", "n": 4, "dtype": np.float64,
                                  "weights": [1.0, 0.0, 2.5, 0.3]}),
    ("median-f32-odd", {"method": "median", "n": 5, "dtype": np.float32}),
    ("median-bf16-even", {"method": "median", "n": 4, "dtype": BF}),
    ("trimmed-f32-0.3-of-10", {"method": "trimmed_mean", "n": 10, "dtype": np.float32,
                               "trim_ratio": 0.3}),
    # floor(100 * 0.29) is 28 in binary64: the slack of 1e-9 makes it 29
    ("trimmed-100-inputs-0.29", {"method": "trimmed_mean", "n": 100, "dtype": np.float32,
                                 "trim_ratio": 0.29}),
    ("trimmed-e4m3-odd", {"method": "trimmed_mean", "n": 5, "dtype": F8, "trim_ratio": 0.2}),
    ("sum-e5m2", {"method": "sum", "n": 3, "dtype": E5}),
    ("krum-f32", {"method": "krum", "n": 5, "dtype": np.float32, "byzantine": 1}),
    ("multikrum-f16-select", {"method": "multikrum", "n": 6, "dtype": np.float16,
                              "byzantine": 1, "select": 3}),
    ("multikrum-f64-default", {"method": "multikrum", "n": 5, "dtype": np.float64,
                               "byzantine": 1}),
    ("mean-clip-f64-large", {"method": "mean", "n": 3, "dtype": np.float64, "shapes": LARGE,
                             "clip_input_norm": 150.0, "clip_output_norm": 100.0}),
    ("mean-clip-both", {"method": "mean", "n": 4, "dtype": np.float32,
                        "clip_input_norm": 3.0, "clip_output_norm": 0.5}),
    ("fedavg-clip-f16", {"method": "fedavg", "n": 3, "dtype": np.float16,
                         "clip_input_norm": 2.0, "clip_output_norm": 1.0}),
    ("median-clip-both", {"method": "median", "n": 5, "dtype": np.float32,
                          "clip_input_norm": 2.5, "clip_output_norm": 0.7}),
    ("trimmed-clip-out-bf16", {"method": "trimmed_mean", "n": 6, "dtype": BF,
                               "trim_ratio": 0.2, "clip_output_norm": 0.4}),
    ("multikrum-clip-in", {"method": "multikrum", "n": 5, "dtype": np.float32, "byzantine": 1,
                           "clip_input_norm": 2.0, "clip_output_norm": 0.5}),
    ("fedavg-codecs", {"method": "fedavg", "n": 5, "dtype": np.float32,
                       "codecs": ["int8:block=5", "topk:k=3,chunk=8,values=int8", None,
                                  "topk:k=2,chunk=7,values=2bit,index=16", "bf16"]}),
    ("mean-topk-bf16-clip", {"method": "mean", "n": 3, "dtype": np.float32,
                             "codecs": ["topk:k=4,chunk=9", "topk:k=1,chunk=5", "fp16"],
                             "clip_input_norm": 2.0, "clip_output_norm": 1.5}),
    ("median-codecs-bf16", {"method": "median", "n": 4, "dtype": BF,
                            "codecs": ["fp16", "bf16", "int8:block=3", None]}),
    ("weighted-codecs-f16", {"method": "weighted", "n": 3, "dtype": np.float16,
                             "weights": [0.5, 2.0, 1.0],
                             "codecs": ["topk:k=2,chunk=4,values=2bit", "int8:block=64", None]}),
    ("krum-codecs", {"method": "krum", "n": 5, "dtype": np.float32, "byzantine": 1,
                     "codecs": ["int8:block=7", None, "fp16", "topk:k=5,chunk=6", "bf16"]}),
]  # fmt: skip


def _scenario(spec: dict[str, Any]) -> tuple[list[Gradient], list[int], dict[str, Any]]:
    spec = dict(spec)
    method, n, dtype = spec.pop("method"), spec.pop("n"), spec.pop("dtype")
    shapes = spec.pop("shapes", SHAPES)
    if "weights" in spec:  # the job file's weights, by peer
        spec["weights"] = {key(i).did: w for i, w in enumerate(spec["weights"])}
    seed = sum(map(ord, method)) + n
    grads = gradients(n, dtype, seed, shapes)
    return grads, [17 + 29 * i for i in range(n)], {"method": method, **spec}


@pytest.mark.parametrize("version", ["round/4", "legacy"])
@pytest.mark.parametrize(("name", "spec"), ROUNDS, ids=[r[0] for r in ROUNDS])
def test_the_reference_rederives_every_round(
    tmp_path: Path, name: str, spec: dict[str, Any], version: str
) -> None:
    grads, samples, aggregation = _scenario(spec)
    build = signed_round if version == "round/4" else legacy_round
    done = asyncio.run(build(LocalNode(tmp_path), grads, samples, **aggregation))
    want = "gradstore/round/4" if version == "round/4" else (
        "gradstore/round/3" if aggregation.get("codecs") else "gradstore/round/2"
    )  # fmt: skip
    assert done.record.type == want
    result = audited(tmp_path, done)
    if aggregation["method"] in ("median", "trimmed_mean"):
        zeros = [v for _, _, values in result.tensors.values() for v in values if v == 0]
        if version == "round/4" or "clip_output_norm" not in aggregation:
            assert zeros and all(math.copysign(1.0, v) > 0 for v in zeros)  # never -0.0


EXACT_ROUNDS: list[tuple[str, dict[str, Any]]] = [
    ("fedavg-f32", {"method": "fedavg", "n": 5, "dtype": np.float32}),
    ("weighted-bf16-zero-weight", {"method": "weighted", "n": 4, "dtype": BF,
                                   "weights": [1.0, 0.0, 2.5, 0.3]}),
    ("sum-f64-clip-large", {"method": "sum", "n": 3, "dtype": np.float64, "shapes": LARGE,
                            "clip_input_norm": 150.0, "clip_output_norm": 100.0}),
    ("mean-codecs", {"method": "mean", "n": 3, "dtype": np.float32,
                     "codecs": ["topk:k=4,chunk=9", "int8:block=5", None]}),
]  # fmt: skip


@pytest.mark.parametrize(("name", "spec"), EXACT_ROUNDS, ids=[r[0] for r in EXACT_ROUNDS])
def test_the_reference_rederives_exact_rounds(
    tmp_path: Path, name: str, spec: dict[str, Any]
) -> None:
    """``accumulate = "exact"`` (§6.4): the coordinator's round, its record naming the mode,
    re-derived by the reference from exact rationals and by gradstore's own audit."""
    grads, samples, aggregation = _scenario(spec)
    node = LocalNode(tmp_path)
    done = asyncio.run(signed_round(node, grads, samples, **aggregation, accumulate="exact"))
    assert done.record.params["accumulate"] == "exact"
    result = audited(tmp_path, done)
    if "codecs" not in spec:  # (a topk input's elements not kept are +0.0)
        zeros = [v for _, _, values in result.tensors.values() for v in values if v == 0]
        assert any(math.copysign(1.0, v) < 0 for v in zeros)  # -0.0 in every input stays
    asyncio.run(verify_round(node, done.record_cid, coordinator=COORDINATOR.did))


def test_a_linear_method_keeps_an_element_that_is_minus_zero_in_every_input(
    tmp_path: Path,
) -> None:
    grads = gradients(3, np.float32, 5)
    done = asyncio.run(signed_round(LocalNode(tmp_path), grads, [1, 2, 3], "fedavg"))
    result = audited(tmp_path, done)
    first = result.tensors["a/w"][2][0]
    assert first == 0 and math.copysign(1.0, first) < 0


@pytest.mark.slow
def test_several_blocks_with_both_clippings_and_a_compressed_input(tmp_path: Path) -> None:
    """Documents over 1 MiB (inputs and output of several leaves), in both versions."""
    rng = np.random.default_rng(8)
    shapes = {"big": (600_000,), "small": (5,)}  # a compressed fp16 input of 1.2 MB too
    grads = [
        Gradient({k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()})
        for _ in range(3)
    ]
    clip = {"clip_input_norm": 500.0, "clip_output_norm": 300.0}
    for build, codecs in ((signed_round, [None, "fp16", None]), (legacy_round, None)):
        done = asyncio.run(
            build(LocalNode(tmp_path), grads, [3, 1, 2], "mean", codecs=codecs, **clip)
        )  # type: ignore[operator]
        links = [i.gradient for i in done.record.inputs] + [done.record.output]
        assert all(link.codec == DAG_PB for link in links)  # every document has 2+ leaves
        audited(tmp_path, done)
    median = asyncio.run(signed_round(LocalNode(tmp_path), grads, [1, 1, 1], "median"))
    audited(tmp_path, median)


def _ordered_keys(n: int) -> list[SigningKey]:
    """Peer keys in record order (sorted by did), so input i of a scenario is record index i."""
    return sorted((key(i) for i in range(n)), key=lambda k: k.did)


def test_krum_exact_ties_select_the_lowest_indices(tmp_path: Path) -> None:
    """Five inputs at the vertices of a simplex: every distance and score is equal."""
    keys = _ordered_keys(5)
    grads = [Gradient({"w": np.eye(5, dtype=np.float32)[i] * 3}) for i in range(5)]
    for method, extra, want in (("krum", {}, (0,)), ("multikrum", {"select": 2}, (0, 1))):
        done = asyncio.run(
            signed_round(
                LocalNode(tmp_path), grads, [1] * 5, method, peer_keys=keys, byzantine=1, **extra
            )
        )
        assert audited(tmp_path, done).selected == want


def test_krum_ranks_scores_at_nine_digits(tmp_path: Path) -> None:
    """Input 1's score is below input 0's by 2^-35 (relative 1.3e-11): equal at 9 digits, so
    the lower index wins, where exact ranking would pick input 1."""
    keys = _ordered_keys(5)
    eps = 2.0**-36
    points = [[1.0, 0.0], [0.0, 0.0], [0.5 - eps, 1.0], [50.0, 50.0], [-50.0, 80.0]]
    grads = [Gradient({"w": np.array(p, np.float64)}) for p in points]
    done = asyncio.run(
        signed_round(LocalNode(tmp_path), grads, [1] * 5, "krum", peer_keys=keys, byzantine=1)
    )
    result = audited(tmp_path, done)
    assert result.selected == (0,)
    s0, s1 = 2.25 + eps + eps * eps, 2.25 - eps + eps * eps
    assert s1 < s0 and ref.rank_key(s0) == ref.rank_key(s1)


def test_a_record_that_lies_about_its_output_fails_the_reference(tmp_path: Path) -> None:
    grads = gradients(3, np.float32, 9)
    node = LocalNode(tmp_path)
    done = asyncio.run(signed_round(node, grads, [1, 2, 3], "mean"))
    other = asyncio.run(signed_round(node, grads, [1, 2, 3], "sum", round_=1))
    forged = dataclasses.replace(done.record, output=other.record.output)
    cid = asyncio.run(put_record(node, forged))
    with pytest.raises(ref.SpecAuditError) as caught:
        ref.audit_round(getter(tmp_path), str(cid))
    assert caught.value.check == "output-cid"
    inflated = dataclasses.replace(
        done.record,
        inputs=(
            dataclasses.replace(done.record.inputs[0], num_samples=999),
            *done.record.inputs[1:],
        ),
    )
    cid = asyncio.run(put_record(node, inflated))
    with pytest.raises(ref.SpecAuditError) as caught:
        ref.audit_round(getter(tmp_path), str(cid))
    assert caught.value.check == "input-signature"
    # gradstore's own audit agrees on the honest record
    asyncio.run(verify_round(node, done.record_cid, coordinator=COORDINATOR.did))


# -- the pieces, against gradstore's own ----------------------------------------------------


@pytest.mark.parametrize("dtype", ["<f2", "<f4", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_rounding_to_each_dtype_is_gradstores(dtype: str) -> None:
    """§6.9 against ``round_into``: random values over the whole range, halfway cases (where
    rounding through float32 would differ), the largest value and just beyond it."""
    rng = np.random.default_rng(1)
    fmt = ref.FORMATS[dtype]
    top = math.log2(fmt.largest)
    values = list(
        rng.standard_normal(4000) * np.exp2(rng.uniform(fmt.emin - fmt.p - 2, top + 1, 4000))
    )
    for m in range(1, 200):  # halfway between neighbours, and a hair above
        half = (2 * m + 1) * 2.0 ** (-fmt.p - 1)
        values += [1 + half, -(1 + half), 1 + half + 2**-45]
    values += [
        fmt.largest,
        fmt.largest * (1 + 2.0 ** (-fmt.p - 2)),
        fmt.largest * (1 + 2.0 ** (-fmt.p - 1)),
    ]
    values += [2.0 ** (fmt.emin - fmt.p - 1), -(2.0 ** (fmt.emin - fmt.p - 2)), 464.0, 470.0]
    want = np.empty(len(values), np.dtype(getattr(ml_dtypes, dtype, dtype)))
    with np.errstate(over="ignore", invalid="ignore"):
        round_into(want, np.array(values, np.float64))
    got = [ref.round_to(dtype, v) for v in values]
    wide = want.astype(np.float64)
    for v, g, w in zip(values, got, wide.tolist(), strict=True):
        assert (g == w and math.copysign(1, g) == math.copysign(1, w)) or (g != g and w != w), v
    finite = [g for g in got if math.isfinite(g)]
    assert ref.encode_floats(dtype, finite) == np.array(finite).astype(want.dtype).tobytes()


def test_blocked_pairwise_norms_are_the_specs_on_any_numpy() -> None:
    # NumPy 2.5 sums differently from 2.4, which wrote round/2 and round/3 records: gradstore
    # writes 2.4's pairwise sum out, so old records re-derive whatever NumPy is installed
    rng = np.random.default_rng(2)
    for n in (1, 7, 8, 9, 127, 128, 129, 1000, 8193, 65_536, 65_537, 140_000):
        x = rng.standard_normal(n) * np.exp(rng.uniform(-20, 20, n))
        got = global_norm({"x": x}, "blocked-pairwise")
        assert ref.norm_blocked_pairwise([x.tolist()]) == got
        if np.__version__.startswith("2.4."):  # the NumPy those records were written with
            blocks = sum(float(np.square(x[lo : lo + 65_536]).sum()) for lo in range(0, n, 65_536))
            assert got == math.sqrt(blocks)


def test_trimmed_counts_are_gradstores() -> None:
    for n in range(1, 60):
        for r in (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.33, 0.4, 0.45, 0.49, 0.57 / 2):
            assert ref.trimmed_per_side(n, r) == trimmed_per_side(n, r), (n, r)


def test_file_cids_are_gradstores_at_every_depth() -> None:
    """§3 with small chunks and fan-out, so trees of depth 1 to 4 stay small."""
    data = bytes(range(256)) * 40
    for size in (1, 15, 16, 17, 48, 49, 200, 1000, len(data)):
        for fanout in (2, 3, 1024):
            blocks = list(layout(_leaves_inline(chunks([data[:size]], 16)), max_links=fanout))
            assert ref.file_cid(data[:size], chunk=16, max_links=fanout) == blocks[-1].cid.bytes


def test_documents_encode_as_gradstore_does() -> None:
    meta = {"z": [1, -40, 2.5, None, True, b"\x00"], "é": {"b": 1, "a": "x" * 40}, "a": 300}
    arrays = {
        "b": np.arange(3, dtype=np.float32),
        "a": np.ones((2, 70), np.float16),
        "e": np.zeros((0, 3), np.float64),
    }
    doc = encode(Gradient(arrays, meta)).tobytes()
    mine = ref.encode_document(
        meta, [(k, v.dtype.str, v.shape, v.tobytes()) for k, v in arrays.items()]
    )
    assert mine == doc
    parsed = ref.decode_document(doc)
    assert parsed.meta == meta and [t.name for t in parsed.tensors] == ["a", "b", "e"]
    assert ref.file_cid(doc) == CID.parse(str(ref.cid_text(ref.file_cid(doc)))).bytes


def test_announcements_are_the_bytes_peers_sign() -> None:
    k = key(3)
    cid = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
    ann = Announce("job-1", "run0run0run0", 7, k.did, cid, 12, 1_700_000_000_123)
    wire = encode_message(ann, k)
    signed = ref.announcement_bytes("job-1", "run0run0run0", 7, k.did, cid, 12, 1_700_000_000_123)
    assert wire[1:].startswith(signed[1:]) and signed[0] == 0x89 and wire[0] == 0x8A
    assert ref.ed25519_verify(ref.public_key(k.did), signed, wire[-64:])
    assert not ref.ed25519_verify(ref.public_key(k.did), signed + b"x", wire[-64:])


def test_the_linear_rule_accumulates_from_the_first_term() -> None:
    """§6.4: -0.0 in every input stays -0.0 (0.0 + ... would give +0.0)."""
    inputs = [{"w": np.array([-0.0, 1.0], np.float32)}] * 3
    out = aggregate(inputs, AggregationParams("mean"))["w"]
    mine = ref.linear([[-0.0, 1.0]] * 3, [1.0] * 3, 3.0)
    assert struct.pack("<d", mine[0]) == struct.pack("<d", float(out[0])) == struct.pack("<d", -0.0)


VECTORS = Path(__file__).resolve().parents[2] / "tests" / "vectors"
VECTOR_LIST = json.loads((VECTORS / "vectors.json").read_text("utf-8"))["vectors"]


@pytest.mark.parametrize("vector", VECTOR_LIST, ids=[v["name"] for v in VECTOR_LIST])
def test_the_reference_rederives_every_conformance_vector(
    tmp_path: Path, vector: dict[str, Any]
) -> None:
    """tests/vectors, read by the reference from their CARs: the output vectors.json names."""
    node = LocalNode(tmp_path)
    data = (VECTORS / vector["car"]).read_bytes()
    roots = asyncio.run(node.import_car([data]))
    assert [str(r) for r in roots] == [vector["record"]]
    result = ref.audit_round(getter(tmp_path), vector["record"])
    assert ref.cid_text(result.output) == vector["output"]
    assert result.record["coordinator"] == vector["coordinator"]
    if isinstance(result, ref.SteppedAudit):  # and each step's aggregate, as listed
        closed = {s["step"]: s["output"] for s in vector["steps"] if "failed" not in s}
        assert {n: ref.cid_text(a.output) for n, a in result.steps.items()} == closed
        assert result.failed == {s["step"]: s["failed"] for s in vector["steps"] if "failed" in s}


# -- stepped rounds (docs/spec.md section 9) --------------------------------------------------

#: Five peers and four steps of other methods, dtypes and clippings (one of three peers only).
METHODS = Model(
    shapes={"out.bias": (7,), "out.weight": (7, 9), "mid.a": (9, 11), "mid.b": (11,),
            "norm.g": (5,), "emb.table": (13, 5), "emb.pos": ()},
    dtypes={"out.weight": np.float16, "mid.a": BF, "norm.g": F8, "emb.table": np.float64},
    peers=5,
    steps=(
        {"name": "out", "tensors": ["out.*"], "method": "krum", "byzantine": 1,
         "clip_input_norm": 3.0},
        {"name": "mid", "tensors": ["mid.b", "mid.a"], "method": "trimmed_mean",
         "trim_ratio": 0.2, "clip_output_norm": 0.5},
        {"name": "norm", "tensors": ["norm.g"], "method": "multikrum", "byzantine": 1,
         "select": 3},
        {"name": "emb", "tensors": ["emb.*"], "method": "weighted",
         "peers": [key(i).did for i in (0, 2, 4)],
         "weights": {key(0).did: 0.5, key(2).did: 2.0, key(4).did: 1.25}},
    ),
)  # fmt: skip
#: Five peers, three steps whose peers compress their documents (every codec family, mixed
#: with dense ones): krum with input clipping, trimmed_mean with output clipping over
#: bfloat16, weighted over three peers.
COMPRESSED = Model(
    shapes={"out.w": (6, 9), "out.b": (6,), "mid.w": (9, 10), "mid.b": (10,), "emb": (12, 4)},
    dtypes={"out.w": np.float16, "mid.w": BF},
    peers=5,
    steps=(
        {"name": "out", "tensors": ["out.*"], "method": "krum", "byzantine": 1,
         "clip_input_norm": 4.0},
        {"name": "mid", "tensors": ["mid.*"], "method": "trimmed_mean", "trim_ratio": 0.2,
         "clip_output_norm": 1.0},
        {"name": "emb", "tensors": ["emb"], "method": "weighted",
         "peers": [key(i).did for i in (0, 2, 4)],
         "weights": {key(0).did: 0.5, key(2).did: 2.0, key(4).did: 1.25}},
    ),
    codecs={
        "out": ["int8:block=5", "topk:k=3,chunk=8,values=2bit", None, "fp16", "bf16"],
        "mid": ["topk:k=4,chunk=9", "int8:block=7", "topk:k=2,chunk=4,values=int8,index=16",
                None, "bf16"],
        "emb": ["fp16", None, "topk:k=1,chunk=5,values=2bit"],
    },
)  # fmt: skip
#: Two steps of 720 KB each: the model-level document is two leaves, its steps one each.
LARGE_STEPS = Model(
    shapes={"a.w": (180_000,), "b.w": (180_000,), "b.bias": (3,)},
    steps=({"name": "b", "tensors": ["b.*"]}, {"name": "a", "tensors": ["a.w"]}),
)
STEPPED: dict[str, tuple[Model, dict[str, str]]] = {
    "three-steps": (DEFAULT, {}),
    "methods-dtypes-clipping": (METHODS, {}),
    "a-failed-step": (DEFAULT, {"mid": "quorum not met"}),
    "failed-first-step": (METHODS, {"out": "non-finite aggregate"}),
    "compressed-inputs": (COMPRESSED, {}),
    "compressed-inputs-failed-step": (COMPRESSED, {"out": "quorum not met"}),
}


async def gradstore_check(node: LocalNode, cid: object) -> str:
    """gradstore's own audit of a round: the check that fails, or "ok"."""
    try:
        await verify_round(node, cid, coordinator=COORDINATOR.did)  # type: ignore[arg-type]
    except AuditError as exc:
        return exc.check
    return "ok"


def reference_check(path: Path, cid: object) -> str:
    """The reference's audit of a round: the check that fails, or "ok"."""
    try:
        ref.audit_round(getter(path), str(cid))
    except ref.SpecAuditError as exc:
        return exc.check
    return "ok"


def both_checks(path: Path, cid: object) -> tuple[str, str]:
    """(the reference's, gradstore's) audit of a round on the node at ``path``."""
    return reference_check(path, cid), asyncio.run(gradstore_check(LocalNode(path), cid))


def audited_stepped(path: Path, done: Stepped) -> ref.SteppedAudit:
    """The reference's audit of a stepped round: it must name the record's own outputs."""
    result = ref.audit_round(getter(path), str(done.record_cid))
    assert isinstance(result, ref.SteppedAudit)
    assert ref.cid_text(result.output) == str(done.record.output.to_v1())
    for name, step in done.steps.items():
        assert ref.cid_text(result.steps[name].output) == str(step.record.output.to_v1())
    return result


@pytest.mark.parametrize("name", sorted(STEPPED))
def test_the_reference_rederives_honest_stepped_rounds(tmp_path: Path, name: str) -> None:
    model, failed = STEPPED[name]
    done = asyncio.run(stepped_round(LocalNode(tmp_path), model=model, failed=failed))
    assert done.record.type == "gradstore/round/5"
    result = audited_stepped(tmp_path, done)
    order = [s["name"] for s in model.steps]
    assert list(result.steps) == [n for n in order if n not in failed]
    assert result.failed == failed
    assert result.model_meta["steps"] == list(result.steps)
    gone = [step_config(done.config, f) for f in failed]
    closed = [t for t in model.shapes if not any(step.covers(t) for step in gone)]
    assert result.model_tensors == sorted(closed, key=lambda t: t.encode("utf-8"))
    assert {r.record["method"] for r in result.steps.values()} == {
        done.steps[n].record.method for n in result.steps
    }
    assert both_checks(tmp_path, done.record_cid)[1] == "ok"


def test_the_reference_rederives_a_model_document_of_several_blocks(tmp_path: Path) -> None:
    done = asyncio.run(stepped_round(LocalNode(tmp_path), model=LARGE_STEPS))
    assert done.record.output.codec == DAG_PB  # two leaves under a node
    assert all(s.record.output.codec != DAG_PB for s in done.steps.values())  # one leaf each
    result = audited_stepped(tmp_path, done)
    assert result.model_tensors == ["a.w", "b.bias", "b.w"]


# Forged stepped rounds: each is honest but for one thing, which the reference (and
# gradstore's own audit) must name.


async def _parts(
    node: LocalNode, outputs: list[CID]
) -> list[tuple[str, str, tuple[int, ...], bytes]]:
    """The tensors of the steps' aggregates (one block each), in the steps' order."""
    parts = []
    for cid in outputs:
        assert cid.codec == RAW
        doc = ref.decode_document(await node.get_block(cid))
        parts += [(t.name, t.dtype, t.shape, bytes(t.data)) for t in doc.tensors]
    return parts


async def _forged_model(node: LocalNode, honest: Stepped, how: str) -> CID:
    closed = [e for e in honest.record.steps if e.output is not None]
    outputs = [e.output for e in closed if e.output is not None]
    meta = model_meta(JOB, 0, [e.step for e in closed], outputs, run=RUN)
    if how == "steps-sorted":  # the closed steps sorted by name, not in the record's order
        pairs = sorted(zip(meta["steps"], meta["outputs"], strict=True))
        meta = {**meta, "steps": [s for s, _ in pairs], "outputs": [o for _, o in pairs]}
    elif how == "failed-step-named":
        meta = {**meta, "steps": [e.step for e in honest.record.steps]}
    elif how == "kind-aggregate":
        meta = {**meta, "kind": "aggregate"}
    else:  # the steps' tensors one step after the other, not sorted by name
        data = ref.write_document(meta, await _parts(node, outputs))
        return await node.put_block(data, RAW)
    return await put_model(GradientStore(node), outputs, meta)


async def _no_step_announcement(node: LocalNode, honest: Stepped) -> list[tuple[str, Any]]:
    """Step mid's first input signed as a job without steps signs it: no ``step`` pair."""
    mid = honest.steps["mid"].record
    first = mid.inputs[0]
    signer = next(k for k in PEERS if k.did == first.peer)
    ann = Announce(JOB, RUN, 0, first.peer, str(first.gradient), first.num_samples, 5)
    sig = announcement_signature(encode_message(ann, signer))[1]
    moved = dataclasses.replace(first, sent_at=5, peer_sig=sig)
    forged = resigned(mid, inputs=(moved, *mid.inputs[1:]))
    return replace_step(honest, "mid", await sign_step(node, forged))


async def _other_steps_announcement(node: LocalNode, honest: Stepped) -> list[tuple[str, Any]]:
    mid = honest.steps["mid"].record
    first = mid.inputs[0]
    signer = next(k for k in PEERS if k.did == first.peer)
    sent_at, sig = announcement(signer, first.gradient, first.num_samples, 0, "head")
    moved = dataclasses.replace(first, sent_at=sent_at, peer_sig=sig)
    forged = resigned(mid, inputs=(moved, *mid.inputs[1:]))
    return replace_step(honest, "mid", await sign_step(node, forged))


async def _aggregate_without_step(node: LocalNode, honest: Stepped) -> list[tuple[str, Any]]:
    """Step mid's aggregate written with a round's meta (no ``step``), its record naming it."""
    mid = honest.steps["mid"].record
    store = GradientStore(node)
    real = await store.get(mid.output)
    meta = {k: v for k, v in real.meta.items() if k != "step"}
    output = await store.put(Gradient(real.tensors, meta))
    return replace_step(honest, "mid", await sign_step(node, resigned(mid, output=output)))


async def _other_steps_inputs(node: LocalNode, honest: Stepped) -> list[tuple[str, Any]]:
    """Step mid over documents of head's tensors; head said to have failed."""
    mid = step_config(honest.config, "mid")
    wrong = await peer_documents(node, mid, 0, 99, names=["fc.bias", "fc.weight"])
    steps = replace_step(
        honest, "mid", await sign_step(node, await close_step(node, mid, 0, wrong))
    )
    steps[0] = ("head", "quorum not met")
    return steps


async def _tensor_in_two_steps(node: LocalNode, honest: Stepped) -> list[tuple[str, Any]]:
    mid = step_config(honest.config, "mid")
    wider = dataclasses.replace(mid, tensors=(*mid.tensors, Selector("fc.bias")))
    docs = await peer_documents(node, wider, 0, 98, names=["fc.bias", "layer.bias", "layer.weight"])
    return replace_step(
        honest, "mid", await sign_step(node, await close_step(node, wider, 0, docs))
    )


FORGED_STEPS = {
    "announcement-without-step": (_no_step_announcement, "input-signature"),
    "announced-for-another-step": (_other_steps_announcement, "input-signature"),
    "aggregate-meta-without-step": (_aggregate_without_step, "output-cid"),
    "inputs-of-another-step": (_other_steps_inputs, "step-tensors"),
    "tensor-in-two-steps": (_tensor_in_two_steps, "step-tensors"),
}


@pytest.mark.parametrize(
    "how", ["steps-sorted", "failed-step-named", "kind-aggregate", "tensors-in-step-order"]
)
def test_a_forged_model_level_document_fails_model_output(tmp_path: Path, how: str) -> None:
    async def main() -> CID:
        node = LocalNode(tmp_path)
        honest = await stepped_round(node, failed={"mid": "quorum not met"})
        forged = dataclasses.replace(honest.record, output=await _forged_model(node, honest, how))
        return await sign_round(node, forged)

    assert both_checks(tmp_path, asyncio.run(main())) == ("model-output", "model-output")


@pytest.mark.parametrize("how", sorted(FORGED_STEPS))
def test_a_forged_step_fails_the_reference(tmp_path: Path, how: str) -> None:
    """Each forgery is signed by the coordinator, its model-level output assembled from the
    steps it names (or the honest one where they cannot be assembled)."""
    build, check = FORGED_STEPS[how]

    async def main() -> CID:
        node = LocalNode(tmp_path)
        honest = await stepped_round(node)
        steps = await build(node, honest)
        model = honest.record.output if how == "tensor-in-two-steps" else None
        cid, _ = await publish_round(node, 0, steps, model=model)
        return cid

    assert both_checks(tmp_path, asyncio.run(main())) == (check, check)


def test_a_step_record_of_another_round_fails_step_link(tmp_path: Path) -> None:
    async def main() -> tuple[CID, CID]:
        node = LocalNode(tmp_path)
        first = await stepped_round(node, round_=0)
        second = await stepped_round(node, round_=1, prev=first.record_cid, seed=21)
        steps = replace_step(second, "head", first.steps["head"])  # itself honest
        cid, _ = await publish_round(node, 1, steps, prev=first.record_cid)
        return second.record_cid, cid

    honest, forged = asyncio.run(main())
    assert both_checks(tmp_path, honest) == ("ok", "ok")
    assert both_checks(tmp_path, forged) == ("step-link", "step-link")


def _in_step_order(
    meta: dict[str, Any], parts: list[tuple[str, str, tuple[int, ...], bytes]]
) -> bytes:
    return ref.write_document(meta, parts)


def _with_failed_steps(node: dict[str, Any], closed: list[str], outputs: list[str]) -> Any:
    return {
        **ORIGINAL_MODEL_META(node, closed, outputs),
        "steps": [e["step"] for e in node["steps"]],
    }


ORIGINAL_MODEL_META = ref.model_meta
ORIGINAL_ANNOUNCEMENT = ref.announcement_bytes
ORIGINAL_AGGREGATE_META = ref.aggregate_meta
#: A reference that reads section 9 otherwise than it says (the attribute it replaces, by
#: what), and the check an honest round then fails: what makes these tests honest.
MISREADINGS: dict[str, tuple[str, Any, str]] = {
    "model-tensors-in-step-order": ("model_document", _in_step_order, "model-output"),
    "model-meta-names-failed-steps": ("model_meta", _with_failed_steps, "model-output"),
    "model-meta-without-outputs": (
        "model_meta",
        lambda node, closed, outputs: {
            k: v for k, v in ORIGINAL_MODEL_META(node, closed, outputs).items() if k != "outputs"
        },
        "model-output",
    ),
    "announcement-without-step": (
        "announcement_bytes",
        lambda *args: ORIGINAL_ANNOUNCEMENT(*args[:7]),
        "input-signature",
    ),
    "aggregate-meta-without-step": (
        "aggregate_meta",
        lambda record: {k: v for k, v in ORIGINAL_AGGREGATE_META(record).items() if k != "step"},
        "output-cid",
    ),
}


@pytest.mark.parametrize("misreading", sorted(MISREADINGS))
def test_a_reference_that_misreads_section_9_fails_an_honest_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, misreading: str
) -> None:
    attribute, replacement, check = MISREADINGS[misreading]
    done = asyncio.run(stepped_round(LocalNode(tmp_path), failed={"mid": "quorum not met"}))
    assert reference_check(tmp_path, done.record_cid) == "ok"
    monkeypatch.setattr(ref, attribute, replacement)
    assert reference_check(tmp_path, done.record_cid) == check


def test_the_reference_imports_the_standard_library_only() -> None:
    """It is a stranger's auditor: nothing of gradstore, NumPy or multiformats."""
    tree = ast.parse(Path(ref.__file__).read_text("utf-8"))
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}  # fmt: skip
    names |= {n.module.split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and n.module}  # fmt: skip
    assert names and names <= set(sys.stdlib_module_names) | {"__future__"}, names


# Stepped rounds whose inputs are compressed: forged outputs and records, and a reference
# that decompresses otherwise than section 2.3 says.


async def _before_compression(node: LocalNode, honest: Stepped) -> StepDone:
    """Step mid's output aggregated from the peers' values before they compressed them (what
    a coordinator that trusted a side channel would publish), its meta the honest one."""
    mid = step_config(honest.config, "mid")
    record = honest.steps["mid"].record
    dense = await peer_documents(  # step mid's peers' values, drawn again, not compressed
        node, mid, 0, SEED + 1, model=dataclasses.replace(COMPRESSED, codecs={})
    )
    store = GradientStore(node)
    ordered = sorted(dense, key=lambda d: d[0].did)
    docs = [await store.get(cid) for _, cid, _ in ordered]
    params = mid.params_for([k.did for k, _, _ in ordered])
    tensors = aggregate([d.tensors for d in docs], params, [n for _, _, n in ordered])
    honest_output = await store.get(record.output)
    assert any(  # the codecs are lossy here: the forged output differs
        tensors[n].tobytes() != honest_output.tensors[n].tobytes() for n in tensors
    )
    output = await store.put(Gradient(tensors, honest_output.meta))
    return await sign_step(node, resigned(record, output=output))


async def _codec_named(node: LocalNode, honest: Stepped, spec: str | None) -> StepDone:
    """Step mid's record naming ``spec`` (None: dense) for its first compressed input."""
    record = honest.steps["mid"].record
    at = next(i for i, item in enumerate(record.inputs) if item.codec is not None)
    moved = dataclasses.replace(record.inputs[at], codec=None if spec is None else parse_spec(spec))
    inputs = (*record.inputs[:at], moved, *record.inputs[at + 1 :])
    return await sign_step(node, resigned(record, inputs=inputs))


FORGED_COMPRESSED = {
    "aggregated-before-compression": (_before_compression, "output-cid"),
    "codec-parameters-changed": (
        lambda node, honest: _codec_named(node, honest, "topk:k=4,chunk=10"),
        "input-codec",
    ),
    "compressed-input-named-dense": (
        lambda node, honest: _codec_named(node, honest, None),
        "input-codec",
    ),
}


@pytest.mark.parametrize("how", sorted(FORGED_COMPRESSED))
def test_a_forged_step_over_compressed_inputs_fails_the_reference(tmp_path: Path, how: str) -> None:
    """Step mid's record, re-signed with its output or an input's codec forged, in a round/5
    record whose model-level output is assembled from the steps it names."""
    build, check = FORGED_COMPRESSED[how]

    async def main() -> tuple[CID, CID]:
        node = LocalNode(tmp_path)
        honest = await stepped_round(node, model=COMPRESSED)
        forged = await build(node, honest)
        cid, _ = await publish_round(node, 0, replace_step(honest, "mid", forged))
        return honest.record_cid, cid

    honest, forged = asyncio.run(main())
    assert both_checks(tmp_path, honest) == ("ok", "ok")
    assert both_checks(tmp_path, forged) == (check, check)


ORIGINAL_DECOMPRESS = ref.decompress


def _through_float32(codec: dict[str, Any], payload: memoryview, count: int) -> list[float]:
    """Decompressed values rounded to float32 (not kept in binary64, section 2.3)."""
    return [ref.round_to("<f4", v) for v in ORIGINAL_DECOMPRESS(codec, payload, count)]


def _int8_scale_per_tensor(codec: dict[str, Any], payload: memoryview, count: int) -> list[float]:
    """int8 read with every block taking the first block's scale."""
    values = ORIGINAL_DECOMPRESS(codec, payload, count)
    if codec["name"] != "int8" or not values:
        return values
    block = codec["block"]
    first = ref._f32(payload[:4])
    out = []
    for start in range(0, count, block):
        at = start // block * (4 + block)
        scale = ref._f32(payload[at : at + 4])
        out += [v / scale * first if scale else v for v in values[start : start + block]]
    return out


@pytest.mark.parametrize(
    ("misreading", "replacement"),
    [("through-float32", _through_float32), ("int8-first-scale", _int8_scale_per_tensor)],
)
def test_a_reference_that_misreads_compressed_step_inputs_fails_an_honest_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, misreading: str, replacement: Any
) -> None:
    """The compressed steps are re-derived from their decompressed values: a reference that
    reads section 2.3 otherwise fails the honest round."""
    done = asyncio.run(stepped_round(LocalNode(tmp_path), model=COMPRESSED))
    assert reference_check(tmp_path, done.record_cid) == "ok"
    monkeypatch.setattr(ref, "decompress", replacement)
    assert reference_check(tmp_path, done.record_cid) == "output-cid"


ORIGINAL_READ_FILE = ref.read_file


def _first_leaf_only(get_block: ref.GetBlock, root: bytes, check: str) -> bytes:
    """A file DAG read as its first leaf only (the document when it is one block)."""
    block = ref.fetch_block(get_block, root, check)
    if ref.cid_parts(root)[1] == ref.RAW:
        return block
    length, pos = ref.read_varint(block, 1)
    cid_len, at = ref.read_varint(block[pos : pos + length], 1)
    return ORIGINAL_READ_FILE(get_block, block[pos + at : pos + at + cid_len], check)


def _each_block_once() -> Callable[[ref.GetBlock, bytes, str], bytes]:
    """A reader that walks every DAG with one set of blocks already read (as a CAR export
    writes each block once): a block a second document links again reads as nothing."""
    seen: set[bytes] = set()

    def read(get_block: ref.GetBlock, root: bytes, check: str) -> bytes:
        if root in seen:
            return b""
        seen.add(root)
        return ORIGINAL_READ_FILE(get_block, root, check)

    return read


@pytest.mark.parametrize(
    ("misreading", "check"),
    [("first-leaf-only", "input-decode"), ("each-block-once", "model-output")],
)
def test_a_reference_that_misreads_documents_of_several_blocks_fails_steps_multiblock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, misreading: str, check: str
) -> None:
    """The multi-block stepped vector's documents are read leaf by leaf, depth first, each
    leaf as often as it is linked: its step aggregate links the all-zero leaf its dense input
    links too."""
    vector = next(v for v in VECTOR_LIST if v["name"] == "steps-multiblock")
    node = LocalNode(tmp_path)
    asyncio.run(node.import_car([(VECTORS / vector["car"]).read_bytes()]))
    assert reference_check(tmp_path, vector["record"]) == "ok"
    reader = _first_leaf_only if misreading == "first-leaf-only" else _each_block_once()
    monkeypatch.setattr(ref, "read_file", reader)
    assert reference_check(tmp_path, vector["record"]) == check
