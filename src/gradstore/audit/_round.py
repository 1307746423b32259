"""verify_round: re-derive a round's aggregate from its signed record and compare the output CID.

Nothing the coordinator says is trusted beyond what its signature covers: the
record is hash- and signature-checked, every input is re-fetched with every
block verified, the aggregate is recomputed with the recorded method and
parameters over the inputs in record order, encoded with the meta the
coordinator writes, and its CID is computed locally. Every other field the record
claims is checked against something that is not the coordinator's word: each
``weight`` against what the method gives (Krum's selection re-derived), each
``num_samples`` against the peer's own signed announcement (round/4) and against the
input document's meta where it states its samples. The checks themselves are shared with
a stepped round's step records (``_checks``); a round/5 record is audited by ``_steps``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, TypeAlias

from ..aggregate import aggregate_with_info
from ..dag import CID, file_cid
from ..errors import AggregationError, AuditError
from ..format import CompressedGradient, Gradient, encode
from ..messages import RoundRecord, SteppedRoundRecord, TreeRecord
from ..messages import aggregate_meta as _aggregate_meta
from ..node import Node
from ..store import ByteProgress, GradientStore
from ._checks import UNSUPPORTED, record_params, rederive
from ._records import check_expected, fetch_any_record
from ._steps import SteppedRoundReport, verify_stepped_record
from ._tree import TreeRoundReport, verify_tree_record


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


AnyRoundReport: TypeAlias = RoundReport | SteppedRoundReport | TreeRoundReport
"""What auditing a round gives: a round/2-4 record's report, a stepped round's or a tree
round's."""


def aggregate_meta(record: RoundRecord) -> dict[str, Any]:
    """The meta the coordinator writes into the aggregate document of ``record``'s round.

    The same function the coordinator uses: kind, job, round, method and the input CIDs
    (in record order, i.e. sorted by peer id).
    """
    return _aggregate_meta(
        record.job, record.round, record.method, [i.gradient for i in record.inputs], run=record.run
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
    """Re-fetch every input of an already checked record, recompute, compare the output CID
    (``_checks.rederive``: its checks, memory O(model)). ``progress(done, total)`` is
    called as input bytes arrive and as each stage ends."""
    start = time.perf_counter()
    done = await rederive(store, rcid, record, progress=progress)
    return RoundReport(
        rcid,
        record,
        done.inputs,
        done.input_bytes,
        time.perf_counter() - start,
        UNSUPPORTED.get(record.type, ()),
    )


async def verify_any_record(
    store: GradientStore,
    rcid: CID,
    record: RoundRecord | SteppedRoundRecord | TreeRecord,
    *,
    progress: ByteProgress | None = None,
) -> AnyRoundReport:
    """:func:`verify_record` of a round/2-4 record, ``verify_stepped_record`` of a round/5,
    ``verify_tree_record`` of a tree/1."""
    if isinstance(record, SteppedRoundRecord):
        return await verify_stepped_record(store, rcid, record, progress=progress)
    if isinstance(record, TreeRecord):
        return await verify_tree_record(store, rcid, record, progress=progress)
    return await verify_record(store, rcid, record, progress=progress)


async def verify_round(
    node: Node,
    record_cid: CID | str,
    store: GradientStore | None = None,
    *,
    coordinator: str | None = None,
    job: str | None = None,
    progress: ByteProgress | None = None,
) -> AnyRoundReport:
    """Verify one round from its record CID (see the module docstring; a round/5 record:
    ``audit._steps``); ``AuditError`` names the check. ``coordinator``/``job`` pin whose
    record it must be (``check_expected``)."""
    rcid, record = await fetch_any_record(node, record_cid)
    check_expected(rcid, record, coordinator, job)
    store = store or GradientStore(node)
    return await verify_any_record(store, rcid, record, progress=progress)
