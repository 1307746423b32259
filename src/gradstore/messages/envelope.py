"""The envelope every small signed message shares: a msgpack map that starts ``v``,
``type``, ends with a 64-byte ``sig`` over the bytes before it, and is canonical (its fields
re-encode to exactly the bytes received, so one message has one signed form).

The population's reports and next-interval messages and the pipeline's stage messages open
and seal it here; what each then checks (its keys, its signer) is its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import MessageError, Reason
from .didkey import SIGNATURE_LEN
from .wire import pack_map, unpack_map

Pairs = list[tuple[str, Any]]


def open_envelope(
    data: bytes, *, max_bytes: int, version: int, what: str
) -> tuple[Pairs, dict[str, Any]]:
    """The pairs and values of ``data`` once its size and its ``v``/``type`` head are
    right. ``MessageError``: too-large, malformed (``what`` names the message in the text)."""
    if len(data) > max_bytes:
        raise MessageError(
            Reason.TOO_LARGE, f"{what} is {len(data)} bytes, the limit is {max_bytes}"
        )
    pairs = unpack_map(data)
    values = dict(pairs)
    head = [k for k, _ in pairs[:2]]
    if head != ["v", "type"] or type(values["v"]) is not int or values["v"] != version:
        raise MessageError(Reason.MALFORMED, f"a {what} starts with v={version}, type")
    return pairs, values


def sealed(pairs: Pairs, canonical: Sequence[tuple[str, Any]], *, what: str) -> tuple[bytes, bytes]:
    """(the signed bytes, the signature) of a message whose fields re-encode as
    ``canonical``: ``sig`` must be its last key and ``SIGNATURE_LEN`` bytes, and the rest
    exactly ``canonical``. ``MessageError`` malformed otherwise; the caller checks whose
    signature it is (its reason differs: bad-signature, not-coordinator)."""
    sig = pairs[-1][1] if pairs and pairs[-1][0] == "sig" else None
    if not isinstance(sig, bytes) or len(sig) != SIGNATURE_LEN:
        raise MessageError(
            Reason.MALFORMED, f"`sig` must be {SIGNATURE_LEN} bytes, the {what}'s last key"
        )
    signed = pack_map(pairs[:-1])
    if pack_map(canonical) != signed:
        raise MessageError(Reason.MALFORMED, f"{what} is not in canonical form")
    return signed, sig
