"""The multibase strings of Kubo's pubsub API (topics, payloads, seqnos)."""

from __future__ import annotations

import base64
import binascii
import re

from ....errors import NodeError

_BASE64URL = re.compile(r"[A-Za-z0-9_-]*={0,2}")


def multibase_u(data: bytes) -> str:
    """Multibase ``u``: unpadded base64url, how Kubo >= 0.11 wants pubsub topics and payloads."""
    return "u" + base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def decode_multibase(text: str) -> bytes:
    """Decode the multibase strings Kubo emits in pubsub answers (``u``, ``U``, ``m``, ``M``)."""
    if not text:
        raise NodeError("empty multibase string in Kubo answer")
    prefix, body = text[0], text[1:]
    try:
        if prefix in "uU" and _BASE64URL.fullmatch(body):
            std = body.rstrip("=").replace("-", "+").replace("_", "/")
            return base64.b64decode(std + "=" * (-len(std) % 4), validate=True)
        if prefix in "mM":
            return base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise NodeError(f"malformed multibase string in Kubo answer: {text[:40]!r}") from exc
    raise NodeError(f"unexpected multibase string {text[:40]!r} in Kubo answer")
