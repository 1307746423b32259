"""Population-based training over CIDs: the member reports, the signed decision record and
the roles (controller, member) that run them on IPFS nodes. The pure rules they apply are
``gradstore.pbt``, re-exported here."""

from ..pbt import (
    Choice,
    Copy,
    Decision,
    HParams,
    HValue,
    MemberFailure,
    MemberScore,
    PopulationParams,
    Range,
    Stream,
    decide,
    explore,
    initial_hparams,
    quantile_size,
    stream_key,
)

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
