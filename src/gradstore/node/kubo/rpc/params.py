"""Query parameters of the Kubo commands gradstore sends."""

from __future__ import annotations

from ....dag.cid import CID, codec_name
from .multibase import multibase_u

Params = list[tuple[str, str]]


def flag(value: bool) -> str:
    """Kubo's spelling of a boolean option."""
    return "true" if value else "false"


def block_put_params(codec: int, *, pin: bool = False) -> Params:
    """``block/put`` for a CIDv1 sha2-256 block of ``codec`` (raw, dag-pb, dag-cbor)."""
    return [("cid-codec", codec_name(codec)), ("mhtype", "sha2-256"), ("pin", flag(pin))]


def dag_import_params(*, pin_roots: bool) -> Params:
    """``dag/import``: pin the header's roots (or not); ask for no stats line."""
    return [("pin-roots", flag(pin_roots)), ("stats", "false")]


def guarded_import_params() -> Params:
    """``dag/import`` holding Kubo's GC lock for the whole request (``pin-roots=true``).

    The CAR's header names a root that is never stored, so Kubo pins nothing
    (and walks nothing); no DHT announcement is made for that root.
    """
    return [("pin-roots", "true"), ("stats", "false"), ("fast-provide-root", "false")]


def dag_put_params(codec: int, *, pin: bool) -> Params:
    """``dag/put`` of one block stored as-is in ``codec`` (raw or dag-pb), pinned if asked.

    Kubo records the pin without walking the DAG (the caller vouches for it).
    """
    name = codec_name(codec)
    return [("input-codec", name), ("store-codec", name), ("pin", flag(pin))]


def cat_params(cid: CID, offset: int = 0, length: int | None = None) -> Params:
    """``cat`` of a UnixFS file, or of ``length`` bytes from ``offset``."""
    params: Params = [("arg", str(cid))]
    if offset:
        params.append(("offset", str(offset)))
    if length is not None:
        params.append(("length", str(length)))
    return params


def pubsub_pub_params(topic: str) -> Params:
    return [("arg", multibase_u(topic.encode("utf-8")))]


def pubsub_sub_params(topic: str) -> Params:
    return [("arg", multibase_u(topic.encode("utf-8")))]
