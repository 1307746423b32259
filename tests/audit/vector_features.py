"""What a conformance vector covers, derived from its blocks rather than from anyone's word.

``scripts/make_vectors.py`` writes :func:`describe`'s answer into tests/vectors/vectors.json;
tests/audit/test_vectors.py derives it again from each CAR and checks that the two agree and
that the vectors together cover every method, dtype, codec and record version. A stepped
round (round/5) is described step record by step record (each as a round/4 record is) and
by its model-level document.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from gradstore.aggregate import (
    AggregationInfo,
    AggregationParams,
    InMemory,
    Layout,
    NormSum,
    aggregate_streamed,
    compressed_source,
)
from gradstore.audit import fetch_any_record, fetch_step_record
from gradstore.audit._checks import output_meta, record_params
from gradstore.dag import CID, RAW, file_cid
from gradstore.format import CompressedGradient, Gradient, dtype_code, encode
from gradstore.messages import RoundRecord, SteppedRoundRecord, StepRecord
from gradstore.node import Node
from gradstore.store import GradientStore

#: Krum ranks scores at this many significant digits (docs/audit.md): a tie is a tie there.
RANK_DIGITS: Final = 9

#: Output tensors this small are written out in vectors.json as hex, not only hashed.
HEX_ELEMENTS: Final = 32


def _rank(score: float) -> float:
    return float(f"{score:.{RANK_DIGITS - 1}e}")


def _codec(doc: Gradient | CompressedGradient) -> dict[str, Any] | None:
    return dict(doc.codec.fields()) if isinstance(doc, CompressedGradient) else None


def _dtypes(doc: Gradient | CompressedGradient) -> list[str]:
    if isinstance(doc, CompressedGradient):
        return [t.dtype_code for t in doc.tensors.values()]
    return [str(dtype_code(a.dtype)) for a in doc.tensors.values()]


def _float64(doc: Gradient | CompressedGradient) -> dict[str, np.ndarray[Any, Any]]:
    dense = doc.decompress() if isinstance(doc, CompressedGradient) else doc
    return {name: np.asarray(a, np.float64) for name, a in dense.tensors.items()}


def _zeros(inputs: Sequence[dict[str, np.ndarray[Any, Any]]]) -> dict[str, Any]:
    """Signed zeros among the inputs: any -0.0, all -0.0, coordinates holding both zeros."""
    all_negative, any_negative = True, False
    mixed = 0
    for name in inputs[0]:
        stack = np.stack([np.ravel(x[name]) for x in inputs])
        neg = (stack == 0) & np.signbit(stack)
        pos = (stack == 0) & ~np.signbit(stack)
        any_negative |= bool(neg.any())
        all_negative &= bool(neg.all())
        mixed += int((neg.any(axis=0) & pos.any(axis=0) & (stack == 0).all(axis=0)).sum())
    return {
        "negative_zero_inputs": any_negative,
        "all_negative_zero": all_negative and any_negative,
        "mixed_zero_coordinates": mixed,
    }


def _tensor_facts(output: Gradient) -> list[dict[str, Any]]:
    """Each output tensor: name, document dtype, shape, SHA-256 of its little-endian bytes
    (and the bytes as hex when small), so a mismatch can be told from an encoding error."""
    facts = []
    for name in sorted(output.tensors, key=lambda n: n.encode("utf-8")):
        array = np.ascontiguousarray(output.tensors[name])
        raw = _bytes(array)
        fact: dict[str, Any] = {
            "name": name,
            "dtype": str(dtype_code(array.dtype)),
            "shape": list(array.shape),
            "sha256": hashlib.sha256(raw).hexdigest(),
        }
        if array.size <= HEX_ELEMENTS:
            fact["hex"] = raw.hex()
        fact["negative_zeros"] = int(
            np.count_nonzero((np.asarray(array, np.float64) == 0) & np.signbit(array))
        )
        facts.append(fact)
    return facts


async def _aggregate(
    record: RoundRecord | StepRecord,
    docs: Sequence[Gradient | CompressedGradient],
    norm_sum: NormSum,
) -> tuple[dict[str, np.ndarray[Any, Any]], AggregationInfo]:
    """The record's aggregation over ``docs`` as the coordinator runs it, with ``norm_sum``."""
    params = AggregationParams.from_record(record.method, record.params, norm_sum)
    sources = [
        compressed_source(d) if isinstance(d, CompressedGradient) else InMemory(d.tensors)
        for d in docs
    ]
    first = docs[0]
    layout = Layout.of((name, t.dtype, t.shape) for name, t in first.tensors.items())
    return await aggregate_streamed(sources, layout, params, [i.num_samples for i in record.inputs])


def _selection(info: AggregationInfo) -> dict[str, Any] | None:
    """Krum's scores (as ranked), its selection, and whether the last pick was a tie."""
    if info.scores is None or info.selected is None:
        return None
    ranked = sorted(_rank(s) for s in info.scores)
    m = len(info.selected)
    return {
        "scores": [_rank(s) for s in info.scores],
        "selected": list(info.selected),
        "boundary_tie": m < len(ranked) and ranked[m - 1] == ranked[m],
    }


async def _clipping(
    record: RoundRecord | StepRecord,
    docs: Sequence[Gradient | CompressedGradient],
    info: AggregationInfo,
    tensors: dict[str, np.ndarray[Any, Any]],
) -> dict[str, Any]:
    """The bounds, how many inputs (and whether the output) they clipped, and whether the
    other version's norm summation would have given other output bits."""
    params = record_params(record)
    out: dict[str, Any] = {}
    if params.clip_input_norm is not None:
        assert info.input_scales is not None
        other: NormSum = "blocked-pairwise" if params.norm_sum == "sequential" else "sequential"
        changed, _ = await _aggregate(record, docs, other)
        out["input"] = {
            "bound": params.clip_input_norm,
            "clipped_inputs": sum(1 for s in info.input_scales if s < 1.0),
            "norm_sum": params.norm_sum,
            "norm_sum_changes_output": any(
                _bytes(changed[name]) != _bytes(tensors[name]) for name in tensors
            ),
        }
    if params.clip_output_norm is not None:
        assert info.output_scale is not None
        out["output"] = {"bound": params.clip_output_norm, "clipped": info.output_scale < 1.0}
    return out


def _bytes(array: np.ndarray[Any, Any]) -> bytes:
    return np.ascontiguousarray(array).view(np.uint8).tobytes() if array.size else b""


async def describe(node: Node, record_cid: CID) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(covers, output_tensors)`` of the round at ``record_cid``, from its blocks on ``node``
    (of a stepped round: its steps' covers and its model-level document's tensors)."""
    _, record = await fetch_any_record(node, record_cid)
    if isinstance(record, SteppedRoundRecord):
        return await _describe_stepped(node, record)
    return await describe_aggregation(node, record)


async def step_outputs(node: Node, record_cid: CID) -> dict[str, list[dict[str, Any]]]:
    """Each closed step's ``output_tensors`` (its aggregate's), by step, of a round/5 record."""
    _, record = await fetch_any_record(node, record_cid)
    assert isinstance(record, SteppedRoundRecord)
    store = GradientStore(node)
    return {
        entry.step: _tensor_facts(await store.get(entry.output))
        for entry in record.steps
        if entry.output is not None
    }


async def _describe_stepped(
    node: Node, record: SteppedRoundRecord
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    steps: list[dict[str, Any]] = []
    for entry in record.steps:
        if entry.record is None:
            steps.append({"step": entry.step, "failed": entry.failed})
            continue
        _, step = await fetch_step_record(node, entry.record, entry.step)
        step_covers, _ = await describe_aggregation(node, step)
        steps.append({"step": entry.step, "selectors": list(step.tensors), **step_covers})
    model = await GradientStore(node).get(record.output)
    closed = [s for s in steps if "failed" not in s]
    covers: dict[str, Any] = {
        "record_type": record.type,
        "steps": steps,
        "methods": sorted({s["method"] for s in closed}),
        "failed_steps": len(steps) - len(closed),
        "model": {
            "tensors": len(model.tensors),
            "dtypes": sorted({str(dtype_code(a.dtype)) for a in model.tensors.values()}),
            "multi_block": record.output.codec != RAW,
        },
        "prev": None if record.prev is None else str(record.prev),
    }
    covers["tags"] = stepped_tags(covers)
    return covers, _tensor_facts(model)


async def describe_aggregation(
    node: Node, record: RoundRecord | StepRecord
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(covers, output_tensors)`` of one aggregation: a round/2-4 record or a step record."""
    store = GradientStore(node)
    docs = [await store.get_any(i.gradient) for i in record.inputs]
    output = await store.get(record.output)
    inputs = [_float64(d) for d in docs]
    tensors, info = await _aggregate(record, docs, record_params(record).norm_sum)
    if file_cid(encode(Gradient(tensors, output_meta(record)))) != record.output.to_v1():
        raise ValueError(f"{record.output}: the aggregation here does not give the record's output")
    codecs = [_codec(d) for d in docs]
    specs = {repr(sorted(c.items())): c for c in codecs if c is not None}
    shapes = [np.shape(a) for a in inputs[0].values()]
    multi_inputs = sum(1 for i in record.inputs if i.gradient.codec != RAW)
    covers: dict[str, Any] = {
        "record_type": record.type,
        "method": record.method,
        "params": record.params,
        "inputs": len(record.inputs),
        "count": "even" if len(record.inputs) % 2 == 0 else "odd",
        "dtypes": sorted({d for doc in docs for d in _dtypes(doc)}),
        "codecs": sorted({"dense" if c is None else c["name"] for c in codecs}),
        "codec_params": [specs[k] for k in sorted(specs)],
        "clipping": await _clipping(record, docs, info, tensors),
        "multi_block": {"inputs": multi_inputs, "output": record.output.codec != RAW},
        "signed_zeros": _zeros(inputs),
        "selection": _selection(info),
        "excluded": len(record.excluded),
        "prev": None if isinstance(record, StepRecord) or record.prev is None else str(record.prev),
        "tensors": {
            "count": len(shapes),
            "scalar": any(s == () for s in shapes),
            "empty": any(0 in s for s in shapes),
        },
    }
    covers["tags"] = tags(covers)
    return covers, _tensor_facts(output)


def tags(covers: dict[str, Any]) -> list[str]:
    """The flat feature names of ``covers``, for the coverage test and for grepping."""
    zeros, selection = covers["signed_zeros"], covers["selection"]
    have = {
        f"{covers['count']}-count": True,
        "clip-input": "input" in covers["clipping"],
        "clip-output": "output" in covers["clipping"],
        "norm-sum-changes-output": covers["clipping"]
        .get("input", {})
        .get("norm_sum_changes_output", False),
        "compressed": covers["codecs"] != ["dense"],
        "mixed-codecs": len(covers["codecs"]) > 1,
        "mixed-dtypes": len(covers["dtypes"]) > 1,
        "negative-zero": zeros["negative_zero_inputs"],
        "all-negative-zero": zeros["all_negative_zero"],
        "mixed-signed-zeros": zeros["mixed_zero_coordinates"] > 0,
        "krum-tie": bool(selection and selection["boundary_tie"]),
        "multi-block": covers["multi_block"]["inputs"] > 0 and covers["multi_block"]["output"],
        "excluded": covers["excluded"] > 0,
        "prev": covers["prev"] is not None,
        "scalar-tensor": covers["tensors"]["scalar"],
        "empty-tensor": covers["tensors"]["empty"],
    }
    return sorted(name for name, on in have.items() if on)


def stepped_tags(covers: dict[str, Any]) -> list[str]:
    """The flat feature names of a stepped round's ``covers`` (its steps have their own)."""
    closed = [s for s in covers["steps"] if "failed" not in s]
    have = {
        "stepped": True,
        "compressed-step": any("compressed" in s["tags"] for s in closed),
        "multi-block-step": any("multi-block" in s["tags"] for s in closed),
        "failed-step": covers["failed_steps"] > 0,
        "mixed-methods": len(covers["methods"]) > 1,
        "multi-block-model": covers["model"]["multi_block"],
        "prev": covers["prev"] is not None,
    }
    return sorted(name for name, on in have.items() if on)
