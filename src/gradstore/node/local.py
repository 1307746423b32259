"""``LocalNode``: the embedded node for first runs and users without Kubo.

Blocks live in ``<dir>/blocks/<cid>`` (one file per block, written atomically
and verified against its CID on every read and write), recursive pins in
``<dir>/pins`` (one CID per line, rewritten atomically), and pubsub is
in-process: shared by every ``LocalNode`` of the same resolved directory in
this process. Same CIDs and same verification as with Kubo; no network.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import os
import tempfile
import threading
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

from .._closing import AsyncClosing
from .._version import __version__
from ..dag.block import Block, block_links
from ..dag.car import CarReader, write_car
from ..dag.chunker import as_bytes_view
from ..dag.cid import CID, RAW, verify_block
from ..errors import BlockNotFoundError, LimitExceededError
from ._config import check_pubsub_size
from ._subscription import QueuedSubscription
from .base import NodeIdentity, PubsubMessage

if TYPE_CHECKING:
    from typing_extensions import Buffer

MAX_BLOCK_SIZE: Final = 2 << 20
"""Largest block stored (Kubo's and bitswap's 2 MiB limit)."""


class _Hub:
    """State shared by the LocalNodes of one directory in this process: pubsub, pins lock."""

    def __init__(self, peer_id: str) -> None:
        self.peer_id = peer_id
        self.pins_lock = threading.Lock()
        self.subscribers: dict[str, set[LocalSubscription]] = {}
        self.seqno = itertools.count(1)

    def deliver(self, message: PubsubMessage) -> None:
        for sub in list(self.subscribers.get(message.topic, ())):
            sub._deliver(message)


_HUBS: dict[Path, _Hub] = {}
_HUBS_LOCK = threading.Lock()


def _hub(path: Path) -> _Hub:
    with _HUBS_LOCK:
        hub = _HUBS.get(path)
        if hub is None:
            digest = hashlib.sha256(str(path).encode("utf-8")).hexdigest()[:16]
            hub = _HUBS[path] = _Hub(f"local-{digest}")
        return hub


def _atomic_write(path: Path, pieces: Iterable[Buffer]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            for piece in pieces:
                f.write(piece)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class LocalNode(AsyncClosing):
    """A ``Node`` in a directory; pubsub reaches the LocalNodes of that directory in-process."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser().resolve()
        self.blocks_dir = self.path / "blocks"
        self.pins_path = self.path / "pins"
        self.blocks_dir.mkdir(parents=True, exist_ok=True)
        self.name = f"local {self.path}"
        self._hub = _hub(self.path)
        self._subscriptions: set[LocalSubscription] = set()

    def __repr__(self) -> str:
        return f"LocalNode({str(self.path)!r})"

    async def aclose(self) -> None:
        for sub in list(self._subscriptions):
            await sub.aclose()

    async def identity(self) -> NodeIdentity:
        return NodeIdentity(
            peer_id=self._hub.peer_id, addresses=(), agent_version=f"gradstore/{__version__} local"
        )

    # --- blocks (blocking helpers, run in a thread) ----------------------------------------------

    def _block_path(self, cid: CID) -> Path:
        return self.blocks_dir / str(cid.to_v1())

    def _store(self, cid: CID, data: memoryview) -> None:
        if len(data) > MAX_BLOCK_SIZE:
            raise LimitExceededError(
                f"block {cid} of {len(data)} bytes is over the {MAX_BLOCK_SIZE}-byte limit",
                "max_block_bytes",
            )
        verify_block(cid, data)
        path = self._block_path(cid)
        if not path.exists():
            _atomic_write(path, (data,))

    def _load(self, cid: CID) -> bytes:
        try:
            data = self._block_path(cid).read_bytes()
        except FileNotFoundError:
            raise BlockNotFoundError(
                cid, f"block not found: {cid} (in {self.blocks_dir})"
            ) from None
        verify_block(cid, data)
        return data

    def _walk(self, root: CID, *, read_leaves: bool) -> Iterator[Block]:
        """Depth-first pre-order over the DAG, each block once.

        Raw leaves are only checked to exist unless ``read_leaves``.
        """
        seen: set[CID] = set()
        stack = [root]
        while stack:
            cid = stack.pop()
            if cid in seen:
                continue
            seen.add(cid)
            if cid.codec == RAW and not read_leaves:
                if not self._block_path(cid).exists():
                    raise BlockNotFoundError(cid, f"block not found: {cid} (in the DAG of {root})")
                continue
            block = Block(cid, self._load(cid))
            yield block
            stack.extend(reversed(block_links(block)))

    def _check_complete(self, root: CID) -> None:
        for _ in self._walk(root, read_leaves=False):
            pass

    def _read_pins(self) -> list[str]:
        try:
            text = self.pins_path.read_text("ascii")
        except FileNotFoundError:
            return []
        return [line.strip() for line in text.splitlines() if line.strip()]

    def _update_pins(
        self, add: CID | Sequence[CID] | None = None, remove: CID | None = None
    ) -> None:
        with self._hub.pins_lock:
            lines = self._read_pins()
            for cid in [add] if isinstance(add, CID) else add or ():
                if str(cid.to_v1()) not in lines:
                    lines.append(str(cid.to_v1()))
            if remove is not None:
                lines = [line for line in lines if line != str(remove.to_v1())]
            _atomic_write(self.pins_path, ["".join(f"{line}\n" for line in lines).encode("ascii")])

    # --- Node ------------------------------------------------------------------------------------

    async def put_block(self, data: Buffer, codec: int) -> CID:
        """Store one block under its CIDv1 (sha2-256)."""
        view = as_bytes_view(data)
        cid = await asyncio.to_thread(CID.hash, codec, view)
        await asyncio.to_thread(self._store, cid, view)
        return cid

    async def get_block(self, cid: CID) -> bytes:
        """The block's bytes, ``BlockNotFoundError`` if absent, ``IntegrityError`` if bad."""
        return await asyncio.to_thread(self._load, cid)

    async def has_block(self, cid: CID) -> bool:
        return self._block_path(cid).exists()

    async def import_car(
        self,
        body: AsyncIterable[Buffer] | Iterable[Buffer],
        *,
        pin_roots: bool = True,
        complete: bool = False,
    ) -> list[CID]:
        """Store every block of a CAR v1 stream (each verified); pin the header's roots.

        ``complete`` changes nothing here: pinning always checks the DAG (it is cheap locally).
        """
        reader = CarReader(MAX_BLOCK_SIZE)

        def feed(chunk: memoryview) -> None:
            for block in reader.feed(chunk):
                self._store(block.cid, memoryview(block.data))

        if isinstance(body, AsyncIterable):
            async for piece in body:
                await asyncio.to_thread(feed, as_bytes_view(piece))
        else:
            for piece in body:
                await asyncio.to_thread(feed, as_bytes_view(piece))
        reader.close()
        roots = list(reader.roots or [])
        if pin_roots:
            for root in roots:
                await self.pin(root)
        return roots

    async def export_car(self, root: CID) -> AsyncIterator[bytes]:
        """The DAG under ``root`` as a CAR v1 stream (depth-first, each block once, verified)."""
        pieces = write_car([root], self._walk(root, read_leaves=True))
        end = object()
        while True:
            piece = await asyncio.to_thread(next, pieces, end)
            if piece is end:
                return
            assert isinstance(piece, bytes | memoryview)
            yield piece if isinstance(piece, bytes) else bytes(piece)

    async def pin(self, cid: CID, *, recursive: bool = True) -> None:
        """Pin; ``BlockNotFoundError`` unless the whole DAG (or, direct, the block) is stored."""
        if recursive:
            await asyncio.to_thread(self._check_complete, cid)
        elif not await self.has_block(cid):
            raise BlockNotFoundError(cid)
        await asyncio.to_thread(self._update_pins, add=cid)

    async def pin_many(self, cids: Sequence[CID]) -> None:
        """Pin each recursively, the pins file written once; ``BlockNotFoundError`` (and
        nothing pinned) if any DAG is incomplete."""
        for cid in cids:
            await asyncio.to_thread(self._check_complete, cid)
        await asyncio.to_thread(self._update_pins, add=cids)

    async def unpin(self, cid: CID) -> None:
        await asyncio.to_thread(self._update_pins, remove=cid)

    async def pins(self) -> set[CID]:
        return {CID.parse(line) for line in await asyncio.to_thread(self._read_pins)}

    async def publish(self, topic: str, data: bytes) -> None:
        """Deliver to every subscription of ``topic`` on this directory in this process."""
        check_pubsub_size(topic, data)
        seqno = next(self._hub.seqno).to_bytes(8, "big")
        self._hub.deliver(PubsubMessage(topic, bytes(data), self._hub.peer_id, seqno))

    def subscribe(self, topic: str) -> LocalSubscription:
        return LocalSubscription(self, topic)


class LocalSubscription(QueuedSubscription):
    """An in-process subscription, active from ``async with`` (or ``ready()``) to ``aclose()``."""

    def __init__(self, node: LocalNode, topic: str) -> None:
        super().__init__(topic)
        self.node = node
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"LocalSubscription({str(self.node.path)!r}, {self.topic!r})"

    async def _activate(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self.node._hub.subscribers.setdefault(self.topic, set()).add(self)
            self.node._subscriptions.add(self)

    def _deliver(self, message: PubsubMessage) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._queue.put_nowait(message)
        else:
            loop.call_soon_threadsafe(self._queue.put_nowait, message)

    async def _deactivate(self) -> None:
        subs = self.node._hub.subscribers.get(self.topic)
        if subs is not None:
            subs.discard(self)
        self.node._subscriptions.discard(self)
