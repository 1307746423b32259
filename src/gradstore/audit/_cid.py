"""verify_cid: fetch a CID, check every block, decode strictly, re-encode and compare the CID."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from ..dag import CID, EMPTY_FILE, build_file
from ..errors import (
    AuditError,
    CIDError,
    DAGError,
    FormatError,
    IntegrityError,
    LimitExceededError,
    NodeError,
)
from ..format import (
    COMPRESSED_FORMAT_ID,
    FORMAT_ID,
    CompressedGradient,
    DocumentHeader,
    EncodedDocument,
    Gradient,
    decode_with_header,
    encode,
)
from ..store import ByteProgress, GradientStore, Sink


@dataclass(frozen=True)
class CidReport:
    """What ``verify_cid`` established about one gradient document."""

    cid: CID
    size: int
    blocks: int
    tensors: int
    kind: str | None
    seconds: float
    format: str = "gradstore/1"  # or gradstore/2, a compressed document


def parse_cid(text: str | CID, check: str = "cid") -> CID:
    """``CID.parse`` whose refusal is an ``AuditError`` naming ``check``."""
    try:
        return CID.parse(text)
    except (CIDError, ValueError) as exc:
        raise AuditError(check, f"{text!r} is not a CID: {exc}") from None


async def fetch_gradient(
    store: GradientStore,
    cid: CID,
    what: str,
    prefix: str = "",
    progress: ByteProgress | None = None,
) -> Gradient | CompressedGradient:
    """Fetch (every block hash-checked) and strictly decode ``cid`` (dense or compressed);
    failures name the check."""
    return (await fetch_with_header(store, cid, what, prefix, progress))[0]


async def fetch_with_header(
    store: GradientStore,
    cid: CID,
    what: str,
    prefix: str = "",
    progress: ByteProgress | None = None,
    sink: Sink | None = None,
) -> tuple[Gradient | CompressedGradient, DocumentHeader]:
    """:func:`fetch_gradient`, and where each tensor lives in the document (``sink``:
    gives the buffer the document is fetched into and hears of each prefix hashed, a
    spill file's writer).

    Checks: ``{prefix}fetch`` (the node cannot serve it), ``{prefix}blocks`` (a block does
    not hash to its CID or the DAG is malformed), ``{prefix}decode`` (not a valid gradstore/1
    or gradstore/2 document within the store's limits).
    """
    try:
        buf = await store.fetch_document(cid, progress=progress, sink=sink)
    except IntegrityError as exc:
        raise AuditError(f"{prefix}blocks", f"{what} {cid}: {exc}") from exc
    except (DAGError, LimitExceededError) as exc:
        raise AuditError(
            f"{prefix}blocks", f"{what} {cid} is not a valid UnixFS file: {exc}"
        ) from exc
    except NodeError as exc:
        raise AuditError(f"{prefix}fetch", f"cannot fetch {what} {cid}: {exc}") from exc
    try:
        # off the loop: a compressed payload's checks take time in proportion to it
        return await asyncio.to_thread(decode_with_header, buf, store.limits)
    except (FormatError, LimitExceededError) as exc:
        said = f": {exc}" if str(exc).startswith("not a ") else f" is not a valid document: {exc}"
        raise AuditError(f"{prefix}decode", f"{what} {cid}{said}") from exc


async def verify_cid(
    store: GradientStore, cid: CID | str, *, progress: ByteProgress | None = None
) -> CidReport:
    """Fetch ``cid`` with every block checked, decode strictly, and re-derive the same CID.

    Raises ``AuditError`` with check ``cid``, ``fetch``, ``blocks``, ``decode`` or ``canonical``.
    ``progress(done, total)`` is called as bytes arrive.
    """
    start = time.perf_counter()
    root = parse_cid(cid)
    gradient = await fetch_gradient(store, root, "document", progress=progress)
    doc = encode(gradient)
    again, blocks = await asyncio.to_thread(_root_and_count, doc)
    if again != root.to_v1():
        raise AuditError(
            "canonical", f"re-encoding the document of {root} gives {again}: not the canonical CID"
        )
    kind = gradient.meta.get("kind")
    return CidReport(
        root,
        doc.size,
        blocks,
        len(gradient.tensors),
        kind if isinstance(kind, str) else None,
        time.perf_counter() - start,
        COMPRESSED_FORMAT_ID if isinstance(gradient, CompressedGradient) else FORMAT_ID,
    )


def _root_and_count(doc: EncodedDocument) -> tuple[CID, int]:
    """The document's root CID under the profile and how many blocks its DAG has."""
    root, count = EMPTY_FILE.cid, 0
    for block in build_file(doc):
        root, count = block.cid, count + 1
    return root, max(count, 1)
