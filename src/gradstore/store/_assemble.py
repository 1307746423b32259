"""The model-level document of a stepped round, assembled from its steps' outputs by ranges.

A stepped round aggregates each step on its own; its model-level output is one gradstore/1
document holding every closed step's output tensors (docs/spec.md, section 9.4), so that
``gradstore get`` gives the whole model's aggregate. ``open_model`` locates each step
output's tensors on the node (``format.HeaderWalk``: a few small windows per tensor, every
leaf hashed), and the ``ModelDocument`` it returns reads each tensor's bytes from its step
output, window by window, as the document is hashed or put: memory is a window or two,
never the model. ``model_cid`` only hashes it (an auditor's check); ``put_model`` stores it.
A coordinator that still holds a step's output in memory (it has just stored it) passes it
as ``held``: its tensors' bytes are then taken from its arrays, not read back from the node
and hashed again (4 reads a step: 256 for a round of 64 steps).

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
    Gradient,
    HeaderWalk,
    Limits,
    TensorInfo,
    check_layout,
    dense_layout,
    dtype_code,
    numpy_dtype,
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

#: Where a tensor's bytes come from: its step output on the node and its place there, or
#: its array (little-endian, C order) in a step output held in memory.
Source = tuple[StoredDocument, TensorInfo] | np.ndarray[Any, Any]


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
        sources: Mapping[str, Source],
        outputs: Sequence[StepOutput | CID],
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
            source = self._sources[piece]
            if isinstance(source, np.ndarray):
                yield from _windows(source, pos)
                pos += source.nbytes
                continue
            document, info = source
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
    held: Mapping[CID, Gradient] | None = None,
) -> ModelDocument:
    """The model-level document of ``outputs`` (the steps' output CIDs, in the round record's
    order) with ``meta``: every output's tensors, in the document's order.

    Each output must be a dense (gradstore/1) document of float tensors whose meta ``kind``
    is ``kind``, and no tensor name may be in two of them (``AssemblyError``). The model
    document must fit ``limits`` (``LimitExceededError``). An output that cannot be read is
    refused as by :func:`open_output`. ``held``: outputs the caller holds in memory, by the
    CID it stored each as (trusted: not hashed again), whose tensors are taken from there.
    """
    opened: list[StepOutput | CID] = []
    sources: dict[str, Source] = {}
    described: dict[str, tuple[str, tuple[int, ...], int]] = {}
    owner: dict[str, CID] = {}
    for cid in outputs:
        root = CID.parse(cid)
        kept = None if held is None else held.get(root)
        if kept is not None:
            tensors = _held(root, kept, kind)
            opened.append(root)
        else:
            out = await open_output(node, root, limits)
            _check_output(out, kind)
            tensors = [(i.name, i.dtype, i.shape, (out.document, i)) for i in out.header.tensors]
            opened.append(out)
        for name, code, shape, source in tensors:
            if name in owner:
                raise AssemblyError(
                    f"tensor {name!r:.80} is in two step outputs, {owner[name]} and {root}"
                )
            owner[name] = root
            sources[name] = source
            nbytes = source.nbytes if isinstance(source, np.ndarray) else source[1].nbytes
            described[name] = (code, shape, nbytes)
    layout, size = dense_layout(meta, described)
    check_layout(size, meta, [(name, d[1]) for name, d in described.items()], limits)
    return ModelDocument(layout, size, sources, opened, asyncio.get_running_loop())


def _windows(array: np.ndarray[Any, Any], pos: int) -> Iterator[memoryview]:
    """``array``'s bytes, placed at ``pos`` in the model document, cut where its windows
    end (views of the array's memory, as the reads from a node are cut)."""
    data = array.reshape(-1).view(np.uint8).data
    at = 0
    while at < len(data):
        end = min(len(data), (pos + at) // WINDOW * WINDOW + WINDOW - pos)
        yield data[at:end]
        at = end


def _held(cid: CID, output: Gradient, kind: str) -> list[tuple[str, str, tuple[int, ...], Source]]:
    """(name, dtype, shape, array) of each tensor of a step output held in memory, checked
    as ``_check_output`` checks one read from the node (its arrays as ``encode`` writes
    them: little-endian, C order)."""
    found = output.meta.get("kind")
    if found != kind:
        raise AssemblyError(f"step output {cid} is a document of kind {found!r:.60}, not {kind!r}")
    out: list[tuple[str, str, tuple[int, ...], Source]] = []
    for name, value in output.tensors.items():
        code = dtype_code(np.asarray(value).dtype)
        if code not in FLOATS:
            raise AssemblyError(
                f"step output {cid} holds tensor {name!r:.80} of dtype {code}; "
                "a step's output holds float tensors"
            )
        array = np.asarray(value, dtype=numpy_dtype(code), order="C")  # no copy if it is
        out.append((name, code, tuple(array.shape), array))
    return out


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
    held: Mapping[CID, Gradient] | None = None,
) -> CID:
    """The CID of :func:`open_model`'s document, computed without storing it."""
    document = await open_model(node, outputs, meta, kind=kind, limits=limits, held=held)
    return await asyncio.to_thread(file_cid, document)


async def put_model(
    store: GradientStore,
    outputs: Sequence[CID | str],
    meta: Mapping[str, Any],
    *,
    kind: str = STEP_KIND,
    pin: bool = True,
    progress: ByteProgress | None = None,
    held: Mapping[CID, Gradient] | None = None,
) -> CID:
    """Store :func:`open_model`'s document on ``store``'s node (pinned by default); its CID.
    ``held``: step outputs in memory, as :func:`open_model` takes them."""
    document = await open_model(
        store.node, outputs, meta, kind=kind, limits=store.limits, held=held
    )
    return await store.put_document(document, pin=pin, progress=progress)
