"""Independent re-checks of what a coordinator published (docs/design/auditing.md).

Used by ``gradstore audit cid|round|history`` (and the scripts/verify_*.py wrappers).
Every failure is an ``AuditError`` whose ``check`` names what did not hold.
"""

from ..errors import AuditError
from ._cid import CidReport, fetch_gradient, verify_cid
from ._history import verify_history
from ._round import (
    RoundReport,
    aggregate_meta,
    check_expected,
    fetch_record,
    recompute_output,
    verify_record,
    verify_round,
)

__all__ = [
    "AuditError",
    "CidReport",
    "RoundReport",
    "aggregate_meta",
    "check_expected",
    "fetch_gradient",
    "fetch_record",
    "recompute_output",
    "verify_cid",
    "verify_history",
    "verify_record",
    "verify_round",
]
