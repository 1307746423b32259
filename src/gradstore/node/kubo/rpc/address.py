"""Kubo API addresses: what users copy (a URL, ``host:port``, ``$IPFS_PATH/api``'s multiaddr)."""

from __future__ import annotations

import re
from typing import Final

import httpx

API_PREFIX: Final = "/api/v0/"

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
