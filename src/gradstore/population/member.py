"""The member's side of a decision: read the signed record, and if it copies, fetch the
source's checkpoint by CID, every block verified (``GradientStore.get``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..dag.cid import CID
from ..errors import MessageError, Reason
from ..node import Node
from ..pbt.space import HValue
from ..store import GradientStore
from .record import PopulationRecord, decode_population_record

if TYPE_CHECKING:
    from ..format import Gradient


@dataclass(frozen=True)
class NextState:
    """How a member goes on: from ``checkpoint`` (None: its own) with ``hparams``."""

    checkpoint: CID | None
    source: str | None
    hparams: dict[str, HValue]


async def read_decision(node: Node, record_cid: CID, *, controller: str) -> PopulationRecord:
    """The decision record at ``record_cid``: hash, schema and ``controller``'s signature
    checked (``MessageError`` not-coordinator for a record another key signed)."""
    rec = decode_population_record(await node.get_block(record_cid), cid=record_cid)
    if rec.controller != controller:
        raise MessageError(Reason.NOT_COORDINATOR, f"record {record_cid} is {rec.controller}'s")
    return rec


def next_state(rec: PopulationRecord, member: str) -> NextState:
    """What ``rec`` tells ``member`` to do next (KeyError if it names no such member)."""
    copy = next((c for c in rec.copies if c.member == member), None)
    if copy is not None:
        return NextState(copy.checkpoint, copy.source, dict(copy.hparams))
    return NextState(None, None, rec.hparams_after()[member])


async def fetch_checkpoint(store: GradientStore, cid: CID) -> Gradient:
    """The checkpoint at ``cid``, fetched and verified block by block, then decoded."""
    return await store.get(cid)
