"""A job's peer: publish a gradient and announce it, await and apply the aggregate; in a job
with steps, publish and await each step."""

from ._client import Peer
from ._results import AggregateResult, StepFailed, apply
from ._steps import PeerSteps

__all__ = ["AggregateResult", "Peer", "PeerSteps", "StepFailed", "apply"]
