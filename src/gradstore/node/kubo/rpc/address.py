"""Kubo API addresses: what users copy (a URL, ``host:port``, ``$IPFS_PATH/api``'s multiaddr)."""

from __future__ import annotations

import re
from typing import Final

import httpx

API_PREFIX: Final = "/api/v0/"

_MULTIADDR = re.compile(r"^/(ip4|ip6|dns|dns4|dns6)/([^/]+)/tcp/(\d+)(?:/(http|https))?/?$")
#: A host name's labels (letters, digits, ``-``, and ``_`` as Docker's service names use it).
_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")


def api_url(address: str) -> str:
    """Normalise a Kubo API address (``http://host:port``, ``host:port`` or a multiaddr) to a URL.

    Accepts what users copy from Kubo: ``/ip4/127.0.0.1/tcp/5001`` (the content
    of ``$IPFS_PATH/api``) as well as plain URLs. No trailing slash.
    """
    text = address.strip()
    if not text:
        raise ValueError("empty Kubo API address")
    if any(ch.isspace() or not ch.isprintable() for ch in text):
        raise ValueError(
            f"not a Kubo API address (it holds spaces or control characters): {address!r}"
        )
    m = _MULTIADDR.match(text)
    if m:
        proto, host, port, scheme = m.groups()
        _check_port(int(port), address)
        if proto == "ip6":
            host = f"[{host}]"
        return f"{scheme or 'http'}://{host}:{port}"
    if text.startswith("/"):
        raise ValueError(
            f"unsupported Kubo API multiaddr {address!r} (expected /ip4|ip6|dns/<host>/tcp/<port>)"
        )
    if "://" not in text:
        text = "http://" + text
    try:
        url = httpx.URL(text)
    except httpx.InvalidURL as exc:
        raise ValueError(f"not a Kubo API address: {address!r} ({exc})") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"not an http(s) Kubo API address: {address!r}")
    if url.userinfo:
        raise ValueError(
            f"a Kubo API address carries no credentials: {address!r}; give them as the "
            "Authorization value (--api-auth or GRADSTORE_API_AUTH)"
        )
    if url.query or url.fragment:
        raise ValueError(f"a Kubo API address has no query or fragment: {address!r}")
    _check_host(url.raw_host.decode("ascii"), address)  # IDNA: xn-- labels
    if url.port is not None:
        _check_port(url.port, address)
    base = f"{url.scheme}://{url.netloc.decode('ascii')}"
    path = url.path.rstrip("/")
    if path.endswith("/api/v0"):
        path = path[: -len("/api/v0")]
    return base + path


def _check_host(host: str, address: str) -> None:
    """Refuse a host that no resolver could look up (``not an address`` became one before)."""
    if ":" in host:  # an IPv6 literal, parsed by httpx from its brackets
        return
    labels = host.rstrip(".").split(".")
    if not all(_LABEL.match(label) for label in labels) or len(host) > 253:
        raise ValueError(f"not a host name or IP address in Kubo API address {address!r}: {host!r}")


def _check_port(port: int, address: str) -> None:
    if not 0 < port < 65536:
        raise ValueError(f"port {port} out of range 1-65535 in Kubo API address {address!r}")
