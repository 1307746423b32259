"""Population-based training over CIDs: the pure decision (exploit + explore), the member
reports and the signed decision record, and the roles that run them on IPFS nodes."""

from ._rng import Stream, stream_key
from .decide import Copy, Decision, MemberFailure, MemberScore, decide, quantile_size
from .explore import explore
from .space import Choice, HParams, HValue, PopulationParams, Range

__all__ = [
    "Choice",
    "Copy",
    "Decision",
    "HParams",
    "HValue",
    "MemberFailure",
    "MemberScore",
    "PopulationParams",
    "Range",
    "Stream",
    "decide",
    "explore",
    "quantile_size",
    "stream_key",
]
