"""Population-based training's rules, without I/O: the hyperparameter space, the seeded
SHA-256 stream, exploit (who copies whom) and explore (how hyperparameters move).

Pure, so the job file (which draws initial hyperparameters), the controller and the audit
all use the same functions; the roles that run them on IPFS nodes are ``gradstore.population``.
"""

from ._rng import Stream, stream_key
from .decide import Copy, Decision, MemberFailure, MemberScore, decide, quantile_size
from .explore import explore
from .initial import initial_hparams
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
    "initial_hparams",
    "quantile_size",
    "stream_key",
]
