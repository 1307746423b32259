"""Re-executing a stage's forward pass from the CIDs it recorded: its input activations and
its parameters give, on the same software and machine, the very document (the same CID) it
published as its output (docs/design/pipeline.md says how far that holds).

``reexecute_forward`` is the bare re-execution; ``verify_stage`` (``gradstore audit stage``)
first checks that the three documents are what they say and belong together, and names the
check that fails as an ``AuditError``."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dag import file_cid
from ..dag.cid import CID
from ..errors import (
    AuditError,
    DAGError,
    FormatError,
    IntegrityError,
    LimitExceededError,
    NodeError,
)
from ..format import Gradient, encode
from ..job import JobConfig
from ..store import GradientStore
from .layers import Array, DenseStage
from .runner import ACTIVATION, STAGE_INPUT, STAGE_PARAMS


@dataclass(frozen=True)
class ForwardAudit:
    """The published output CID, the one re-execution gives, and the largest absolute
    difference of their activations (0.0 when the CIDs agree)."""

    published: CID
    recomputed: CID
    max_abs_diff: float

    @property
    def matches(self) -> bool:
        """Whether re-execution gave the published document bit for bit."""
        return self.published == self.recomputed


async def reexecute_forward(
    store: GradientStore, layer: DenseStage, *, input_cid: CID, params_cid: CID, output_cid: CID
) -> ForwardAudit:
    """Fetch (verified) the input and parameter documents, run ``layer``'s forward pass, and
    rebuild the output document with the published one's meta: its CID must be
    ``output_cid``."""
    x = (await store.get(input_cid)).tensors[ACTIVATION]
    params = (await store.get(params_cid)).tensors
    published = await store.get(output_cid)
    return await _rerun(layer, x, params, published, output_cid)


async def _rerun(
    layer: DenseStage,
    x: Array,
    params: Mapping[str, Array],
    published: Gradient,
    output_cid: CID,
) -> ForwardAudit:
    """The forward pass and its document's CID, hashed here (nothing is stored), off the loop."""

    def run() -> tuple[Array, CID]:
        out = layer.forward(params, np.asarray(x, dtype=np.float64))
        doc = Gradient({ACTIVATION: np.ascontiguousarray(out)}, dict(published.meta))
        return out, file_cid(encode(doc))

    out, recomputed = await asyncio.to_thread(run)
    diff = float(np.max(np.abs(out - np.asarray(published.tensors[ACTIVATION])), initial=0.0))
    return ForwardAudit(output_cid, recomputed, diff)


@dataclass(frozen=True)
class StageReport:
    """What ``verify_stage`` established: the stage, replica (peer), round and micro-batch the
    output is of, the layer re-executed, and how the re-execution compared."""

    job: str
    stage: str
    peer: str
    round: int
    micro_batch: int
    layer: DenseStage
    rows: int
    audit: ForwardAudit
    first_stage: bool  # its input is the job's own rows (stage-input), not an activation


async def verify_stage(
    store: GradientStore,
    activation: str,
    *,
    output_cid: CID,
    input_cid: CID,
    params_cid: CID,
    config: JobConfig | None = None,
    tolerance: float | None = None,
) -> StageReport:
    """Check that ``output_cid`` is the forward pass (``activation``: ``tanh`` or ``none``,
    the model's code, which no document holds) of the stage's parameters ``params_cid`` over
    ``input_cid``; with ``config``, also that they are that job's stage, peer and tensors.

    Checks, in order: ``{output,input,params}-fetch|blocks|decode``; ``output-schema`` (one
    float64 ``activation`` of rows x columns, meta of kind ``activation`` naming its job,
    round, micro-batch, stage and peer); ``input-schema``; ``params-schema`` (exactly one
    layer's ``.weight`` and ``.bias``); ``input-meta`` and ``params-meta`` (the same job,
    round, micro-batch, and stage and peer, as the output's: docs/spec.md, section 11.1);
    ``stage-shapes``; with ``config``: ``expected-job``, ``stage-peer`` (the peer holds the
    stage; the input comes from the same lane of the stage before), ``params-tensors`` (the
    stage's selectors take the parameters); last ``output-cid``: the re-executed document's
    CID is the published one (or, with ``tolerance``, its activations are within it).
    """
    if activation not in ("tanh", "none"):
        raise ValueError(f"activation {activation!r}: tanh or none")
    published = await _fetch(store, output_cid, "output")
    x_doc = await _fetch(store, input_cid, "input")
    p_doc = await _fetch(store, params_cid, "params")
    out = _one_activation(published, "output", output_cid)
    meta = _output_meta(published.meta, output_cid)
    x = _one_activation(x_doc, "input", input_cid)
    layer = _layer(p_doc, params_cid, activation)
    first = _input_meta(x_doc.meta, meta, input_cid)
    _params_meta(p_doc.meta, meta, params_cid)
    w = p_doc.tensors[layer.names()[0]]
    if x.shape[1] != w.shape[1] or out.shape != (x.shape[0], w.shape[0]):
        raise AuditError(
            "stage-shapes",
            f"{x.shape[0]} x {x.shape[1]} input rows through a {w.shape[0]} x {w.shape[1]} "
            f"weight cannot give the {out.shape[0]} x {out.shape[1]} output {output_cid}",
        )
    if config is not None:
        _pinned(config, meta, x_doc.meta, p_doc, first)
    audit = await _rerun(layer, x, p_doc.tensors, published, output_cid)
    if not audit.matches and (tolerance is None or not audit.max_abs_diff <= tolerance):
        within = "" if tolerance is None else f" (tolerance {tolerance:g})"
        raise AuditError(
            "output-cid",
            f"re-executing {layer.layer} ({activation}) over input {input_cid} with parameters "
            f"{params_cid} gives {audit.recomputed}, not the published {output_cid}: the "
            f"activations differ by up to {audit.max_abs_diff:.3g}{within}",
        )
    return StageReport(
        meta["job"], meta["stage"], meta["peer"], meta["round"], meta["micro_batch"], layer,
        x.shape[0], audit, first,
    )  # fmt: skip


async def _fetch(store: GradientStore, cid: CID, what: str) -> Gradient:
    """``cid`` fetched (every block hash-checked) and strictly decoded as a dense document."""
    try:
        got = await store.get_any(cid)
    except IntegrityError as exc:
        raise AuditError(f"{what}-blocks", f"{what} {cid}: {exc}") from exc
    except (DAGError, LimitExceededError) as exc:
        raise AuditError(
            f"{what}-blocks", f"{what} {cid} is not a valid UnixFS file: {exc}"
        ) from exc
    except NodeError as exc:
        raise AuditError(f"{what}-fetch", f"cannot fetch {what} {cid}: {exc}") from exc
    except FormatError as exc:
        raise AuditError(f"{what}-decode", f"{what} {cid} is not a valid document: {exc}") from exc
    if not isinstance(got, Gradient):
        raise AuditError(f"{what}-decode", f"{what} {cid} is compressed: a stage stores dense")
    return got


def _one_activation(doc: Gradient, what: str, cid: CID) -> Array:
    value = doc.tensors.get(ACTIVATION)
    if value is None or len(doc.tensors) != 1 or value.dtype != np.float64 or value.ndim != 2:
        raise AuditError(
            f"{what}-schema",
            f"{what} {cid} is not one {ACTIVATION!r} float64 tensor of rows x columns",
        )
    return np.asarray(value)


_BINDING = ("job", "round", "micro_batch", "stage", "peer")


def _output_meta(meta: Mapping[str, Any], cid: CID) -> dict[str, Any]:
    """The output's meta (docs/spec.md, section 11.1), checked for its fields' types."""
    types = {"job": str, "round": int, "micro_batch": int, "stage": str, "peer": str}
    if meta.get("kind") != "activation" or any(
        not isinstance(meta.get(k), t) or isinstance(meta.get(k), bool) for k, t in types.items()
    ):
        raise AuditError(
            "output-schema",
            f"output {cid}'s meta is not an activation's (kind 'activation', job, round, "
            f"micro_batch, stage, peer): {dict(meta)!r:.200}",
        )
    return {k: meta[k] for k in _BINDING}


def _input_meta(meta: Mapping[str, Any], out: Mapping[str, Any], cid: CID) -> bool:
    """Whether the input is the first stage's own rows (else the stage before's output);
    ``input-meta`` when it is not of the output's job, round and micro-batch (and, its own
    rows, stage and peer)."""
    first = meta.get("kind") == STAGE_INPUT
    same = ("job", "round", "micro_batch") + (("stage", "peer") if first else ())
    if (not first and meta.get("kind") != "activation") or any(meta.get(k) != out[k] for k in same):
        raise AuditError(
            "input-meta",
            f"input {cid} is not {out['stage']!r}'s input of micro-batch {out['micro_batch']} "
            f"of round {out['round']} of job {out['job']!r}: its meta is {dict(meta)!r:.200}",
        )
    if not first and meta.get("stage") == out["stage"]:
        raise AuditError("input-meta", f"input {cid} is stage {out['stage']!r}'s own output")
    return first


def _params_meta(meta: Mapping[str, Any], out: Mapping[str, Any], cid: CID) -> None:
    keys = ("job", "round", "stage", "peer")
    if meta.get("kind") != STAGE_PARAMS or any(meta.get(k) != out[k] for k in keys):
        raise AuditError(
            "params-meta",
            f"parameters {cid} are not stage {out['stage']!r}'s of peer {out['peer']} in round "
            f"{out['round']} of job {out['job']!r}: their meta is {dict(meta)!r:.200}",
        )


def _layer(doc: Gradient, cid: CID, activation: str) -> DenseStage:
    """The dense layer the parameter document holds: exactly ``L.weight`` (2-D) and
    ``L.bias`` (its rows), float64."""
    names = sorted(doc.tensors)
    w = names[-1] if names else ""
    layer = w.removesuffix(".weight")
    if len(names) != 2 or names != [f"{layer}.bias", f"{layer}.weight"] or not layer:
        raise AuditError(
            "params-schema",
            f"parameters {cid} are not one dense layer's .weight and .bias: {names[:4]}",
        )
    weight, bias = doc.tensors[w], doc.tensors[f"{layer}.bias"]
    if (
        weight.dtype != np.float64
        or bias.dtype != np.float64
        or weight.ndim != 2
        or bias.shape != (weight.shape[0],)
    ):
        raise AuditError(
            "params-schema",
            f"parameters {cid}: {layer}.weight {weight.dtype} {weight.shape} and {layer}.bias "
            f"{bias.dtype} {bias.shape} are not a float64 weight and its bias",
        )
    return DenseStage(layer, "tanh" if activation == "tanh" else "none")


def _pinned(
    config: JobConfig,
    out: Mapping[str, Any],
    x_meta: Mapping[str, Any],
    params: Gradient,
    first: bool,
) -> None:
    """The checks against the job file: its name, the stage's replicas and tensors."""
    if out["job"] != config.job:
        raise AuditError("expected-job", f"the output is of job {out['job']!r}, not {config.job!r}")
    pipe = config.pipeline
    if pipe is None:
        raise AuditError("expected-job", f"job {config.job!r} has no [[stages]]")
    place = pipe.place(out["peer"])
    if place is None or pipe.stages[place[0]].name != out["stage"]:
        raise AuditError(
            "stage-peer", f"{out['peer']} is not a replica of stage {out['stage']!r} in the job"
        )
    at, lane = place
    if first != (at == 0) or (
        not first
        and (x_meta.get("stage"), x_meta.get("peer"))
        != (pipe.stages[at - 1].name, pipe.stages[at - 1].replicas[lane])
    ):
        source = "its own rows" if at == 0 else f"lane {lane} of stage {pipe.stages[at - 1].name!r}"
        raise AuditError(
            "stage-peer",
            f"stage {out['stage']!r} replica {lane} takes its input from {source}, not from "
            f"{x_meta.get('stage')!r} {x_meta.get('peer')}",
        )
    step = next(s for s in config.steps if s.name == out["stage"])
    stray = [n for n in params.tensors if not any(sel.matches(n) for sel in step.tensors)]
    if stray:
        raise AuditError(
            "params-tensors",
            f"stage {out['stage']!r} takes {', '.join(map(str, step.tensors))}, not {stray}",
        )
