"""verify_round: re-derive a round's aggregate from its signed record and compare the output CID.

Nothing the coordinator says is trusted beyond what its signature covers: the
record is hash- and signature-checked, every input is re-fetched with every
block verified, the aggregate is recomputed with the recorded method and
parameters over the inputs in record order, encoded with the meta the
coordinator writes, and its CID is computed locally. Every other field the record
claims is checked against something that is not the coordinator's word: each
``weight`` against what the method gives (Krum's selection re-derived), each
``num_samples`` against the peer's own signed announcement (round/4) and against the
input document's meta where it states its samples.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..aggregate import (
    AggregationParams,
    Layout,
    NormSum,
    OutputClip,
    aggregate_streamed,
    aggregate_with_info,
)
from ..dag import CID, DAG_CBOR, file_cid
from ..errors import (
    AggregationError,
    AuditError,
    CIDError,
    DAGError,
    IntegrityError,
    MessageError,
    NodeError,
    Reason,
    TooManyInputsError,
)
from ..format import CompressedGradient, Gradient, encode
from ..messages import (
    RECORD_TYPE,
    RECORD_TYPE_CODECS,
    RECORD_TYPE_SIGNED,
    RecordInput,
    RoundRecord,
    decode_record,
)
from ..messages import aggregate_meta as _aggregate_meta
from ..node import Node
from ..store import ByteProgress, GradientStore, StoredCompressed, StoredGradient
from ._cid import fetch_with_header, parse_cid


@dataclass(frozen=True)
class RoundReport:
    """A round whose record, inputs and output were all re-checked.

    ``unsupported``: the checks this record's version cannot support (an older record
    carries no peers' signatures), said so the auditor knows what stayed unchecked."""

    record_cid: CID
    record: RoundRecord
    inputs: int
    input_bytes: int
    seconds: float
    unsupported: tuple[str, ...] = ()

    @property
    def round(self) -> int:
        return self.record.round


def aggregate_meta(record: RoundRecord) -> dict[str, Any]:
    """The meta the coordinator writes into the aggregate document of ``record``'s round.

    The same function the coordinator uses: kind, job, round, method and the input CIDs
    (in record order, i.e. sorted by peer id).
    """
    return _aggregate_meta(
        record.job, record.round, record.method, [i.gradient for i in record.inputs], run=record.run
    )


async def fetch_record(node: Node, cid: CID | str) -> tuple[CID, RoundRecord]:
    """Fetch a round record; check its hash, schema and the coordinator's signature.

    Checks: ``record-cid``, ``record-fetch``, ``record-hash``, ``record-signature``,
    ``record-format``.
    """
    rcid = parse_cid(cid, "record-cid")
    if rcid.codec != DAG_CBOR:
        raise AuditError("record-cid", f"{rcid} is {rcid.codec_name}; a round record is dag-cbor")
    try:
        data = await node.get_block(rcid)
    except IntegrityError as exc:  # the node served bytes that are not the record's
        raise AuditError("record-hash", f"round record {rcid}: {exc}") from exc
    except NodeError as exc:
        raise AuditError("record-fetch", f"cannot fetch round record {rcid}: {exc}") from exc
    try:
        return rcid, decode_record(data, cid=rcid)
    except IntegrityError as exc:
        raise AuditError("record-hash", f"round record {rcid}: {exc}") from exc
    except CIDError as exc:
        raise AuditError("record-cid", f"round record {rcid}: {exc}") from exc
    except MessageError as exc:
        check = "record-signature" if exc.code is Reason.BAD_SIGNATURE else "record-format"
        raise AuditError(check, f"round record {rcid}: {exc}") from exc


def check_expected(
    rcid: CID, record: RoundRecord, coordinator: str | None = None, job: str | None = None
) -> None:
    """Refuse a record that is not the expected coordinator's (or not the expected job's).

    The signature check only proves that the key the record names signed it; whoever
    holds any key can sign a record naming itself. An auditor who knows the job's
    coordinator pins it here. Checks: ``expected-coordinator``, ``expected-job``.
    """
    if coordinator is not None and record.coordinator != coordinator:
        raise AuditError(
            "expected-coordinator",
            f"round record {rcid} (round {record.round}) is signed by {record.coordinator}, "
            f"not by the expected coordinator {coordinator}",
        )
    if job is not None and record.job != job:
        raise AuditError(
            "expected-job",
            f"round record {rcid} (round {record.round}) is of job {record.job!r}, "
            f"not of the expected job {job!r}",
        )


#: What a record of each version cannot support: round/2 and round/3 carry no peer
#: signatures, so their sample counts are checked against the documents' meta only.
UNSUPPORTED: Final = {
    RECORD_TYPE: ("input-signature",),
    RECORD_TYPE_CODECS: ("input-signature",),
    RECORD_TYPE_SIGNED: (),
}


def record_params(record: RoundRecord) -> AggregationParams:
    """The record's method and parameters, with the norm summation and output clipping its
    version states (docs/spec.md). Checks: ``params``."""
    current = record.type == RECORD_TYPE_SIGNED
    norm_sum: NormSum = "sequential" if current else "blocked-pairwise"
    output_clip: OutputClip = "float64" if current else "rounded"
    try:
        return AggregationParams.from_record(record.method, record.params, norm_sum, output_clip)
    except (AggregationError, TypeError) as exc:
        raise AuditError("params", f"round {record.round}: recorded parameters: {exc}") from exc


def check_input_count(rcid: CID, record: RoundRecord, params: AggregationParams) -> None:
    """Refuse, before any input is fetched, a record listing more inputs than its method takes
    in bounded memory (Krum: ``MAX_KRUM_INPUTS``) or a count its method refuses.

    Anyone can sign a record, and an unpinned auditor would otherwise fetch every input
    before the method refused them. Checks: ``inputs`` (too many), ``aggregate``.
    """
    n = len(record.inputs)
    try:
        params.validate(n)
    except TooManyInputsError as exc:
        raise AuditError(
            "inputs", f"round {record.round} record {rcid} lists {n} inputs: {exc}"
        ) from exc
    except AggregationError as exc:
        raise AuditError(
            "aggregate", f"round {record.round}: recomputing {record.method}: {exc}"
        ) from exc


def check_signatures(rcid: CID, record: RoundRecord) -> None:
    """Each round/4 input's ``peer_sig`` must be its peer's over (job, run, round, CID,
    num_samples, sent_at): the sample count is the peer's word. Checks: ``input-signature``."""
    if record.type != RECORD_TYPE_SIGNED:
        return
    for inp in record.inputs:
        if not inp.peer_signed(record):
            raise AuditError(
                "input-signature",
                f"round {record.round} record {rcid}: the input of {inp.peer} ({inp.gradient}, "
                f"{inp.num_samples} samples) is not what that peer signed",
            )


def check_document_meta(
    rcid: CID, record: RoundRecord, inp: RecordInput, meta: Mapping[str, Any]
) -> None:
    """An input document that states its samples (or, in round/4, its job, run, round or
    peer) must agree with the record. Checks: ``input-samples``, ``input-meta``."""
    where = f"round {record.round} record {rcid}: the input of {inp.peer} ({inp.gradient})"
    stated = meta.get("num_samples")
    if stated is not None and stated != inp.num_samples:
        raise AuditError(
            "input-samples",
            f"{where} is recorded with {inp.num_samples} samples, its document says {stated!r:.40}",
        )
    if record.type != RECORD_TYPE_SIGNED:
        return
    for key, value in (
        ("job", record.job),
        ("run", record.run),
        ("round", record.round),
        ("peer", inp.peer),
    ):
        if key in meta and meta[key] != value:
            raise AuditError(
                "input-meta", f"{where}: its document names {key} {meta[key]!r:.80}, not {value!r}"
            )


def check_weights(rcid: CID, record: RoundRecord, weights: tuple[float, ...] | None) -> None:
    """Each recorded ``weight`` must be what the method gives these inputs (bit for bit; 1.0
    for the order statistics). Checks: ``input-weight``."""
    expected = weights or tuple(1.0 for _ in record.inputs)
    for inp, want in zip(record.inputs, expected, strict=True):
        if inp.weight != want:
            raise AuditError(
                "input-weight",
                f"round {record.round} record {rcid}: the input of {inp.peer} is recorded with "
                f"weight {inp.weight!r}, but {record.method} over the recorded inputs gives "
                f"{want!r}",
            )


def recompute_output(record: RoundRecord, inputs: list[Gradient]) -> CID:
    """The output CID ``record`` must carry, from its dense inputs (in record order); blocking.

    Checks: ``params`` (recorded parameters unusable), ``aggregate`` (the recorded method
    refuses these inputs). Compressed inputs are recomputed by :func:`verify_record`.
    """
    if any(isinstance(g, CompressedGradient) for g in inputs):
        raise AuditError(
            "aggregate", "recompute_output takes dense inputs; verify_record decompresses"
        )
    params = record_params(record)
    try:
        tensors, _ = aggregate_with_info(
            [g.tensors for g in inputs], params, [i.num_samples for i in record.inputs]
        )
    except AggregationError as exc:
        raise AuditError(
            "aggregate", f"round {record.round}: recomputing {record.method}: {exc}"
        ) from exc
    return file_cid(encode(Gradient(tensors, aggregate_meta(record))))


async def verify_record(
    store: GradientStore, rcid: CID, record: RoundRecord, *, progress: ByteProgress | None = None
) -> RoundReport:
    """Re-fetch every input of an already checked record, recompute, compare the output CID.

    Memory stays O(model), as in the coordinator: each input is fetched, verified and
    decoded on its own, then read back from the node range by range (every leaf hashed
    again) while the aggregate is recomputed (``aggregate_streamed``: the same bits).

    Compressed inputs are decompressed range by range as the coordinator does; the codec
    the record names for each input must be its document's.

    Checks: ``inputs`` (a record with no input, or more than its method takes), ``params``,
    ``input-signature``, ``input-fetch``, ``input-blocks``, ``input-decode``, ``input-codec``,
    ``input-samples``, ``input-meta``, ``aggregate``, ``input-weight``, ``output-cid``.
    ``progress(done, total)`` is called as input bytes arrive and as each stage ends.
    """
    start = time.perf_counter()
    if not record.inputs:
        raise AuditError("inputs", f"round {record.round} record {rcid} lists no input")
    params = record_params(record)
    check_input_count(rcid, record, params)
    check_signatures(rcid, record)
    sources: list[StoredGradient | StoredCompressed] = []
    layouts = []
    nbytes = 0
    for inp in record.inputs:
        what = f"input of {inp.peer}"
        gradient, header = await fetch_with_header(
            store, inp.gradient, what, prefix="input-", progress=progress
        )
        if inp.codec != header.codec:
            raise AuditError(
                "input-codec",
                f"round {record.round} record {rcid} says {what} {inp.gradient} is "
                f"{_codec_text(inp.codec)}, but the document is {_codec_text(header.codec)}",
            )
        check_document_meta(rcid, record, inp, gradient.meta)
        nbytes += gradient.nbytes
        layouts.append([(t.name, t.array_dtype, t.shape) for t in header.tensors])
        del gradient  # read back range by range below: one input in memory at a time
        infos = {t.name: t for t in header.tensors}
        try:
            if header.codec is not None:  # decompressed range by range, as the coordinator
                sources.append(
                    await StoredCompressed.open(
                        store.node, inp.gradient, infos, header.codec, store.limits.max_bytes
                    )
                )
            else:
                sources.append(
                    await StoredGradient.open(
                        store.node, inp.gradient, infos, store.limits.max_bytes
                    )
                )
        except NodeError as exc:
            raise AuditError("input-fetch", f"cannot read {what} {inp.gradient}: {exc}") from exc
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
    expected = file_cid(encode(Gradient(tensors, aggregate_meta(record))))
    if expected != record.output.to_v1():
        raise AuditError(
            "output-cid",
            f"round {record.round} record {rcid} names output {record.output}, but "
            f"{record.method} over its {len(sources)} inputs gives {expected}",
        )
    return RoundReport(
        rcid,
        record,
        len(sources),
        nbytes,
        time.perf_counter() - start,
        UNSUPPORTED.get(record.type, ()),
    )


def _codec_text(codec: object) -> str:
    return "dense (gradstore/1)" if codec is None else f"compressed with {codec}"


async def verify_round(
    node: Node,
    record_cid: CID | str,
    store: GradientStore | None = None,
    *,
    coordinator: str | None = None,
    job: str | None = None,
    progress: ByteProgress | None = None,
) -> RoundReport:
    """Verify one round from its record CID (see the module docstring); ``AuditError`` names
    the check. ``coordinator``/``job`` pin whose record it must be (``check_expected``)."""
    rcid, record = await fetch_record(node, record_cid)
    check_expected(rcid, record, coordinator, job)
    return await verify_record(store or GradientStore(node), rcid, record, progress=progress)
