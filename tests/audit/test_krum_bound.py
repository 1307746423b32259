"""A record listing more Krum inputs than MAX_KRUM_INPUTS is refused before any input is
fetched: anyone can sign such a record, and an unpinned auditor used to fetch every input
and then hold n x n matrices and 256 KiB per input (issue 23, R4)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import time
from typing import Any

import pytest

from gradstore.aggregate.methods import MAX_KRUM_INPUTS
from gradstore.audit import verify_round
from gradstore.dag import CID
from gradstore.dag.cid import RAW
from gradstore.errors import AuditError, TooManyInputsError
from gradstore.messages import RECORD_TYPE, RECORD_TYPE_SIGNED, RecordInput, RoundRecord, SigningKey
from gradstore.node import KuboDaemon, KuboNode
from gradstore.store import GradientStore

from .rounds import COORDINATOR, JOB, RUN, announcement, put_record


class Asked:
    """The real node, noting every call made through it (the store of the inputs)."""

    def __init__(self, node: KuboNode) -> None:
        self.node = node
        self.asked: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.node, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.asked.append(name)
            return attr(*args, **kwargs)

        return call


def nobodys(i: int) -> CID:
    """The CID of a block no node has: fetching it waits for the provider search."""
    return CID.hash(RAW, b"an input nobody serves %d" % i)


@functools.cache
def peers(n: int) -> list[SigningKey]:
    return [SigningKey.from_seed(hashlib.sha256(b"peer %d" % i).digest()) for i in range(n)]


def record(n: int, method: str, signed: bool) -> RoundRecord:
    """A record of ``n`` inputs, each from its own peer (signed announcements or none)."""
    inputs = []
    for i, peer in enumerate(peers(n)):
        cid = nobodys(i)
        sent_at, sig = announcement(peer, cid, 1, 0) if signed else (None, None)
        inputs.append(RecordInput(peer.did, cid, 1, 1.0 if i == 0 else 0.0, None, sent_at, sig))
    return RoundRecord(
        job=JOB,
        run=RUN,
        round=0,
        method=method,
        params={"byzantine": 1},
        inputs=tuple(inputs),
        excluded=(),
        output=nobodys(-1),
        prev=None,
        coordinator=COORDINATOR.did,
    )


@pytest.mark.parametrize(("method", "signed"), [("krum", True), ("multikrum", False)])
def test_a_record_with_more_krum_inputs_than_the_bound_is_refused_before_any_fetch(
    kubo: KuboDaemon, method: str, signed: bool
) -> None:
    forged = record(MAX_KRUM_INPUTS + 1, method, signed)
    assert forged.type == (RECORD_TYPE_SIGNED if signed else RECORD_TYPE)

    async def main() -> tuple[AuditError, float, list[str]]:
        async with kubo.node() as node:
            rcid = await put_record(node, forged)
            inputs_node = Asked(node)
            started = time.perf_counter()
            with pytest.raises(AuditError) as caught:
                # unpinned: the record's own signer is all the auditor knows; a fetch of any
                # input waits for providers nobody has (before: until wait_for gave up)
                await asyncio.wait_for(verify_round(node, rcid, GradientStore(inputs_node)), 20)
            return caught.value, time.perf_counter() - started, inputs_node.asked

    err, seconds, asked = asyncio.run(main())
    assert asked == []  # the inputs' store never went to the node
    assert err.check == "inputs", err
    assert f"lists {MAX_KRUM_INPUTS + 1} inputs" in str(err)
    assert f"more than the {MAX_KRUM_INPUTS} it takes" in str(err)
    cause = err.__cause__
    assert isinstance(cause, TooManyInputsError)
    assert (cause.method, cause.count, cause.bound) == (
        method,
        MAX_KRUM_INPUTS + 1,
        MAX_KRUM_INPUTS,
    )
    assert seconds < 10, f"{seconds:.2f} s"  # decoding the record's 1025 peer dids: ~2 s
