"""The checks a round record (round/2-4) and a step record (step/1) share.

Both state the same things about one aggregation: a method and its parameters, inputs
(peer, CID, samples, weight, codec and, in round/4 and step/1, the peer's signed word),
exclusions and an output (``messages.record_parts``). ``rederive`` re-fetches every input
with every block verified, checks what the record says of it, recomputes the aggregate
with the recorded method over the inputs in record order, checks each weight, encodes the
aggregate with the meta the coordinator writes and compares its CID with ``output``.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeAlias

from ..aggregate import AggregationParams, Layout, NormSum, OutputClip, aggregate_streamed
from ..dag import CID, file_cid
from ..errors import (
    AggregationError,
    AuditError,
    DAGError,
    IntegrityError,
    NodeError,
    TooManyInputsError,
)
from ..format import DocumentHeader, Gradient, encode
from ..messages import (
    RECORD_TYPE,
    RECORD_TYPE_CODECS,
    PartialRecord,
    RecordInput,
    RoundRecord,
    StepRecord,
    aggregate_meta,
    step_aggregate_meta,
)
from ..store import (
    ByteProgress,
    GradientStore,
    ReadAhead,
    ReadAheadPool,
    SpilledDocument,
    SpillWriter,
    StoredCompressed,
    StoredDocument,
    StoredGradient,
    fits,
    free_space,
    read_ahead,
    spilled_source,
)
from ._cid import fetch_with_header

Aggregated: TypeAlias = RoundRecord | StepRecord | PartialRecord
"""A record of one aggregation: a round's (round/2-4), a step's (step/1) or a group's
partial (partial/1, whose output ``audit._tree`` re-derives)."""

OnInput: TypeAlias = Callable[[RecordInput, DocumentHeader], None]
"""A further check of one input, given its document's header (a step's tensors)."""

#: What a record of each version cannot support: round/2 and round/3 carry no peer
#: signatures, so their sample counts are checked against the documents' meta only.
#: Free space an audit's spill files never take (else an input is read back from the node).
SPILL_RESERVE_BYTES: Final = 2 << 30

UNSUPPORTED: Final = {
    RECORD_TYPE: ("input-signature",),
    RECORD_TYPE_CODECS: ("input-signature",),
}


@dataclass(frozen=True)
class Rederived:
    """What ``rederive`` established: how many inputs, their tensor bytes, and the names of
    the output's tensors (in document order)."""

    inputs: int
    input_bytes: int
    tensors: tuple[str, ...]


def where(rcid: CID, record: Aggregated) -> str:
    """How messages name ``record``: ``round 3 record <cid>``, or ``step 'b' of round 3 ...``."""
    if isinstance(record, StepRecord):
        return f"step {record.step!r} of round {record.round} (step record {rcid})"
    return f"round {record.round} record {rcid}"


def signed(record: Aggregated) -> bool:
    """Whether the record's inputs carry the peers' signed announcements (round/4, step/1)."""
    return record.type not in UNSUPPORTED


def output_meta(record: Aggregated) -> dict[str, Any]:
    """The meta the coordinator writes into the aggregate of ``record`` (docs/spec.md,
    sections 6.10 and 9.4): kind, job, run, round, method, the input CIDs in record order,
    and a step's name."""
    cids = [i.gradient for i in record.inputs]
    if isinstance(record, StepRecord):
        return step_aggregate_meta(
            record.job, record.round, record.step, record.method, cids, run=record.run
        )
    return aggregate_meta(record.job, record.round, record.method, cids, run=record.run)


def record_params(record: Aggregated) -> AggregationParams:
    """The record's method and parameters, with the norm summation and output clipping its
    version states (docs/spec.md). Checks: ``params``."""
    current = signed(record)
    norm_sum: NormSum = "sequential" if current else "blocked-pairwise"
    output_clip: OutputClip = "float64" if current else "rounded"
    try:
        return AggregationParams.from_record(record.method, record.params, norm_sum, output_clip)
    except (AggregationError, TypeError) as exc:
        raise AuditError("params", f"round {record.round}: recorded parameters: {exc}") from exc


def check_input_count(rcid: CID, record: Aggregated, params: AggregationParams) -> None:
    """Refuse, before any input is fetched, a record listing more inputs than its method takes
    in bounded memory (Krum: ``MAX_KRUM_INPUTS``) or a count its method refuses.

    Anyone can sign a record, and an unpinned auditor would otherwise fetch every input
    before the method refused them. Checks: ``inputs`` (too many), ``aggregate``.
    """
    n = len(record.inputs)
    try:
        params.validate(n)
    except TooManyInputsError as exc:
        raise AuditError("inputs", f"{where(rcid, record)} lists {n} inputs: {exc}") from exc
    except AggregationError as exc:
        raise AuditError(
            "aggregate", f"round {record.round}: recomputing {record.method}: {exc}"
        ) from exc


def check_signatures(rcid: CID, record: Aggregated) -> None:
    """Each round/4 or step/1 input's ``peer_sig`` must be its peer's over (job, run, round,
    step, CID, num_samples, sent_at): the sample count is the peer's word, and in a step
    record the step too. Checks: ``input-signature``."""
    if not signed(record):
        return
    for inp in record.inputs:
        if not inp.peer_signed(record):
            raise AuditError(
                "input-signature",
                f"{where(rcid, record)}: the input of {inp.peer} ({inp.gradient}, "
                f"{inp.num_samples} samples) is not what that peer signed",
            )


def check_document_meta(
    rcid: CID, record: Aggregated, inp: RecordInput, meta: Mapping[str, Any]
) -> None:
    """An input document that states its samples (or, in round/4 and step/1, its job, run,
    round, peer or step) must agree with the record. Checks: ``input-samples``,
    ``input-meta``."""
    at = f"{where(rcid, record)}: the input of {inp.peer} ({inp.gradient})"
    stated = meta.get("num_samples")
    if stated is not None and stated != inp.num_samples:
        raise AuditError(
            "input-samples",
            f"{at} is recorded with {inp.num_samples} samples, its document says {stated!r:.40}",
        )
    if not signed(record):
        return
    bound: list[tuple[str, object]] = [
        ("job", record.job),
        ("run", record.run),
        ("round", record.round),
        ("peer", inp.peer),
    ]
    if record.step is not None:
        bound.append(("step", record.step))
    for key, value in bound:
        if key in meta and meta[key] != value:
            raise AuditError(
                "input-meta", f"{at}: its document names {key} {meta[key]!r:.80}, not {value!r}"
            )


def check_weights(rcid: CID, record: Aggregated, weights: tuple[float, ...] | None) -> None:
    """Each recorded ``weight`` must be what the method gives these inputs (bit for bit; 1.0
    for the order statistics). Checks: ``input-weight``."""
    expected = weights or tuple(1.0 for _ in record.inputs)
    for inp, want in zip(record.inputs, expected, strict=True):
        if inp.weight != want:
            raise AuditError(
                "input-weight",
                f"{where(rcid, record)}: the input of {inp.peer} is recorded with "
                f"weight {inp.weight!r}, but {record.method} over the recorded inputs gives "
                f"{want!r}",
            )


async def rederive(
    store: GradientStore,
    rcid: CID,
    record: Aggregated,
    *,
    on_input: OnInput | None = None,
    progress: ByteProgress | None = None,
    spill_dir: str | Path | None = None,
) -> Rederived:
    """Re-fetch every input of an already checked record, recompute, compare the output CID.

    Memory stays O(model), as in the coordinator: each input is fetched, verified and
    decoded on its own, then read back range by range while the aggregate is recomputed
    (``aggregate_streamed``: the same bits), as the coordinator does (docs/design/spill.md):
    from spill files of its verified bytes, written as they come (in a temporary folder of
    ``spill_dir``, default the system's), or from the node (by large ranges read ahead,
    every leaf hashed again) where a spill would not fit on the disk.
    Compressed inputs are decompressed range by range as the coordinator does; the codec
    the record names for each input must be its document's. ``on_input`` checks each input's
    header further (a step's tensors).

    Checks: ``inputs`` (a record with no input, or more than its method takes), ``params``,
    ``input-signature``, ``input-fetch``, ``input-blocks``, ``input-decode``, ``input-codec``,
    ``input-samples``, ``input-meta``, ``aggregate``, ``input-weight``, ``output-cid``.
    ``progress(done, total)`` is called as input bytes arrive and as each stage ends.
    """
    if not record.inputs:
        raise AuditError("inputs", f"{where(rcid, record)} lists no input")
    params = record_params(record)
    check_input_count(rcid, record, params)
    check_signatures(rcid, record)
    with tempfile.TemporaryDirectory(prefix="gradstore-audit-", dir=spill_dir) as spills:
        return await _rederive(store, rcid, record, params, Path(spills), on_input, progress)


async def _rederive(
    store: GradientStore,
    rcid: CID,
    record: Aggregated,
    params: AggregationParams,
    spills: Path | None,
    on_input: OnInput | None,
    progress: ByteProgress | None,
) -> Rederived:
    """``rederive``, each input's verified bytes spilled to a file of ``spills`` (if they
    fit on its disk, beside ``SPILL_RESERVE_BYTES``) and read back from there, or (None,
    no room) read back from the node through one read-ahead pool."""
    sources: list[StoredGradient | StoredCompressed] = []
    layouts = []
    nbytes = 0
    pool = ReadAheadPool()
    try:
        for index, inp in enumerate(record.inputs):
            path = None if spills is None else spills / f"{index}.doc"
            source, size, layout = await _input(
                store, rcid, record, inp, path, pool, on_input, progress
            )
            sources.append(source)
            nbytes += size
            layouts.append(layout)
        return await _recompute(rcid, record, params, sources, layouts, nbytes, progress)
    finally:
        for source in sources:
            if isinstance(source.document, SpilledDocument | ReadAhead):
                source.document.close()


async def _input(
    store: GradientStore,
    rcid: CID,
    record: Aggregated,
    inp: Any,
    path: Path | None,
    pool: ReadAheadPool,
    on_input: OnInput | None,
    progress: ByteProgress | None,
) -> tuple[StoredGradient | StoredCompressed, int, list[Any]]:
    """One input fetched (every block verified; written to its spill file at ``path`` as
    it is verified, if given and it fits), checked against the record; its source, size
    and layout."""
    what = f"input of {inp.peer}"
    spill = path is not None and _room(path.parent, store.limits.max_bytes)
    writer = SpillWriter(path) if spill and path is not None else None
    try:  # the file is closed whatever happens
        gradient, header = await fetch_with_header(
            store,
            inp.gradient,
            what,
            prefix="input-",
            progress=progress,
            sink=writer,
        )
        if inp.codec != header.codec:
            raise AuditError(
                "input-codec",
                f"{where(rcid, record)} says {what} {inp.gradient} is "
                f"{_codec_text(inp.codec)}, but the document is {_codec_text(header.codec)}",
            )
        check_document_meta(rcid, record, inp, gradient.meta)
        if on_input is not None:
            on_input(inp, header)
        size = gradient.nbytes
        layout = [(t.name, t.array_dtype, t.shape) for t in header.tensors]
        del gradient  # read back range by range: one input in memory at a time
        spilled = writer is not None and await asyncio.to_thread(writer.finish)
    finally:
        if writer is not None:
            if not writer.kept:
                writer.abandon()  # refused, or the write failed: no file, no more writes
            writer.detach()
    infos = {t.name: t for t in header.tensors}
    if spilled and path is not None:  # the bytes just verified, from the spill file
        return spilled_source(SpilledDocument(path, header.size), infos, header.codec), size, layout
    try:  # read ahead by large ranges, decompressed range by range, as the coordinator
        document = await StoredDocument.open(store.node, inp.gradient, store.limits.max_bytes)
    except NodeError as exc:
        raise AuditError("input-fetch", f"cannot read {what} {inp.gradient}: {exc}") from exc
    return spilled_source(read_ahead(document, pool), infos, header.codec), size, layout


def _room(folder: Path, max_bytes: int) -> bool:
    """Whether the largest document the store takes fits in ``folder``'s disk (a spill)."""
    return fits(max_bytes, free_space(folder), 0, SPILL_RESERVE_BYTES)


async def _recompute(
    rcid: CID,
    record: Aggregated,
    params: AggregationParams,
    sources: list[StoredGradient | StoredCompressed],
    layouts: list[list[Any]],
    nbytes: int,
    progress: ByteProgress | None,
) -> Rederived:
    """The aggregate of ``sources`` recomputed, and its CID compared with the record's."""
    if any(layout != layouts[0] for layout in layouts):
        raise AuditError(
            "aggregate",
            f"round {record.round}: recomputing {record.method}: the inputs' tensors differ",
        )
    if progress is not None:
        progress(nbytes, nbytes)
    try:
        tensors, info = await aggregate_streamed(
            sources,
            Layout.of(layouts[0]),
            params,
            [i.num_samples for i in record.inputs],
        )
    except AggregationError as exc:
        raise AuditError(
            "aggregate", f"round {record.round}: recomputing {record.method}: {exc}"
        ) from exc
    except (IntegrityError, DAGError) as exc:
        raise AuditError("input-blocks", f"round {record.round}: {exc}") from exc
    except NodeError as exc:
        raise AuditError("input-fetch", f"round {record.round}: {exc}") from exc
    check_weights(rcid, record, info.weights)
    expected = file_cid(encode(Gradient(tensors, output_meta(record))))
    if expected != record.output.to_v1():
        raise AuditError(
            "output-cid",
            f"{where(rcid, record)} names output {record.output}, but "
            f"{record.method} over its {len(sources)} inputs gives {expected}",
        )
    return Rederived(len(sources), nbytes, tuple(name for name, _, _ in layouts[0]))


def _codec_text(codec: object) -> str:
    return "dense (gradstore/1)" if codec is None else f"compressed with {codec}"
