"""Independent re-checks of what a coordinator published (docs/design/auditing.md).

Used by ``gradstore audit cid|round|history`` (and the scripts/verify_*.py wrappers).
A stepped round's round/5 record is audited step record by step record (``_steps``),
with the checks a round/4 record gets (``_checks``).
Every failure is an ``AuditError`` whose ``check`` names what did not hold.
"""

from ..errors import AuditError
from ._cid import CidReport, fetch_gradient, verify_cid
from ._history import verify_history
from ._population import (
    PopulationReport,
    fetch_population_record,
    verify_decision,
    verify_population,
)
from ._records import (
    check_expected,
    fetch_any_record,
    fetch_record,
    fetch_step_record,
    fetch_with,
)
from ._round import (
    AnyRoundReport,
    RoundReport,
    aggregate_meta,
    recompute_output,
    verify_any_record,
    verify_record,
    verify_round,
)
from ._steps import SteppedRoundReport, StepReport, verify_step, verify_stepped_record
from ._tree import PartialReport, TreeRoundReport, verify_partial, verify_tree_record

__all__ = [
    "AnyRoundReport",
    "AuditError",
    "CidReport",
    "PartialReport",
    "PopulationReport",
    "RoundReport",
    "StepReport",
    "SteppedRoundReport",
    "TreeRoundReport",
    "aggregate_meta",
    "check_expected",
    "fetch_any_record",
    "fetch_gradient",
    "fetch_population_record",
    "fetch_record",
    "fetch_step_record",
    "fetch_with",
    "recompute_output",
    "verify_any_record",
    "verify_cid",
    "verify_decision",
    "verify_history",
    "verify_partial",
    "verify_population",
    "verify_record",
    "verify_round",
    "verify_step",
    "verify_stepped_record",
    "verify_tree_record",
]
