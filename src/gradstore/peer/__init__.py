"""A job's peer: publish a gradient and announce it, await and apply the aggregate."""

from ._client import AggregateResult, Peer, apply

__all__ = ["AggregateResult", "Peer", "apply"]
