"""Every failure talking to Kubo becomes gradstore's ``NodeError`` tree here, and only here.

Transport failures are first named as a ``Fault``, whichever client saw them
(httpx in ``KuboNode``, a blocking socket in ``bulk``), and one table turns a
fault into the error users see:

    timeouts (connect, read, write, pool)  -> NodeTimeoutError
    connection refused / unreachable       -> NodeUnreachableError
    connection broken mid-way              -> NodeUnreachableError
    HTTP error + "not found" for a CID     -> BlockNotFoundError
    HTTP error (JSON or plain text)        -> KuboCommandError(command, message, code, status)
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from typing import Any, Final

import httpx

from ....dag.cid import CID
from ....errors import (
    BlockNotFoundError,
    CIDError,
    KuboCommandError,
    NodeError,
    NodeTimeoutError,
    NodeUnreachableError,
)

_NOT_FOUND = re.compile(r"not found|could not find|no link named", re.IGNORECASE)
_TRANSIENT = ("validation ignored",)
"""Kubo errors worth a retry: concurrent pubsub publishes race with ``validation ignored``."""
_NOT_PINNED = "not pinned"
_COULD_NOT_FIND = re.compile(r"could not find (\w+)")


class Fault(enum.Enum):
    """What went wrong on the way to Kubo, in terms common to every HTTP client."""

    CONNECT_TIMEOUT = "connect"
    READ_TIMEOUT = "read"
    WRITE_TIMEOUT = "write"
    POOL_TIMEOUT = "pool"
    TIMEOUT = "request"
    REFUSED = "refused"
    UNREACHABLE = "unreachable"
    BROKEN = "broken"


_TIMEOUT = (NodeTimeoutError, "kubo {command}: {phase} timeout talking to {url}")
TRANSPORT_ERRORS: Final[Mapping[Fault, tuple[type[NodeError], str]]] = {
    Fault.CONNECT_TIMEOUT: _TIMEOUT,
    Fault.READ_TIMEOUT: _TIMEOUT,
    Fault.WRITE_TIMEOUT: _TIMEOUT,
    Fault.POOL_TIMEOUT: _TIMEOUT,
    Fault.TIMEOUT: _TIMEOUT,
    Fault.REFUSED: (NodeUnreachableError, "cannot connect to {url}: is the Kubo daemon running?"),
    Fault.UNREACHABLE: (NodeUnreachableError, "cannot reach {url}"),
    Fault.BROKEN: (NodeUnreachableError, "kubo {command}: connection to {url} failed"),
}
"""The one table from a transport fault to the error class and message (detail appended)."""

_HTTPX_FAULTS: Final[tuple[tuple[type[httpx.HTTPError], Fault], ...]] = (
    (httpx.ConnectTimeout, Fault.CONNECT_TIMEOUT),
    (httpx.ReadTimeout, Fault.READ_TIMEOUT),
    (httpx.WriteTimeout, Fault.WRITE_TIMEOUT),
    (httpx.PoolTimeout, Fault.POOL_TIMEOUT),
    (httpx.TimeoutException, Fault.TIMEOUT),
    (httpx.ConnectError, Fault.REFUSED),
    (httpx.UnsupportedProtocol, Fault.UNREACHABLE),
    (httpx.ProxyError, Fault.UNREACHABLE),
    (httpx.TransportError, Fault.BROKEN),  # ReadError, WriteError, RemoteProtocolError, ...
)
"""httpx's exceptions as faults, the most specific first."""


def transport_error(fault: Fault, command: str, url: str, detail: str = "") -> NodeError:
    """The error for ``fault`` while calling ``command`` on the node at ``url``."""
    cls, template = TRANSPORT_ERRORS[fault]
    message = template.format(command=command, url=url, phase=fault.value)
    return cls(f"{message} ({detail})" if detail else message)


def _detail(exc: BaseException, fault: Fault) -> str:
    return f"{type(exc).__name__}: {exc}" if fault is Fault.BROKEN else str(exc)


def error_from_transport(exc: httpx.HTTPError, command: str, url: str) -> NodeError:
    """Translate an httpx exception raised while calling ``command`` on the node at ``url``."""
    for exc_type, fault in _HTTPX_FAULTS:
        if isinstance(exc, exc_type):
            return transport_error(fault, command, url, _detail(exc, fault))
    return NodeError(f"kubo {command}: {type(exc).__name__}: {exc}")


def error_from_socket(exc: OSError, command: str, url: str, *, connecting: bool) -> NodeError:
    """Translate a blocking socket's ``OSError`` (timeouts are ``TimeoutError``), as httpx's."""
    if isinstance(exc, TimeoutError):
        fault = Fault.CONNECT_TIMEOUT if connecting else Fault.READ_TIMEOUT
    else:
        fault = Fault.REFUSED if connecting else Fault.BROKEN
    return transport_error(fault, command, url, _detail(exc, fault))


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
