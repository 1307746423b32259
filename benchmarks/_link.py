"""A network link of a given rate between loopback addresses, with Linux's ``tc`` on ``lo``.

Machines training together talk over links of 1-100 Gbit/s or less, not over loopback's
several GB/s; a benchmark of what overlaps the network (streaming steps out of backward)
needs that link. ``shaped_link(["127.0.0.11", ...], mbit=100)`` gives each address a link
of its own: the traffic it sends and the traffic sent to it each go through an HTB class
of ``mbit`` Mbit/s whose queue holds about 50 ms of it (as a host's does; loopback's
1,000 packets of 64 KiB are 5 s at 100 Mbit/s, and held the coordinator's messages behind
the bulk), while the rest of loopback's traffic bypasses the shaper. Needs root
(CAP_NET_ADMIN); removed on exit. Not part of gradstore: for the benchmarks only.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

DEVICE = "lo"
QUEUE_S = 0.05


def _tc(*args: str) -> None:
    result = subprocess.run(["tc", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(
            f"tc {' '.join(args)} failed ({result.stderr.strip()}): shaping a link needs "
            "Linux's tc and root (CAP_NET_ADMIN); run without --link-mbit to use loopback"
        )


def can_shape() -> bool:
    """Whether this machine lets us shape loopback (root, ``tc``, HTB and bfifo in its
    kernel, no queue of someone else's on ``lo``): tried on a class of nobody's address."""
    try:
        with shaped_link(["127.0.0.254"], mbit=1000):
            return True
    except (SystemExit, OSError):
        return False


@contextmanager
def shaped_link(addresses: Sequence[str], mbit: int) -> Iterator[None]:
    """Shape each of ``addresses``' traffic, both ways, to ``mbit`` Mbit/s until exit."""
    queue = max(256 << 10, int(mbit * 1e6 / 8 * QUEUE_S))
    # htb without a default class: unclassified traffic (the rest of loopback) goes direct
    _tc("qdisc", "add", "dev", DEVICE, "root", "handle", "1:", "htb", "r2q", "1000")
    try:
        for i, address in enumerate(addresses):
            for k, way in enumerate(("src", "dst")):
                minor = 10 + 2 * i + k
                _tc("class", "add", "dev", DEVICE, "parent", "1:", "classid", f"1:{minor}",
                    "htb", "rate", f"{mbit}mbit", "ceil", f"{mbit}mbit")  # fmt: skip
                _tc("qdisc", "add", "dev", DEVICE, "parent", f"1:{minor}", "handle",
                    f"{minor}:", "bfifo", "limit", str(queue))  # fmt: skip
                _tc("filter", "add", "dev", DEVICE, "parent", "1:", "protocol", "ip",
                    "prio", "1", "u32", "match", "ip", way, f"{address}/32",
                    "flowid", f"1:{minor}")  # fmt: skip
        yield
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", DEVICE, "root"], capture_output=True)
