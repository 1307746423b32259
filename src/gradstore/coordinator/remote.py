"""The root's check of another owner's step (docs/design/multicoord.md): pure, no I/O.

In a job split among coordinators, the root takes another owner's step as closed on that
owner's signed result only once the step record it names is checked as the auditor checks
a part: the record's signature (``decode_step_record``) is its owner's, the owner the job
file names for the step, of the job, the run and the round of the result, for its step,
with the output the result announces. Anything else is a ``MessageError`` and the step
waits on (its owner repeats its result; at the deadline it fails, naming the owner).
"""

from __future__ import annotations

from ..dag import CID
from ..errors import MessageError, Reason
from ..messages import Result, StepRecord

__all__ = ["check_remote_step"]


def check_remote_step(
    result: Result, cid: CID, record: StepRecord, *, owner: str, job: str, run: str
) -> None:
    """MessageError unless ``record`` (fetched by ``cid``, the record ``result`` names) is
    the step's part as its owner ``owner`` signs it for ``job``, ``run`` and the result's
    round and step, with the result's output."""
    where = f"step {result.step!r}'s record {cid}"
    if record.coordinator != owner:
        raise MessageError(
            Reason.NOT_COORDINATOR,
            f"{where} is signed by {record.coordinator}, not by the step's owner {owner}",
        )
    said = (job, run, result.round, result.step)
    if (record.job, record.run, record.round, record.step) != said:
        raise MessageError(
            Reason.MALFORMED,
            f"{where} is job {record.job!r} run {record.run} round {record.round} step "
            f"{record.step!r}, the result says job {job!r} run {run} round {result.round} "
            f"step {result.step!r}",
        )
    if record.output.to_v1() != CID.parse(result.cid).to_v1():
        raise MessageError(
            Reason.MALFORMED, f"{where}'s output is {record.output}, the result says {result.cid}"
        )
