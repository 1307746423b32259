"""Kubo RPC (``/api/v0``) without I/O: API addresses, parameters, multipart bodies, parsing, errors.

``KuboNode`` only adds the send path; everything here is testable with
``httpx.MockTransport`` or plain values. Foreign exceptions (httpx's) and
Kubo's error answers are translated to gradstore's ``NodeError`` tree here and
only here:

    httpx.TimeoutException             -> NodeTimeoutError
    httpx.TransportError (all others)  -> NodeUnreachableError
    HTTP error + "not found" for a CID -> BlockNotFoundError
    HTTP error (JSON or plain text)    -> KuboCommandError(command, message, code, status)
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import httpx

from ..dag.car import MAX_HEADER_BYTES, decode_header
from ..dag.chunker import as_bytes_view
from ..dag.cid import CID, codec_name
from ..dag.varint import MAX_VARINT_BYTES, read_varint
from ..errors import (
    BlockNotFoundError,
    CIDError,
    DAGError,
    KuboCommandError,
    NodeError,
    NodeTimeoutError,
    NodeUnreachableError,
)
from ._config import UPLOAD_CHUNK
from .base import NodeIdentity, PubsubMessage

if TYPE_CHECKING:
    from typing_extensions import Buffer

API_PREFIX: Final = "/api/v0/"

Params = list[tuple[str, str]]

_NOT_FOUND = re.compile(r"not found|could not find|no link named", re.IGNORECASE)
_TRANSIENT = ("validation ignored",)
"""Kubo errors worth a retry: concurrent pubsub publishes race with ``validation ignored``."""
_NOT_PINNED = "not pinned"
_COULD_NOT_FIND = re.compile(r"could not find (\w+)")
_BASE64URL = re.compile(r"[A-Za-z0-9_-]*={0,2}")


# --- API address ---------------------------------------------------------------------------------

_MULTIADDR = re.compile(r"^/(ip4|ip6|dns|dns4|dns6)/([^/]+)/tcp/(\d+)(?:/(http|https))?/?$")


def api_url(address: str) -> str:
    """Normalise a Kubo API address (``http://host:port``, ``host:port`` or a multiaddr) to a URL.

    Accepts what users copy from Kubo: ``/ip4/127.0.0.1/tcp/5001`` (the content
    of ``$IPFS_PATH/api``) as well as plain URLs. No trailing slash.
    """
    text = address.strip()
    if not text:
        raise ValueError("empty Kubo API address")
    m = _MULTIADDR.match(text)
    if m:
        proto, host, port, scheme = m.groups()
        if proto == "ip6":
            host = f"[{host}]"
        return f"{scheme or 'http'}://{host}:{port}"
    if text.startswith("/"):
        raise ValueError(
            f"unsupported Kubo API multiaddr {address!r} (expected /ip4|ip6|dns/<host>/tcp/<port>)"
        )
    if "://" not in text:
        text = "http://" + text
    url = httpx.URL(text)
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"not an http(s) Kubo API address: {address!r}")
    base = f"{url.scheme}://{url.netloc.decode('ascii')}"
    path = url.path.rstrip("/")
    if path.endswith("/api/v0"):
        path = path[: -len("/api/v0")]
    return base + path


# --- parameters ----------------------------------------------------------------------------------


def flag(value: bool) -> str:
    """Kubo's spelling of a boolean option."""
    return "true" if value else "false"


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


def block_rm_params(cids: Sequence[CID]) -> Params:
    """``block/rm`` of ``cids``; blocks already gone are not an error."""
    return [*(("arg", str(c)) for c in cids), ("force", "true"), ("quiet", "true")]


class CarRoots:
    """Learns a CAR stream's header roots from its first bytes as the stream goes by.

    ``KuboNode.import_car`` imports with ``pin-roots=false`` (Kubo 0.42 pins
    imported roots *online* and hangs on an incomplete DAG) and then pins the
    roots itself with ``offline=true``; this is how it knows them. Only the
    header's bytes are copied.
    """

    def __init__(self) -> None:
        self.roots: list[CID] | None = None
        self._head = bytearray()

    def see(self, piece: Buffer) -> None:
        if self.roots is not None:
            return
        view = as_bytes_view(piece)
        self._head += view[: MAX_HEADER_BYTES + MAX_VARINT_BYTES - len(self._head)]
        try:
            length, start = read_varint(self._head, 0, "CAR header length")
        except DAGError:
            if len(self._head) < MAX_VARINT_BYTES:
                return  # the varint is still arriving
            raise
        if not 0 < length <= MAX_HEADER_BYTES:
            raise DAGError(f"CAR header length {length} out of range (1..{MAX_HEADER_BYTES})")
        if len(self._head) >= start + length:
            self.roots = decode_header(self._head[start : start + length])
            self._head = bytearray()


def pubsub_pub_params(topic: str) -> Params:
    return [("arg", multibase_u(topic.encode("utf-8")))]


def pubsub_sub_params(topic: str) -> Params:
    return [("arg", multibase_u(topic.encode("utf-8")))]


# --- multipart bodies ----------------------------------------------------------------------------


def new_boundary() -> str:
    return "gradstore-" + os.urandom(12).hex()


def multipart_content_type(boundary: str) -> str:
    return f"multipart/form-data; boundary={boundary}"


def multipart_head(boundary: str, *, filename: str = "file") -> bytes:
    """The framing before a file part's content (one file field named ``file``)."""
    return (
        f"--{boundary}\r\n"
        f'Content-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode("ascii")


def multipart_tail(boundary: str) -> bytes:
    return f"\r\n--{boundary}--\r\n".encode("ascii")


def slices(piece: Buffer, size: int = UPLOAD_CHUNK) -> Iterable[memoryview]:
    """Zero-copy slices of at most ``size`` bytes (keeps every copy in the HTTP stack small)."""
    view = as_bytes_view(piece)
    for start in range(0, len(view), size):
        yield view[start : start + size]


async def multipart_stream(
    pieces: AsyncIterable[Buffer] | Iterable[Buffer], boundary: str, *, filename: str = "file"
) -> AsyncIterator[bytes | memoryview]:
    """The multipart/form-data body around streamed file content: head, slices of pieces, tail.

    The content is never joined: each piece is sent as memoryview slices.
    """
    yield multipart_head(boundary, filename=filename)
    if isinstance(pieces, AsyncIterable):
        async for piece in pieces:
            for part in slices(piece):
                yield part
    else:
        for piece in pieces:
            for part in slices(piece):
                yield part
    yield multipart_tail(boundary)


# --- errors --------------------------------------------------------------------------------------


def _error_fields(body: bytes) -> tuple[str, int | None]:
    text = body.decode("utf-8", "replace").strip()
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError:
            return text, None
        if isinstance(obj, dict) and "Message" in obj:
            code = obj.get("Code")
            return str(obj["Message"]), code if isinstance(code, int) else None
    return text or "(empty error body)", None


def error_from_response(
    command: str, status: int, body: bytes, *, cid: CID | None = None
) -> NodeError:
    """The exception for an HTTP error answer to ``command``.

    Kubo's ``{"Message","Code","Type"}`` bodies and plain-text answers (e.g. a
    proxy's 404) both become ``KuboCommandError``; a command about ``cid`` that
    Kubo answers with "not found" becomes ``BlockNotFoundError``.
    """
    message, code = _error_fields(body)
    if cid is not None and status == 500 and _NOT_FOUND.search(message):
        missing = missing_cid(message) or cid
        return BlockNotFoundError(
            missing, f"block not found: {missing} (kubo {command}: {message})"
        )
    return KuboCommandError(command, message, code, status)


def missing_cid(message: str) -> CID | None:
    """The CID named in Kubo's "could not find <cid>" message, if it names a valid one."""
    m = _COULD_NOT_FIND.search(message)
    if m is None:
        return None
    try:
        return CID.parse(m.group(1))
    except CIDError:
        return None


def error_from_stream_item(
    command: str, obj: Mapping[str, Any], *, cid: CID | None = None
) -> NodeError:
    """The exception for an error object Kubo emitted inside a 200 NDJSON stream."""
    return error_from_response(command, 500, json.dumps(obj).encode(), cid=cid)


def is_stream_error(obj: object) -> bool:
    return isinstance(obj, dict) and obj.get("Type") == "error" and "Message" in obj


def error_from_transport(exc: httpx.HTTPError, command: str, url: str) -> NodeError:
    """Translate an httpx exception raised while calling ``command`` on the node at ``url``."""
    if isinstance(exc, httpx.TimeoutException):
        phase = type(exc).__name__.removesuffix("Timeout").lower() or "request"
        return NodeTimeoutError(f"kubo {command}: {phase} timeout talking to {url} ({exc})")
    if isinstance(exc, httpx.ConnectError):
        return NodeUnreachableError(f"cannot connect to {url}: is the Kubo daemon running? ({exc})")
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.ProxyError):
        return NodeUnreachableError(f"cannot reach {url}: {exc}")
    if isinstance(exc, httpx.TransportError):  # ReadError, WriteError, RemoteProtocolError, ...
        return NodeUnreachableError(
            f"kubo {command}: connection to {url} failed: {type(exc).__name__} {exc}"
        )
    return NodeError(f"kubo {command}: {type(exc).__name__}: {exc}")


def is_transient(error: NodeError) -> bool:
    """Whether a retry may succeed: connection failures, non-Kubo 5xx, and known Kubo races."""
    if isinstance(error, NodeUnreachableError):
        return True
    if isinstance(error, KuboCommandError):
        if any(marker in error.message for marker in _TRANSIENT):
            return True
        return error.status is not None and error.status >= 502
    return False


def is_not_pinned(error: NodeError) -> bool:
    return isinstance(error, KuboCommandError) and _NOT_PINNED in error.message


# --- answers -------------------------------------------------------------------------------------


def _field(obj: object, key: str, command: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise NodeError(f"kubo {command}: unexpected answer without {key!r}: {str(obj)[:200]}")
    return obj[key]


def parse_cid(value: object, command: str) -> CID:
    """A CID in a Kubo answer: a string or a DAG-JSON link ``{"/": "..."}``."""
    if isinstance(value, dict):
        value = value.get("/")
    if not isinstance(value, str):
        raise NodeError(f"kubo {command}: expected a CID, got {value!r}")
    try:
        return CID.parse(value)
    except CIDError as exc:
        raise NodeError(f"kubo {command}: answered an unusable CID {value!r}: {exc}") from exc


def parse_json(command: str, body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError as exc:
        raise NodeError(f"kubo {command}: answer is not JSON: {body[:200]!r}") from exc


def parse_ndjson(command: str, body: bytes) -> list[Any]:
    """Every JSON value of a newline-delimited answer; an error item raises."""
    items = [parse_json(command, line) for line in body.splitlines() if line.strip()]
    for item in items:
        if is_stream_error(item):
            raise error_from_stream_item(command, item)
    return items


def parse_identity(obj: object) -> NodeIdentity:
    addrs = _field(obj, "Addresses", "id") or []
    return NodeIdentity(
        peer_id=str(_field(obj, "ID", "id")),
        addresses=tuple(str(a) for a in addrs),
        agent_version=str(_field(obj, "AgentVersion", "id")),
    )


def parse_version(obj: object) -> str:
    return str(_field(obj, "Version", "version"))


def parse_block_put(obj: object) -> CID:
    return parse_cid(_field(obj, "Key", "block/put"), "block/put")


def parse_block_stat(obj: object) -> int:
    return int(_field(obj, "Size", "block/stat"))


def parse_pin_ls(obj: object) -> set[CID]:
    keys = _field(obj, "Keys", "pin/ls") or {}
    return {parse_cid(k, "pin/ls") for k in keys}


def parse_dag_import(items: Sequence[object]) -> list[CID]:
    """Roots from ``dag/import``'s NDJSON; a root Kubo could not pin raises ``KuboCommandError``."""
    roots: list[CID] = []
    for item in items:
        if not isinstance(item, dict) or "Root" not in item:
            continue  # a Stats line
        root = item["Root"]
        cid = parse_cid(_field(root, "Cid", "dag/import"), "dag/import")
        pin_error = root.get("PinErrorMsg") or ""
        if pin_error:
            raise KuboCommandError("dag/import", f"could not pin root {cid}: {pin_error}")
        roots.append(cid)
    return roots


def parse_guarded_import(items: Sequence[object], guard: CID) -> None:
    """Check ``dag/import``'s NDJSON for a guarded import: only ``guard`` may be unpinnable."""
    for item in items:
        if not isinstance(item, dict) or "Root" not in item:
            continue
        cid = parse_cid(_field(item["Root"], "Cid", "dag/import"), "dag/import")
        if cid != guard:
            raise NodeError(f"kubo dag/import: unexpected root {cid} in the answer")


def parse_dag_put(obj: object) -> CID:
    """The CID ``dag/put`` stored."""
    return parse_cid(_field(obj, "Cid", "dag/put"), "dag/put")


def parse_add(items: Sequence[object]) -> CID:
    """The last ``Hash`` of ``add``'s NDJSON (the root of the single file added)."""
    hashes = [item["Hash"] for item in items if isinstance(item, dict) and "Hash" in item]
    if not hashes:
        raise NodeError("kubo add: answer names no CID")
    return parse_cid(hashes[-1], "add")


def parse_strings(obj: object, command: str) -> list[str]:
    return [str(s) for s in (_field(obj, "Strings", command) or [])]


def parse_swarm_peers(obj: object) -> list[str]:
    return [
        str(_field(p, "Peer", "swarm/peers")) for p in (_field(obj, "Peers", "swarm/peers") or [])
    ]


def parse_pubsub_message(obj: object, topic: str) -> PubsubMessage:
    """One ``pubsub/sub`` NDJSON item: multibase ``data`` and ``seqno``, peer id in ``from``."""
    if is_stream_error(obj):
        raise error_from_stream_item("pubsub/sub", obj)  # type: ignore[arg-type]
    if not isinstance(obj, dict):
        raise NodeError(f"kubo pubsub/sub: unexpected item {str(obj)[:200]}")
    data = obj.get("data")
    seqno = obj.get("seqno")
    return PubsubMessage(
        topic=topic,
        data=decode_multibase(data) if data else b"",
        from_peer=str(obj.get("from", "")),
        seqno=decode_multibase(seqno) if seqno else b"",
    )
