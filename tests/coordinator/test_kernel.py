"""The round kernel, public in ``gradstore.coordinator``: an input that came as arrays is
bound and checked as a fetched one is, with the same reasons (real Kubo); whatever a
document does wrong is a refusal, never an exception that costs the round."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import gradstore.coordinator as coordinator
from gradstore.coordinator import (
    ByteBudget,
    Claim,
    InputRefused,
    VerifiedInput,
    check_gradient,
    kernel,
    schema_of,
    verify_gradient,
    verify_input,
)
from gradstore.dag import CID
from gradstore.errors import IntegrityError
from gradstore.format import Gradient, encode, read_header
from gradstore.node import KuboDaemon, KuboNode
from gradstore.store import GradientStore

PEER = "did:key:z6MkpTHR8VNsBxYAAWHut2Geadd9jSwuBV8xRoAnwWsdvktH"
OTHER = "did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK"
CLAIM = Claim(PEER, 3, "job", 5, "run")


def _gradient(peer: str = PEER, **changes: Any) -> Gradient:
    tensors = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(4, np.float64)}
    tensors.update(changes)
    meta = {"kind": "gradient", "job": "job", "run": "run", "round": 3, "peer": peer}
    return Gradient(tensors, {**meta, "num_samples": 5})


def test_the_kernel_is_the_public_face_of_the_coordinator() -> None:
    for name in kernel.__all__:
        assert name in coordinator.__all__, name
        assert getattr(coordinator, name) is getattr(kernel, name), name


def _both(
    daemon: KuboDaemon, gradient: Gradient, *, expected: Any = None, announced: CID | None = None
) -> tuple[VerifiedInput | str, VerifiedInput | str]:
    """What the kernel says of ``gradient`` as arrays and as a CID: the input or the reason."""

    async def run() -> tuple[VerifiedInput | str, VerifiedInput | str]:
        async with daemon.node() as node:
            store = GradientStore(node)
            out: list[VerifiedInput | str] = []
            try:
                out.append(
                    await verify_gradient(
                        store,
                        PEER,
                        gradient,
                        5,
                        expected=expected,
                        clip=True,
                        claim=CLAIM,
                        announced=announced,
                    )
                )
            except InputRefused as exc:
                out.append(exc.reason)
            cid = await store.put(gradient)
            try:
                out.append(
                    await verify_input(
                        node,
                        store,
                        PEER,
                        cid,
                        5,
                        expected=expected,
                        resolve_timeout_s=10.0,
                        budget=ByteBudget(1 << 20),
                        keep=ByteBudget(1 << 20),
                        clip=True,
                        claim=CLAIM,
                    )
                )
            except InputRefused as exc:
                out.append(exc.reason)
            return out[0], out[1]

    return asyncio.run(run())


def test_an_input_from_arrays_is_the_input_its_cid_would_be(kubo: KuboDaemon) -> None:
    gradient = _gradient()
    arrays, fetched = _both(kubo, gradient)
    assert isinstance(arrays, VerifiedInput) and isinstance(fetched, VerifiedInput)
    assert arrays.cid == fetched.cid and arrays.nbytes == fetched.nbytes
    assert arrays.schema == fetched.schema == schema_of(gradient)
    assert arrays.norm == fetched.norm and arrays.norm is not None
    assert arrays.tensors == fetched.tensors
    header = read_header(encode(gradient).tobytes())
    assert arrays.tensors == {t.name: t for t in header.tensors}
    assert arrays.gradient is gradient  # the arrays were in memory already


@pytest.mark.parametrize(
    ("gradient", "expected", "code"),
    [
        (_gradient(OTHER), None, "wrong-peer"),  # the binding check, for arrays too
        (_gradient(w=np.full((3, 4), np.nan, np.float32)), None, "non-finite"),
        (_gradient(), schema_of(_gradient(b=np.ones(5))), "schema-mismatch"),
    ],
    ids=["binding", "non-finite", "schema"],
)
def test_arrays_and_cids_are_refused_for_the_same_reason(
    kubo: KuboDaemon, gradient: Gradient, expected: Any, code: str
) -> None:
    arrays, fetched = _both(kubo, gradient, expected=expected)
    assert isinstance(arrays, str) and arrays == fetched
    assert arrays.startswith(f"{code}: "), arrays
    if code != "wrong-peer":  # the one check the gradient alone cannot make
        assert check_gradient(gradient, expected, False)[1] == arrays


def test_arrays_that_are_not_the_signed_cid_are_refused(kubo: KuboDaemon) -> None:
    signed = CID.parse("bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku")
    arrays, _ = _both(kubo, _gradient(), announced=signed)
    assert isinstance(arrays, str)
    assert arrays.startswith("integrity: the arrays make document "), arrays
    assert arrays.endswith(f"the signed reply names {signed}")


class _LyingPin:
    """A node whose pin says a block is not its CID's: a failure no real node produces."""

    def __init__(self, node: KuboNode) -> None:
        self._node = node

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)

    async def pin(self, cid: CID, recursive: bool = True) -> None:
        raise IntegrityError(cid)


def test_a_document_error_anywhere_in_an_attempt_is_a_refusal(kubo: KuboDaemon) -> None:
    async def run() -> str:
        async with kubo.node() as node:
            store = GradientStore(node)
            cid = await store.put(_gradient())
            with pytest.raises(InputRefused) as info:
                await verify_input(
                    _LyingPin(node),  # type: ignore[arg-type]
                    store,
                    PEER,
                    cid,
                    5,
                    expected=None,
                    resolve_timeout_s=10.0,
                    budget=ByteBudget(1 << 20),
                    keep=ByteBudget(1 << 20),
                    clip=False,
                )
            return info.value.reason

    assert asyncio.run(run()).startswith("integrity: ")


class _CountedGets:
    """Real Kubo, with the blocks fetched one by one (``block/get``) written down."""

    def __init__(self, node: KuboNode) -> None:
        self._node = node
        self.gets: list[CID] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)

    async def get_block(self, cid: CID) -> bytes:
        self.gets.append(cid)
        return await self._node.get_block(cid)


def test_an_inputs_root_block_is_fetched_once(kubo: KuboDaemon) -> None:
    """The root is fetched first, to refuse a document over the limit before any leaf; the
    document's fetch then starts from it instead of asking the node again (issue 19: one
    Kubo call fewer for every input, 256 in a round of 64 steps x 4 peers)."""
    gradient = _gradient(w=np.arange(300_000, dtype=np.float32))  # five leaves of 256 KiB

    async def run() -> tuple[list[CID], CID, VerifiedInput]:
        async with kubo.node() as node:
            cid = await GradientStore(node).put(gradient, pin=False)
            counted = _CountedGets(node)
            got = await verify_input(
                counted,  # type: ignore[arg-type]
                GradientStore(counted),  # type: ignore[arg-type]
                PEER,
                cid,
                5,
                expected=None,
                resolve_timeout_s=10.0,
                budget=ByteBudget(16 << 20),
                keep=ByteBudget(16 << 20),
                clip=False,
            )
            return counted.gets, cid, got

    gets, cid, got = asyncio.run(run())
    assert gets == [cid]  # the leaves came in one `cat`
    assert got.gradient is not None
    np.testing.assert_array_equal(got.gradient.tensors["w"], gradient.tensors["w"])


def test_the_fetch_plan_waits_by_the_shared_backoff() -> None:
    from gradstore.coordinator.fetch_plan import FetchPlan

    plan = FetchPlan(workers=1)
    plan.add((1, "p"))
    waits: list[float] = []
    now = 0.0
    while True:
        key, _ = plan.next(now)
        assert key == (1, "p")
        at = plan.retry(key, now)
        if at is None:
            break
        waits.append(at - now)
        now = at
    assert waits == list(coordinator.FETCH_RETRY.delays()) == [0.5, 1.0, 2.0]
