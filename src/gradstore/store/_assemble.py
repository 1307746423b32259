"""The model-level document of a stepped round, assembled from its steps' outputs by ranges.

A stepped round aggregates each step on its own; its model-level output is one gradstore/1
document holding every closed step's output tensors (docs/spec.md, section 9.4), so that
``gradstore get`` gives the whole model's aggregate. ``open_model`` locates each step
output's tensors on the node (``format.HeaderWalk``: a few small windows per tensor, every
leaf hashed), and the ``ModelDocument`` it returns reads each tensor's bytes from its step
output, window by window, as the document is hashed or put: memory is a window or two,
never the model. ``model_cid`` only hashes it (an auditor's check); ``put_model`` stores it.

The model document's leaves are its own: under the CID profile (1 MiB chunks cut from the
start of the document), a chunk of it is a step output's block only when the same 1 MiB of
bytes starts at a chunk boundary in both, which the documents' different headers make a
matter of chance, except for chunks of the same bytes everywhere (all zeros). So ``put``
sends the model's bytes again; docs/spec.md, section 9.4 gives the measured figures.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from ..dag import CHUNK_SIZE, CID, file_cid
from ..errors import AssemblyError
from ..format import (
    DEFAULT_LIMITS,
    FLOATS,
    DocumentHeader,
    EncodedDocument,
    HeaderWalk,
    Limits,
    TensorInfo,
    check_layout,
    dense_layout,
)
from ..node import Node
from ._put import ByteProgress
from ._store import GradientStore
from ._stored import StoredDocument

#: Tensor data is read in stretches ending on multiples of this in the model document, so
#: the chunker cuts whole chunks out of them without copying; one chunk, so that the chunks
#: the hashing threads hold keep no more than themselves alive.
WINDOW: Final = CHUNK_SIZE
#: The ``kind`` in the meta of a step's output (``messages.step_aggregate_meta``).
STEP_KIND: Final = "aggregate"


@dataclass(frozen=True)
class StepOutput:
    """One step's output on a node: its document, read by ranges, and where its tensors are."""

    cid: CID
    document: StoredDocument
    header: DocumentHeader


async def open_output(node: Node, cid: CID | str, limits: Limits = DEFAULT_LIMITS) -> StepOutput:
    """Locate ``cid``'s tensors without fetching their data (every block read is hashed).

    Refusals: ``FormatError``/``LimitExceededError`` (not a document within ``limits``),
    ``IntegrityError``/``DAGError`` (a block that is not its CID's), ``NodeError``."""
    root = CID.parse(cid)
    document = await StoredDocument.open(node, root, limits.max_bytes)
    walk = HeaderWalk(document.size, limits)
    while (wanted := walk.wanted) is not None:
        start, length = wanted
        window = np.empty(length, dtype=np.uint8)
        await document.read_into(start, window)
        walk.feed(window.data)
    document.forget()
    return StepOutput(root, document, walk.header())


class ModelDocument(EncodedDocument):
    """The model-level document: its header pieces, and each tensor's bytes read from its step
    output as the iteration reaches them (again on every iteration).

    Iterate it off the event loop it was opened on (``asyncio.to_thread``, as ``put`` and
    :func:`model_cid` do): the reads run on that loop."""

    __slots__ = ("_layout", "_loop", "_sources", "outputs")

    def __init__(
        self,
        layout: list[bytes | str],
        size: int,
        sources: Mapping[str, tuple[StoredDocument, TensorInfo]],
        outputs: Sequence[StepOutput],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        super().__init__([], size)
        self._layout = layout
        self._sources = dict(sources)
        self._loop = loop
        self.outputs = tuple(outputs)

    def __repr__(self) -> str:
        return (
            f"<ModelDocument size={self.size} tensors={len(self._sources)} "
            f"from {len(self.outputs)} step outputs>"
        )

    def __iter__(self) -> Iterator[memoryview]:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            raise RuntimeError(
                "a ModelDocument reads its step outputs on its event loop: iterate it in "
                "another thread (asyncio.to_thread)"
            )
        pos = 0
        for piece in self._layout:
            if isinstance(piece, bytes):
                yield memoryview(piece)
                pos += len(piece)
                continue
            document, info = self._sources[piece]
            at = 0
            while at < info.nbytes:
                end = min(info.nbytes, (pos + at) // WINDOW * WINDOW + WINDOW - pos)
                window = np.empty(end - at, dtype=np.uint8)
                read = document.read_into(info.offset + at, window)
                asyncio.run_coroutine_threadsafe(read, self._loop).result()
                yield window.data
                at = end
            document.forget()  # a leaf per step output would add up
            pos += info.nbytes


async def open_model(
    node: Node,
    outputs: Sequence[CID | str],
    meta: Mapping[str, Any],
    *,
    kind: str = STEP_KIND,
    limits: Limits = DEFAULT_LIMITS,
) -> ModelDocument:
    """The model-level document of ``outputs`` (the steps' output CIDs, in the round record's
    order) with ``meta``: every output's tensors, in the document's order.

    Each output must be a dense (gradstore/1) document of float tensors whose meta ``kind``
    is ``kind``, and no tensor name may be in two of them (``AssemblyError``). The model
    document must fit ``limits`` (``LimitExceededError``). An output that cannot be read is
    refused as by :func:`open_output`.
    """
    opened: list[StepOutput] = []
    sources: dict[str, tuple[StoredDocument, TensorInfo]] = {}
    owner: dict[str, CID] = {}
    for cid in outputs:
        out = await open_output(node, cid, limits)
        _check_output(out, kind)
        for info in out.header.tensors:
            if info.name in owner:
                raise AssemblyError(
                    f"tensor {info.name!r:.80} is in two step outputs, {owner[info.name]} "
                    f"and {out.cid}"
                )
            owner[info.name] = out.cid
            sources[info.name] = (out.document, info)
        opened.append(out)
    described = {name: (i.dtype, i.shape, i.nbytes) for name, (_, i) in sources.items()}
    layout, size = dense_layout(meta, described)
    check_layout(size, meta, [(name, d[1]) for name, d in described.items()], limits)
    return ModelDocument(layout, size, sources, opened, asyncio.get_running_loop())


def _check_output(out: StepOutput, kind: str) -> None:
    header = out.header
    if header.codec is not None:
        raise AssemblyError(
            f"step output {out.cid} is compressed ({header.codec}); a step's output is a "
            "dense gradstore/1 document"
        )
    found = header.meta.get("kind")
    if found != kind:
        raise AssemblyError(
            f"step output {out.cid} is a document of kind {found!r:.60}, not {kind!r}"
        )
    for info in header.tensors:
        if info.dtype not in FLOATS:
            raise AssemblyError(
                f"step output {out.cid} holds tensor {info.name!r:.80} of dtype {info.dtype}; "
                "a step's output holds float tensors"
            )


async def model_cid(
    node: Node,
    outputs: Sequence[CID | str],
    meta: Mapping[str, Any],
    *,
    kind: str = STEP_KIND,
    limits: Limits = DEFAULT_LIMITS,
) -> CID:
    """The CID of :func:`open_model`'s document, computed without storing it."""
    document = await open_model(node, outputs, meta, kind=kind, limits=limits)
    return await asyncio.to_thread(file_cid, document)


async def put_model(
    store: GradientStore,
    outputs: Sequence[CID | str],
    meta: Mapping[str, Any],
    *,
    kind: str = STEP_KIND,
    pin: bool = True,
    progress: ByteProgress | None = None,
) -> CID:
    """Store :func:`open_model`'s document on ``store``'s node (pinned by default); its CID."""
    document = await open_model(store.node, outputs, meta, kind=kind, limits=store.limits)
    return await store.put_document(document, pin=pin, progress=progress)
