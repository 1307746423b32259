"""Independent re-checks of what a coordinator published (DESIGN section 7).

Used by scripts/verify_cid.py, verify_round.py and verify_history.py. Every
failure is an ``AuditError`` whose ``check`` names what did not hold.
"""

from ..errors import AuditError
from ._cid import CidReport, fetch_gradient, verify_cid
from ._cli import verify_cid_main, verify_history_main, verify_round_main
from ._history import verify_history
from ._round import (
    RoundReport,
    aggregate_meta,
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
    "fetch_gradient",
    "fetch_record",
    "recompute_output",
    "verify_cid",
    "verify_cid_main",
    "verify_history",
    "verify_history_main",
    "verify_record",
    "verify_round",
    "verify_round_main",
]
