"""``KuboNode``: the ``Node`` interface over Kubo's RPC API (``/api/v0``), plus Kubo's own calls.

``KuboClient`` sends (one httpx client, mapped errors, retries), ``rpc`` builds requests
and parses answers, ``bulk`` reads large ``cat`` answers on a blocking socket, and
``KuboSubscription`` drains ``pubsub/sub``; this module says which command does what.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from ..._closing import AsyncClosing
from ...dag.block import Block
from ...dag.chunker import as_bytes_view
from ...dag.cid import CID, verify_block
from ...errors import (
    BlockNotFoundError,
    DAGError,
    IntegrityError,
    NodeError,
    NodeTimeoutError,
)
from .._config import Retry, check_pubsub_size
from ..base import NodeIdentity
from . import bulk as _bulk
from . import rpc
from .client import KuboClient
from .guarded_import import CanaryGuardedImport
from .kept import KeptCalls
from .settings import DEFAULT_API, DEFAULT_TIMEOUTS, Timeouts
from .subscription import KuboSubscription

if TYPE_CHECKING:
    from typing_extensions import Buffer

#: The largest block ``get_block`` takes from Kubo (gradstore's are at most 1 MiB; bitswap
#: carries up to 2 MiB).
MAX_BLOCK_BYTES = _bulk.MAX_BLOCK_BYTES
#: A CAR given whole (a list of pieces) up to this size goes in one scattered send from a
#: worker thread (``_import_small``), not through httpx.
SMALL_IMPORT_BYTES = 16 << 20

T = TypeVar("T")


class KuboNode(AsyncClosing):
    """A Kubo daemon reached over its RPC API; implements ``Node`` plus a few Kubo-only calls.

    ``auth`` is sent as the ``Authorization`` header (Kubo's
    ``API.Authorizations``, e.g. ``"Bearer <secret>"`` or ``"Basic ..."``).
    ``retries`` is the number of extra attempts for calls that are safe to repeat.
    ``transport`` is for tests (``httpx.MockTransport``).
    """

    def __init__(
        self,
        api: str = DEFAULT_API,
        *,
        auth: str | None = None,
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
        retries: int = 3,
        retry: Retry | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.client = KuboClient(
            api,
            auth=auth,
            timeouts=timeouts,
            retry=retry if retry is not None else Retry(retries=retries),
            transport=transport,
        )
        self.api = self.client.api
        self.name = f"kubo {self.api}"
        self.timeouts = timeouts
        self.retry = self.client.retry
        self._publish_lock = asyncio.Lock()
        # publishes go one at a time on a connection of their own (``kept``), not httpx
        self._kept = KeptCalls(self.api, auth=self.client.auth, timeouts=timeouts)
        # and quick pin calls on another (``_pin_call``): a pin waits on the node's disk
        self._pin_calls = KeptCalls(self.api, auth=self.client.auth, timeouts=timeouts)
        self._subscriptions: set[KuboSubscription] = set()

    def __repr__(self) -> str:
        return f"KuboNode({self.api!r})"

    async def aclose(self) -> None:
        """Close every open subscription and the HTTP client."""
        for sub in list(self._subscriptions):
            await sub.aclose()
        self._kept.close()
        self._pin_calls.close()
        await self.client.aclose()

    # --- Node ------------------------------------------------------------------------------------

    async def identity(self) -> NodeIdentity:
        """``id``: peer id, listen addresses, agent version."""
        return rpc.parse_identity(await self.client.json("id"))

    async def version(self) -> str:
        """Kubo's version string, e.g. ``"0.42.0"``."""
        return rpc.parse_version(await self.client.json("version"))

    async def import_car(
        self,
        body: AsyncIterable[Buffer] | Iterable[Buffer],
        *,
        pin_roots: bool = True,
        complete: bool = False,
    ) -> list[CID]:
        """``dag/import`` of one CAR stream; return its roots, pinned unless told not to.

        The body is streamed once (no retry: an iterator cannot be replayed).
        By default roots are pinned afterwards with ``offline=true`` after a
        ``dag/stat`` walk, so a root whose DAG is incomplete raises
        ``BlockNotFoundError`` at once (Kubo's own ``pin-roots`` would search
        the network until the request times out). With ``complete=True`` the
        caller vouches for the DAG and Kubo pins the roots itself in the same
        request (one walk fewer); the roots are then the ones Kubo reports.
        """
        seen = rpc.CarRoots()
        kubo_pins = pin_roots and complete
        if isinstance(body, list | tuple) and self.bulk_reads:
            pieces = [as_bytes_view(piece) for piece in body]
            if sum(piece.nbytes for piece in pieces) <= SMALL_IMPORT_BYTES:
                for piece in pieces:
                    seen.see(piece)
                answer = await self._import_small(
                    pieces, rpc.dag_import_params(pin_roots=kubo_pins)
                )
                return await self._imported(answer, seen, pin_roots=pin_roots, kubo_pins=kubo_pins)

        async def tap() -> AsyncIterator[Buffer]:
            if isinstance(body, AsyncIterable):
                async for piece in body:
                    seen.see(piece)
                    yield piece
            else:
                for piece in body:
                    seen.see(piece)
                    yield piece

        answer = await self.client.upload(
            "dag/import",
            rpc.dag_import_params(pin_roots=kubo_pins),
            tap(),
            retry=False,
            filename="import.car",
        )
        return await self._imported(answer, seen, pin_roots=pin_roots, kubo_pins=kubo_pins)

    async def _import_small(self, pieces: list[memoryview], params: rpc.Params) -> bytes:
        """``dag/import`` of a small CAR given whole (``pieces``) on a socket of its own in a
        worker thread, in one scattered send: httpx wrote it a piece at a time from the
        event loop, 2-3 ms of its CPU for a step's 1 MiB aggregate (docs/design/storage.md)."""
        boundary = rpc.new_boundary()
        body = rpc.multipart_parts(pieces, boundary, filename="import.car")
        read = _bulk.BulkRead(
            self.api,
            "dag/import",
            params,
            auth=self.client.auth,
            length=sum(piece.nbytes for piece in body),
            content_type=rpc.multipart_content_type(boundary),
        )

        def overflow() -> Exception:
            return NodeError(f"kubo dag/import: an answer over {_bulk.MAX_BLOCK_BYTES} bytes")

        def send() -> bytes:
            out = _bulk.thread_buffer()
            return bytes(out[: read.into(out, self.timeouts, overflow=overflow, body=body)])

        return await _in_thread(read, send)

    async def _imported(
        self, answer: bytes, seen: rpc.CarRoots, *, pin_roots: bool, kubo_pins: bool
    ) -> list[CID]:
        """The roots of an imported CAR (``seen`` in its header), pinned as ``import_car``
        says, from Kubo's ``answer``."""
        pinned = rpc.parse_dag_import(rpc.parse_ndjson("dag/import", answer))  # raises on errors
        if seen.roots is None:
            raise DAGError("dag/import: the body ended before its CAR header")
        if kubo_pins:
            return pinned
        if pin_roots:
            for root in seen.roots:
                await self.pin(root, offline=True)
        return list(seen.roots)

    def guarded_import(self) -> CanaryGuardedImport:
        """Send a new DAG over several requests and pin its root without Kubo's walk.

        Kubo's GC cannot take a block on the way unnoticed: see ``CanaryGuardedImport``.
        """
        return CanaryGuardedImport(self)

    def export_car(self, root: CID, *, offline: bool = False) -> AsyncIterator[bytes]:
        """``dag/export``: the DAG under ``root`` as a CAR v1 byte stream.

        Retried until the first byte; after that a failure raises. Kubo signals
        a mid-stream failure only in an HTTP trailer httpx cannot read, so the
        stream just ends early: callers verify the CAR (every block, complete DAG).
        ``offline=True`` never fetches from the network.
        """
        params: rpc.Params = [("arg", str(root))]
        if offline:
            params.append(("offline", "true"))
        return self.client.chunks("dag/export", params, cid=root)

    async def put_block(self, data: Buffer, codec: int) -> CID:
        """``block/put`` (CIDv1, sha2-256); the CID Kubo reports must equal the local hash."""
        view = as_bytes_view(data)
        expected = CID.hash(codec, view)
        answer = await self.client.upload(
            "block/put", rpc.block_put_params(codec), (view,), retry=True
        )
        got = rpc.parse_block_put(rpc.parse_json("block/put", answer))
        if got != expected:
            raise IntegrityError(expected, f"kubo block/put stored {got}, expected {expected}")
        return got

    async def get_block(self, cid: CID) -> bytes:
        """``block/get`` (may fetch over bitswap); the bytes are verified against ``cid``.

        With a plain http API the answer is read on a socket of its own in a worker thread
        (``bulk``), as ``cat_into``'s: a fifth of httpx's CPU for a small block (0.2 ms
        against 1.1 ms a call, 16 at once: a coordinator reads every input's root so).
        """
        if self.bulk_reads:
            data = await self.retry.call(
                functools.partial(self._get_block_bulk, cid), retry_on=self.client.transient
            )
        else:
            data = await self.client.call("block/get", [("arg", str(cid))], cid=cid)
        verify_block(cid, data)
        return data

    async def _get_block_bulk(self, cid: CID) -> bytes:
        """One ``block/get`` by ``BulkRead`` into the reading thread's block buffer (mapped
        once per thread, only the pages blocks fill are touched), copied out; a block over
        ``MAX_BLOCK_BYTES`` is refused. A mapping per block cost its unmapping, 0.4 ms on
        the event loop, for every input's root."""

        def overflow() -> Exception:
            return NodeError(f"kubo block/get {cid}: a block over {MAX_BLOCK_BYTES} bytes")

        read = _bulk.BulkRead(
            self.api, "block/get", [("arg", str(cid))], auth=self.client.auth, cid=cid
        )

        def get() -> bytes:
            view = _bulk.thread_buffer()
            n = read.into(view, self.timeouts, overflow=overflow)
            return bytes(view[:n])

        return await _in_thread(read, get)

    async def block_stat(self, cid: CID, *, offline: bool = False) -> int:
        """``block/stat``: the block's size in bytes."""
        params: rpc.Params = [("arg", str(cid))]
        if offline:
            params.append(("offline", "true"))
        return rpc.parse_block_stat(await self.client.json("block/stat", params, cid=cid))

    async def has_block(self, cid: CID) -> bool:
        """Whether the block is in Kubo's local blockstore (``block/stat``, ``offline=true``)."""
        try:
            await self.block_stat(cid, offline=True)
        except BlockNotFoundError:
            return False
        return True

    async def dag_stat(self, cid: CID, *, offline: bool = False) -> dict[str, Any]:
        """``dag/stat``: walks the whole DAG (``BlockNotFoundError`` names a missing block)."""
        params: rpc.Params = [("arg", str(cid)), ("progress", "false")]
        if offline:
            params.append(("offline", "true"))
        items = rpc.parse_ndjson("dag/stat", await self.client.call("dag/stat", params, cid=cid))
        result: dict[str, Any] = items[-1] if items else {}
        return result

    async def pin(self, cid: CID, *, recursive: bool = True, offline: bool = False) -> None:
        """``pin/add``; Kubo fetches missing blocks from its peers unless ``offline``.

        Offline, the DAG is first checked with ``dag/stat`` (Kubo 0.42's pinner
        would still wait on the network for a missing child block). A direct pin
        (``recursive=False``) keeps the one block and walks nothing.
        """
        params: rpc.Params = [("arg", str(cid)), ("recursive", rpc.flag(recursive))]
        if offline:
            if recursive:
                await self.dag_stat(cid, offline=True)
            else:
                await self.block_stat(cid, offline=True)
            params.append(("offline", "true"))
        if recursive:
            await self.client.call("pin/add", params, cid=cid)
        else:  # one block, no walk: a record just stored, 64 a round of 64 steps
            await self._pin_call("pin/add", params, cid=cid)

    async def pin_many(self, cids: Sequence[CID]) -> None:
        """One recursive ``pin/add`` of every CID (an ``arg`` each) not already pinned so;
        Kubo fetches missing blocks from its peers. A failure names no CID reliably: pin
        them one by one to know."""
        pinned = await self.pinned_recursively(cids) if cids else set()
        cids = [cid for cid in cids if cid not in pinned]
        if not cids:
            return
        params: rpc.Params = [("arg", str(cid)) for cid in cids]
        params.append(("recursive", "true"))
        await self.client.call("pin/add", params, cid=cids[0] if len(cids) == 1 else None)

    async def pinned_recursively(self, cids: Sequence[CID]) -> set[CID]:
        """Which of ``cids`` Kubo already pins recursively, from one offline ``pin/ls``.

        ``pin_many`` (the coordinator's pins of its inputs) skips those: Kubo keeps one
        recursive pin per CID, so a second ``pin/add`` changes nothing but re-walks the
        whole DAG (0.34 s of Kubo's CPU per GiB, 2 ms for a 1 MiB document alone), as when a
        peer stored its input on the coordinator's node. Kubo lists the CIDs in order up to
        the first that is not pinned; after that, or on any error, a CID counts as not
        pinned (and is pinned as before)."""
        params: rpc.Params = [("arg", str(cid)) for cid in cids]
        params += [("type", "recursive"), ("stream", "true"), ("offline", "true")]
        try:
            body = await self._pin_call("pin/ls", params, partial=True, retry=False)
        except NodeError:
            return set()
        return rpc.parse_pinned_stream(body) & set(cids)

    async def _pin_call(
        self,
        command: str,
        params: rpc.Params,
        *,
        cid: CID | None = None,
        partial: bool = False,
        retry: bool = True,
    ) -> bytes:
        """A quick pin call (an offline ``pin/ls``, a direct pin) on a kept connection of
        its own, one at a time: 145 of them in a round of 64 steps cost 0.8 ms of the
        event loop each through httpx (``kept``). Through httpx when bulk reads are off
        (an https API, a test transport), with ``retry`` as before (its answers are always
        ``partial``)."""
        if not self.bulk_reads:
            return await self.client.call(command, params, cid=cid, retry=retry)
        return await self._pin_calls.call(command, params, cid=cid, partial=partial)

    async def unpin(self, cid: CID) -> None:
        """``pin/rm`` of a recursive pin; a CID that is not pinned is left as is."""
        try:
            await self.client.call("pin/rm", [("arg", str(cid)), ("recursive", "true")], cid=cid)
        except NodeError as error:
            if not rpc.is_not_pinned(error):
                raise

    async def pins(self) -> set[CID]:
        """``pin/ls --type=recursive``."""
        return rpc.parse_pin_ls(await self.client.json("pin/ls", [("type", "recursive")]))

    async def publish(self, topic: str, data: bytes) -> None:
        """``pubsub/pub``; serialized per node and retried (concurrent publishes race in Kubo)."""
        check_pubsub_size(topic, data)
        async with self._publish_lock:
            if not self.bulk_reads:
                await self.client.upload(
                    "pubsub/pub", rpc.pubsub_pub_params(topic), (data,), retry=True
                )
                return
            boundary = rpc.new_boundary()
            publish = functools.partial(
                self._kept.call,
                "pubsub/pub",
                rpc.pubsub_pub_params(topic),
                rpc.multipart_parts([data], boundary),
                content_type=rpc.multipart_content_type(boundary),
            )
            await self.retry.call(publish, retry_on=self.client.transient)

    def subscribe(self, topic: str) -> KuboSubscription:
        """A ``pubsub/sub`` stream; ``async with`` returns once Kubo is subscribed."""
        return KuboSubscription(self.client, topic, live=self._subscriptions)

    # --- Kubo-only -------------------------------------------------------------------------------

    async def add_bytes(
        self,
        pieces: AsyncIterable[Buffer] | Iterable[Buffer],
        only_hash: bool = False,
        **params: str | bool | int,
    ) -> CID:
        """``add`` one file streamed from ``pieces``; its root CID under the node's import settings.

        For parity tests with ``ipfs add``. Extra ``params`` are passed through
        (``cid_version=1`` becomes ``cid-version=1``). Not retried.
        """
        query: rpc.Params = [("only-hash", rpc.flag(only_hash)), ("pin", rpc.flag(not only_hash))]
        for key, value in params.items():
            name = key.replace("_", "-")
            query = [(k, v) for k, v in query if k != name]
            query.append((name, rpc.flag(value) if isinstance(value, bool) else str(value)))
        answer = await self.client.upload("add", query, pieces, retry=False, filename="gradient")
        return rpc.parse_add(rpc.parse_ndjson("add", answer))

    async def import_car_gc_locked(self, car: AsyncIterable[Buffer], *, guard: CID) -> None:
        """``dag/import`` of ``car`` holding Kubo's GC lock for the whole request; nothing pinned.

        The lock comes with ``pin-roots=true``; the CAR's only root must be
        ``guard``, a CID never stored, so Kubo has nothing to pin (it reports
        ``guard`` as unpinnable, which is expected) and walks nothing. Not retried.
        """
        answer = await self.client.upload(
            "dag/import", rpc.guarded_import_params(), car, retry=False, filename="import.car"
        )
        rpc.parse_guarded_import(rpc.parse_ndjson("dag/import", answer), guard)

    async def dag_put(self, block: Block, *, pin: bool) -> CID:
        """``dag/put`` of one raw or dag-pb block stored as it is; return the CID Kubo reports.

        With ``pin`` Kubo records a recursive pin without walking the DAG (the
        caller vouches for it). Retried: storing and pinning a block again is harmless.
        """
        boundary = rpc.new_boundary()
        answer = await self.client.call(
            "dag/put",
            rpc.dag_put_params(block.cid.codec, pin=pin),
            body=lambda: rpc.multipart_stream([block.data], boundary, filename="root"),
            boundary=boundary,
            length=rpc.multipart_length([block.data], boundary, filename="root"),
        )
        items = rpc.parse_ndjson("dag/put", answer)  # an error after the CID line raises here
        return rpc.parse_dag_put(items[0] if len(items) == 1 else items)

    async def cat(
        self, cid: CID, *, offset: int = 0, length: int | None = None
    ) -> AsyncIterator[bytes]:
        """``cat``: a UnixFS file's content (or ``length`` bytes from ``offset``), streamed."""
        async with self.client.open(
            "cat", rpc.cat_params(cid, offset, length), cid=cid
        ) as response:
            async for chunk in response.aiter_bytes():
                yield chunk

    @property
    def bulk_reads(self) -> bool:
        """Whether ``cat_into`` reads on its own socket (plain ``http://`` API, no test transport)."""
        return self.client.transport is None and _bulk.supported(self.api)

    async def cat_into(
        self,
        cid: CID,
        out: Buffer,
        *,
        offset: int = 0,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """``cat`` a UnixFS file into the writable buffer ``out``; return the bytes written.

        With ``offset``, the file's bytes from there, ``len(out)`` of them at most.

        The bytes are not verified here (``GradientStore`` hashes every leaf
        in place). ``IntegrityError`` if the node sends more than ``len(out)``.
        With a plain ``http://`` API the body is read in a worker thread
        straight into ``out`` (no per-chunk copies on the event loop);
        ``progress(n)`` is then called from that thread as the prefix grows.
        """
        view = memoryview(out).cast("B")
        if view.readonly:
            raise TypeError("cat_into needs a writable buffer")

        def overflow() -> Exception:
            return IntegrityError(cid, f"kubo cat {cid}: the node sent more than {len(view)} bytes")

        length = len(view)  # a whole file of that size, or that many bytes from `offset`
        if not self.bulk_reads:
            pos = 0
            async for chunk in self.cat(cid, offset=offset, length=length):
                if pos + len(chunk) > len(view):
                    raise overflow()
                view[pos : pos + len(chunk)] = chunk
                pos += len(chunk)
                if progress is not None:
                    progress(pos)
            return pos

        return await self._bulk_into(
            "cat", rpc.cat_params(cid, offset, length), cid, view, overflow, progress
        )

    async def _bulk_into(
        self,
        command: str,
        params: rpc.Params,
        cid: CID,
        view: memoryview,
        overflow: Callable[[], Exception],
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """``command``'s answer body into ``view`` by a ``BulkRead`` in a worker thread; a
        cancelled caller closes its socket, which ends the thread at once."""
        read = _bulk.BulkRead(self.api, command, params, auth=self.client.auth, cid=cid)
        return await _in_thread(
            read,
            functools.partial(read.into, view, self.timeouts, overflow=overflow, progress=progress),
        )

    async def swarm_connect(self, multiaddr: str) -> None:
        """``swarm/connect`` to a peer's ``/ip4/.../tcp/.../p2p/<id>`` address."""
        await self.client.call("swarm/connect", [("arg", multiaddr)])

    async def swarm_peers(self) -> list[str]:
        """Peer ids this node is connected to."""
        return rpc.parse_swarm_peers(await self.client.json("swarm/peers"))

    async def find_providers(self, cid: CID, *, limit: int = 1, timeout: float = 2.0) -> list[str]:
        """``routing/findprovs``: peers the routing names as providers of ``cid``, at most
        ``limit``, found within ``timeout`` seconds (what was found by then; none when the
        node has no routing, as the tests' daemons)."""
        params = [("arg", str(cid)), ("num-providers", str(limit))]
        found: dict[str, None] = {}
        with contextlib.suppress(TimeoutError):
            async with (
                asyncio.timeout(timeout),
                self.client.open("routing/findprovs", params) as response,
            ):
                async for line in response.aiter_lines():
                    if line.strip():
                        event = rpc.parse_json("routing/findprovs", line.encode())
                        found.update(dict.fromkeys(rpc.parse_providers(event)))
                    if len(found) >= limit:
                        break
        return list(found)[:limit]

    async def pubsub_peers(self, topic: str | None = None) -> list[str]:
        """Peers known to be subscribed to ``topic`` (all pubsub peers when ``None``)."""
        params = rpc.pubsub_sub_params(topic) if topic is not None else []
        return rpc.parse_strings(await self.client.json("pubsub/peers", params), "pubsub/peers")

    async def pubsub_topics(self) -> list[str]:
        """Topics this node is subscribed to."""
        encoded = rpc.parse_strings(await self.client.json("pubsub/ls"), "pubsub/ls")
        return [rpc.decode_multibase(t).decode("utf-8", "replace") for t in encoded]

    async def wait_for_topic_peers(
        self,
        topic: str,
        peers: Iterable[str] | int = 1,
        *,
        timeout: float = 10.0,
        interval: float = 0.05,
    ) -> list[str]:
        """Wait until this node knows the given peers (or that many) subscribe to ``topic``.

        Pubsub delivers a message only to peers the publisher knows are
        subscribed, which it learns a moment after they subscribe: call this
        before a first publish that must not be lost.
        """
        wanted = peers if isinstance(peers, int) else set(peers)
        deadline = time.monotonic() + timeout
        while True:
            known = await self.pubsub_peers(topic)
            if (len(known) >= wanted) if isinstance(wanted, int) else wanted <= set(known):
                return known
            if time.monotonic() >= deadline:
                raise NodeTimeoutError(
                    f"{self.name}: after {timeout}s only {len(known)} peer(s) "
                    f"subscribed to {topic!r}: {known}"
                )
            await asyncio.sleep(interval)


async def _in_thread(read: _bulk.BulkRead, call: Callable[[], T]) -> T:
    """``call`` (which runs ``read``) in a worker thread; a cancelled caller closes the
    read's socket, which ends the thread at once."""
    transfer = asyncio.ensure_future(asyncio.to_thread(call))
    try:
        return await asyncio.shield(transfer)
    except asyncio.CancelledError:
        read.abort()  # unblocks the worker thread at once
        with contextlib.suppress(Exception):
            await transfer
        raise
