"""A job's peer: publish a gradient and announce it, await and apply the aggregate; in a job
with steps, publish and await each step."""

from ._client import Peer
from ._listen import CoordinatorListener
from ._results import AggregateResult, StepFailed, apply
from ._steps import PeerSteps
from ._view import CoordinatorView, RoundView

__all__ = [
    "AggregateResult",
    "CoordinatorListener",
    "CoordinatorView",
    "Peer",
    "PeerSteps",
    "RoundView",
    "StepFailed",
    "apply",
]
