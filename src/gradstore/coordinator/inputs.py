"""Fetch and verify one announced input: one bounded attempt, and what it proved.

An attempt first resolves the root block, within ``resolve_timeout_s``, and checks the
size it declares against the job's limit before a single leaf is fetched: a peer that
lies about its size, or announces a CID nobody serves, costs one block and a timeout.
Then the document is fetched within a memory budget (every block verified on the way),
decoded with the job's limits, bound to its announcement by its meta (``binding``: the
peer, round, job and sample count it names, when it names them), checked against the
schema, for NaN/Inf and (compressed) for values that come back beyond their dtype, and
pinned, so it stays on the coordinator's node until the round is aggregated. Decoding and
checks run off the event loop, in one worker call, window by window, and the budget counts
their scratch beside the document.

``verify_gradient`` takes an input that came as arrays instead (Flower's replies): the same
binding and checks, then it is encoded, compared with the CID its peer signed, and stored.

A ``RefusedError`` (``InputRefused`` is its former name here) is final for the round; a
``NodeError`` or ``TimeoutError`` is passing and the fetch plan may try again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from ..aggregate import (
    WINDOW_SCRATCH_BYTES,
    compressed_norm,
    first_beyond_dtype,
    global_norm,
)
from ..dag import CID, RAW, Block, FileAssembler, file_cid
from ..errors import (
    DAGError,
    GradstoreError,
    IntegrityError,
    LimitExceededError,
    NodeError,
    Reason,
    RefusedError,
    reason_text,
)
from ..format import (
    CHECK_SCRATCH_BYTES,
    Codec,
    CompressedGradient,
    EncodedDocument,
    Gradient,
    Limits,
    TensorInfo,
    all_finite,
    decode_with_header,
    dtype_code,
    encode,
)
from ..job import StepConfig
from ..node import Node
from ..store import GradientStore
from .binding import Claim, check_binding
from .pinner import BatchPinner
from .rounds import Schema, schema_of, schema_text
from .spill import SpillTarget, SpillWriter

log = logging.getLogger("gradstore.coordinator")

#: Slowest transfer an attempt allows once the root is in: its timeout grows with the size.
MIN_RATE_BYTES_S: Final = 4 * 1024 * 1024

#: What verifying one input holds beside its document, at most: the decoder's windows of
#: payload checks, or the windows the values are checked and the norm taken in (never both
#: at once). The budget counts it with the document.
SCRATCH_BYTES: Final = max(CHECK_SCRATCH_BYTES, WINDOW_SCRATCH_BYTES)


#: The former name of ``RefusedError`` for an input the round kernel refuses (``code``,
#: ``detail``; ``reason`` is the text, ``"too-large: ..."``).
InputRefused = RefusedError


@dataclass
class VerifiedInput:
    """An input that passed every check, and what aggregation needs of it."""

    peer: str
    cid: CID
    num_samples: int
    nbytes: int  # the document's size
    schema: Schema
    norm: float | None  # its global L2 norm, when the job clips inputs
    gradient: Gradient | CompressedGradient | None  # kept in memory if the budget allows
    tensors: dict[str, TensorInfo]  # where each tensor lives in the document, to read it again
    seconds: float
    codec: Codec | None = None  # a compressed input's codec (the round record names it)
    spill: Path | None = None  # its verified bytes, in the coordinator's spill file


class ByteBudget:
    """At most ``limit`` bytes of documents in memory at once (one document is always let in)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._cond = asyncio.Condition()

    async def acquire(self, n: int) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: self.used == 0 or self.used + n <= self.limit)
            self.used += n

    async def release(self, n: int) -> None:
        async with self._cond:
            self.used -= n
            self._cond.notify_all()

    def try_take(self, n: int) -> bool:
        """Take ``n`` bytes now if they fit (for keeping verified inputs in memory)."""
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give_back(self, n: int) -> None:
        """Return bytes taken with ``try_take``."""
        self.used -= n


async def root_block(node: Node, cid: CID, limits: Limits, timeout: float) -> tuple[int, bytes]:
    """The document size ``cid``'s root block declares (refused over the limit), and the root.

    Only the root is fetched (and verified against its CID).
    """
    try:
        data = await asyncio.wait_for(node.get_block(cid), timeout)
    except IntegrityError as exc:  # the node served bytes that do not hash to the CID
        raise RefusedError(Reason.INTEGRITY, str(exc)) from None
    assembler = FileAssembler(cid, limits.max_bytes)
    try:
        assembler.add(Block(cid, data))  # allocates lazily; refuses a size over the limit
    except LimitExceededError as exc:
        raise RefusedError(Reason.TOO_LARGE, str(exc)) from None
    except IntegrityError as exc:
        raise RefusedError(Reason.INTEGRITY, str(exc)) from None
    except DAGError as exc:
        raise RefusedError(Reason.MALFORMED, str(exc)) from None
    buffer = assembler.buffer
    assert buffer is not None
    return buffer.nbytes, data


async def verify_input(
    node: Node,
    store: GradientStore,
    peer: str,
    cid: CID,
    num_samples: int,
    *,
    expected: Schema | None,
    resolve_timeout_s: float,
    budget: ByteBudget,
    keep: ByteBudget,
    clip: bool,
    claim: Claim | None = None,
    step: StepConfig | None = None,
    pinner: BatchPinner | None = None,
    spill: SpillTarget | None = None,
    checked: Callable[[], object] | None = None,
) -> VerifiedInput:
    """One attempt at ``cid`` (see the module docstring).

    ``claim``: what the announcement says of the document (None: not checked); ``step``:
    the step whose tensors the document must hold (None: any); ``pinner``: pins it with
    other inputs in one call (None: alone); ``spill``: where to write the verified bytes
    of a document not kept in memory, if they fit on its disk (None: nowhere, it is read
    back from the node); ``checked``: called once the document passed its checks and only
    its pin is left (the fetch plan lets another fetch start: a pin waits on the node, not
    on this coordinator's work). Whatever the document does wrong is a ``RefusedError``;
    only the node's failures pass through."""
    with _as_refusal():
        start = time.perf_counter()
        size, root = await root_block(node, cid, store.limits, resolve_timeout_s)
        held = size + SCRATCH_BYTES
        await budget.acquire(held)
        times = [time.perf_counter()]  # let in, fetched, checked, pinned: logged at the end
        kept = keep.try_take(size)
        # decided before a leaf is fetched: a spill that would not fit on its disk is not made
        to_spill = not kept and spill is not None and spill.claim(size)
        writer = None
        try:
            timeout = resolve_timeout_s + size / MIN_RATE_BYTES_S
            limits = store.limits
            if to_spill and spill is not None:  # written as its leaves are verified
                writer = SpillWriter(spill.path)
            if cid.codec == RAW:  # a one-block document: the root is all of it
                buf: Any = root
                if writer is not None:
                    writer.allocate(len(root))[:] = root
            else:
                fetched = store.fetch_document(cid, root=root, sink=writer)
                try:
                    buf = await asyncio.wait_for(fetched, timeout)
                except LimitExceededError as exc:  # the rest: see _as_refusal
                    raise RefusedError(Reason.TOO_LARGE, str(exc)) from None
            times.append(time.perf_counter())
            # one worker call, off the loop: a compressed payload's checks take time in
            # proportion to it
            handed: list[Any] = [buf]  # the worker swaps it for its result: see _checked
            del buf
            await asyncio.to_thread(_checked, handed, limits, claim, expected, clip, step)
            gradient, header, schema, norm = handed.pop()
            if not kept:  # its memory goes back before the pin: the next fetch may start
                parting: list[Any] = [gradient]
                del gradient
                spilled = writer is not None and await asyncio.to_thread(_finished, writer)
                if writer is not None:
                    parting.append(writer.detach())
                await budget.release(held)
                held = 0
                # the last views of the buffer go in a worker, after the next fetch was let
                # in: unmapping a 1 GiB document takes 0.2 s, on the loop it stopped all
                await asyncio.to_thread(parting.clear)
            else:
                spilled = False
            times.append(time.perf_counter())
            if checked is not None:
                checked()
            pinned = node.pin(cid) if pinner is None else pinner.pin(cid)
            await asyncio.wait_for(pinned, timeout)
            times.append(time.perf_counter())
            log.debug(
                "%s verified: %d bytes; waited %.2f s, fetched in %.2f s, checked %.2f s, "
                "pinned %.2f s",
                cid,
                size,
                times[0] - start,
                *(b - a for a, b in itertools.pairwise(times)),
            )
            result = VerifiedInput(
                peer,
                cid,
                num_samples,
                size,
                schema,
                norm,
                gradient if kept else None,
                {t.name: t for t in header.tensors},
                time.perf_counter() - start,
                header.codec,
                spill.path if spilled and spill is not None else None,
            )
            if writer is not None:
                writer = None  # the result holds its file now (or it is read from the node)
                if not spilled and spill is not None:
                    spill.spills.remove([spill.path])
            kept = False  # the result holds them now
            return result
        finally:
            if kept:
                keep.give_back(size)
            if to_spill and spill is not None:
                spill.written(size)
                if writer is not None:  # refused, failed or cancelled: its file goes
                    writer.abandon()
                    spill.spills.remove([spill.path])
            if held:
                await budget.release(held)


def _checked(
    handed: list[Any],
    limits: Limits,
    claim: Claim | None,
    expected: Schema | None,
    clip: bool,
    step: StepConfig | None,
) -> None:
    """In a worker: the fetched document (``handed``'s one item) decoded with ``limits``,
    bound to ``claim`` and checked (``check_gradient``); ``RefusedError`` if it may not
    enter the round. ``handed``'s item becomes ``(gradient, header, schema, norm)``: the
    pool holds a call's arguments and result a moment after the caller wakes, and what
    views the fetched buffer must be gone as soon as the caller drops it (its memory goes
    back before the pin, and the next fetch may take it)."""
    buf = handed.pop()
    try:
        gradient, header = decode_with_header(buf, limits)
    except LimitExceededError as exc:  # the rest: see _as_refusal
        raise RefusedError(Reason.TOO_LARGE, str(exc)) from None
    _check_claim(gradient, claim)
    schema, problem, norm = check_gradient(gradient, expected, clip, step)
    if problem is not None:
        raise RefusedError.parse(problem)
    handed.append((gradient, header, schema, norm))


def _finished(writer: SpillWriter) -> bool:
    """Whether the spill file holds the whole document (its last bytes written); a disk
    without room for it (full, read-only) only means the input is read back from the node,
    as without a spill."""
    if writer.finish():
        return True
    log.warning(
        "writing spill file %s failed (%s): read back from the node", writer.path, writer.error
    )
    return False


async def verify_gradient(
    store: GradientStore,
    peer: str,
    gradient: Gradient,
    num_samples: int,
    *,
    expected: Schema | None,
    clip: bool,
    claim: Claim | None = None,
    announced: CID | None = None,
) -> VerifiedInput:
    """An input that came as arrays, not fetched: bound and checked as ``verify_input`` does,
    then encoded, its CID compared with ``announced`` (the one its peer signed, if any), and
    stored and pinned. It stays in memory (its arrays are there already)."""
    with _as_refusal():
        start = time.perf_counter()
        _check_claim(gradient, claim)
        schema, problem, norm = await asyncio.to_thread(check_gradient, gradient, expected, clip)
        if problem is not None:
            raise RefusedError.parse(problem)
        document = encode(gradient)
        cid = await asyncio.to_thread(file_cid, document)
        if announced is not None and cid != announced.to_v1():
            raise RefusedError(
                Reason.INTEGRITY,
                f"the arrays make document {cid}, the signed reply names {announced}",
            )
        stored = await store.put_document(document)
        return VerifiedInput(
            peer,
            stored,
            num_samples,
            document.size,
            schema,
            norm,
            gradient,
            tensor_infos(gradient, document),
            time.perf_counter() - start,
        )


def tensor_infos(gradient: Gradient, document: EncodedDocument) -> dict[str, TensorInfo]:
    """Where each tensor's data sits in ``document`` (what ``read_header`` would say).

    The document streams the arrays' own memory, so each tensor's data is the piece that
    shares memory with it; its offset is the length of the pieces before it. (An empty
    tensor has nothing to read back; its offset is only a position at or before its place.)
    """
    pieces = list(document)
    starts = np.cumsum([0, *(p.nbytes for p in pieces)])
    infos: dict[str, TensorInfo] = {}
    at = 0
    for name, arr in sorted(gradient.tensors.items(), key=lambda kv: kv[0].encode()):
        offset = int(starts[at])
        if arr.nbytes:
            while not np.shares_memory(np.asarray(pieces[at]), arr):
                at += 1
            offset = int(starts[at])
            at += 1
        code = dtype_code(arr.dtype)
        assert code is not None  # the gradient was built: its dtypes are storable
        infos[name] = TensorInfo(name, code, tuple(arr.shape), offset, int(arr.nbytes))
    return infos


@contextlib.contextmanager
def _as_refusal() -> Iterator[None]:
    """Whatever a document does wrong, as a ``RefusedError``; the node's failures pass."""
    try:
        yield
    except (RefusedError, NodeError):
        raise
    except IntegrityError as exc:  # a block that is not its CID's, wherever it came up
        raise RefusedError(Reason.INTEGRITY, str(exc)) from None
    except (
        GradstoreError
    ) as exc:  # a document that breaks the format, a DAG that is not a file, ...
        raise RefusedError(Reason.MALFORMED, str(exc)) from None


def _check_claim(gradient: Gradient | CompressedGradient, claim: Claim | None) -> None:
    """``RefusedError`` unless the document may be the one ``claim`` announced."""
    if claim is not None:
        unbound = check_binding(gradient.meta, claim)
        if unbound is not None:
            raise RefusedError.parse(unbound)


def check_gradient(
    gradient: Gradient | CompressedGradient,
    expected: Schema | None,
    clip: bool,
    step: StepConfig | None = None,
) -> tuple[Schema, str | None, float | None]:
    """Schema, the reason the gradient cannot enter the round (or None), and its norm.

    A compressed input's schema is its dense tensors' (names, dtypes, shapes); its values
    are checked, and its norm taken, after decompression: each must come back within its
    dtype, as ``get`` requires (else fedavg would overflow and cost the whole round).
    With a ``step``, every tensor must be one the step's selectors take."""
    schema = schema_of(gradient)
    if step is not None:
        problem = step_mismatch(schema, step)
        if problem is not None:
            return schema, problem, None
    if expected is not None and schema != expected:
        return (
            schema,
            reason_text(
                Reason.SCHEMA_MISMATCH,
                f"expected {schema_text(expected)}, got {schema_text(schema)}",
            ),
            None,
        )
    if isinstance(gradient, CompressedGradient):
        for name, t in gradient.tensors.items():
            if not t.is_finite():
                return schema, _non_finite(name), None
            at = first_beyond_dtype(t)
            if at is not None:
                value = float(t.read(at, at + 1)[0])
                return (
                    schema,
                    reason_text(
                        Reason.OUT_OF_RANGE,
                        f"tensor {name!r}: element {at} decompresses to {value:g}, "
                        f"beyond the range of its dtype {t.dtype_code}",
                    ),
                    None,
                )
        return schema, None, compressed_norm(gradient) if clip else None
    for name, arr in gradient.tensors.items():
        if not all_finite(arr):  # by blocks: no bool array of the tensor's size
            return schema, _non_finite(name), None
    return schema, None, global_norm(gradient.tensors) if clip else None


def step_mismatch(schema: Schema, step: StepConfig) -> str | None:
    """Why a document of ``schema`` is not ``step``'s (None: it may be): a tensor the step's
    selectors do not take, or no tensor at all (the step's ``[[schema]]``, or the schema
    learned for it, then says which tensors exactly)."""
    if step.covers_all:
        return None
    selectors = ", ".join(str(s) for s in step.tensors)
    if not schema:
        return reason_text(
            Reason.SCHEMA_MISMATCH,
            f"the document holds no tensor of step {step.name!r} ({selectors})",
        )
    for name, _, _ in schema:
        if not step.covers(name):
            return reason_text(
                Reason.SCHEMA_MISMATCH,
                f"tensor {name[:80]!r} is not one of step {step.name!r}'s ({selectors[:120]})",
            )
    return None


def _non_finite(name: str) -> str:
    return reason_text(Reason.NON_FINITE, f"tensor {name!r} holds NaN or Inf")
