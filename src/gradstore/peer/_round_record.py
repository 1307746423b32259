"""A step's outcome read from its round's round/5 record, for a peer that missed the step's
result message.

Once a stepped round's own result is out the coordinator stops repeating its steps'
results (its beacon stays bounded): the round/5 record the signed result names links
every step's record, or says why a step failed. The record is trusted exactly as far as
the signed result: it is fetched by the CID the result names and checked against it,
signed by the job's coordinator, of the result's job, run and round, with the result's
model-level output; the step record it links is checked the same way
(``messages.check_step_of``). Anything else is an error (``MessageError``,
``IntegrityError``), never an outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final, TypeVar

from ..dag import CID
from ..errors import MessageError, Reason
from ..job import JobConfig
from ..messages import (
    Result,
    SteppedRoundRecord,
    StepRecord,
    check_step_of,
    decode_step_record,
    decode_stepped_record,
)
from ..node import Node
from ._view import Outcome

#: How long a record block may take to arrive from the coordinator's node.
RECORD_TIMEOUT_S: Final = 30.0

#: Records kept per listener (a round/5 record and up to its steps' records).
_KEEP: Final = 1024

R = TypeVar("R")


class RoundRecords:
    """The round/5 and step records a peer read, checked, by CID (one fetch each)."""

    def __init__(self, config: JobConfig, node: Node) -> None:
        self.config = config
        self.node = node
        self._rounds: dict[str, SteppedRoundRecord] = {}
        self._steps: dict[str, StepRecord] = {}

    async def step_outcome(self, result: Result, step: str) -> Outcome:
        """``step``'s outcome as the round/5 record that ``result`` (the round's own signed
        result) names says it: its output, record and peers, or why it failed."""
        record = await self.round_record(result)
        entry = record.step_of(step)
        if entry is None:
            raise MessageError(
                Reason.MALFORMED,
                f"round {record.round}'s record {result.record} has no step {step!r}",
            )
        if entry.failed is not None:
            return Outcome(failed=entry.failed)
        assert entry.record is not None
        cid = entry.record
        found = await self._read(str(cid), self._steps, decode_step_record)
        if found.step != step:
            raise MessageError(
                Reason.MALFORMED,
                f"round {record.round}'s record links {cid} as step {step!r}'s record, "
                f"which is step {found.step!r}'s",
            )
        check_step_of(record, cid, found)  # job, run, round, coordinator and output
        owner = self.config.step_owners.get(step, self.config.coordinator)
        if found.coordinator != owner:  # the job file names the step's owner, not the record
            raise MessageError(
                Reason.MALFORMED,
                f"step {step!r}'s record {cid} is signed by {found.coordinator}, "
                f"but the job's owner of the step is {owner}",
            )
        roster = self.config.roster
        peers = [i.peer for i in found.inputs]
        if any(p not in roster for p in peers):
            raise MessageError(
                Reason.MALFORMED, f"step record {cid} aggregates a peer not of the job"
            )
        bitmap = roster.bitmap(peers)
        said = Result(
            job=found.job,
            run=found.run,
            round=found.round,
            step=step,
            cid=str(found.output),
            record=str(cid),
            method=found.method,
            peers=bitmap,
            sent_at=result.sent_at,
        )
        excluded = tuple((e.peer, e.reason) for e in found.excluded)
        return Outcome(said, bitmap, excluded=excluded)

    async def round_record(self, result: Result) -> SteppedRoundRecord:
        """The round/5 record ``result`` names, checked against it and the job."""
        if result.step is not None:
            raise MessageError(Reason.MALFORMED, "a step's result names no round/5 record")
        record = await self._read(result.record, self._rounds, decode_stepped_record)
        cfg = self.config
        if record.coordinator != cfg.coordinator or record.job != cfg.job:
            raise MessageError(
                Reason.MALFORMED,
                f"record {result.record} is not job {cfg.job}'s by its coordinator",
            )
        if (record.run, record.round) != (result.run, result.round):
            raise MessageError(
                Reason.MALFORMED,
                f"record {result.record} is of run {record.run} round {record.round}, "
                f"the result says run {result.run} round {result.round}",
            )
        if record.output.to_v1() != CID.parse(result.cid).to_v1():
            raise MessageError(
                Reason.MALFORMED,
                f"record {result.record}'s output is {record.output}, the result says {result.cid}",
            )
        return record

    async def _read(self, cid: str, cache: dict[str, R], decode: Callable[..., R]) -> R:
        """The record ``cid`` (its hash and signature checked by ``decode``), read once."""
        found = cache.get(cid)
        if found is None:
            parsed = CID.parse(cid)
            data = await asyncio.wait_for(self.node.get_block(parsed), RECORD_TIMEOUT_S)
            found = decode(data, cid=parsed)
            if len(cache) >= _KEEP:
                cache.pop(next(iter(cache)))
            cache[cid] = found
        return found
