"""benchmarks/_link.py: a shaped link really holds an address's traffic to its rate, both
ways, leaves the rest of loopback alone, and is gone afterwards. Needs root and ``tc``
(the streaming benchmark's --link-mbit does too); skipped without them."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time

import pytest

from benchmarks._link import can_shape, shaped_link

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("tc") is None or not can_shape(),
    reason="shaping loopback needs root, tc, and HTB and bfifo in the kernel",
)

PEER = "127.0.0.21"


def _send_seconds(source: str, nbytes: int) -> float:
    """Seconds to send ``nbytes`` from ``source`` to a listener on 127.0.0.1, until it
    has them all."""
    server = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def drain() -> None:
        conn, _ = server.accept()
        got = 0
        while got < nbytes:
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            got += len(chunk)
        conn.sendall(b"k")
        conn.close()
        done.set()

    thread = threading.Thread(target=drain)
    thread.start()
    client = socket.create_connection(server.getsockname(), source_address=(source, 0))
    start = time.perf_counter()
    client.sendall(bytes(nbytes))
    assert client.recv(1) == b"k"
    took = time.perf_counter() - start
    client.close()
    thread.join(10)
    server.close()
    return took


def test_a_shaped_address_sends_at_its_rate_and_the_link_goes_away() -> None:
    with shaped_link([PEER], mbit=16):  # 2 MB/s
        shaped = _send_seconds(PEER, 2 << 20)
        direct = _send_seconds("127.0.0.1", 2 << 20)  # another address: not shaped
        classes = subprocess.run(
            ["tc", "class", "show", "dev", "lo"], capture_output=True, text=True
        ).stdout
    assert shaped >= 0.8, shaped  # 2 MiB at 2 MB/s: about 1 s, never less
    assert direct < 0.5, direct
    assert classes.count("rate 16Mbit") == 2, classes  # one class each way
    assert _send_seconds(PEER, 2 << 20) < 0.5  # removed on exit
    assert (
        "htb"
        not in subprocess.run(
            ["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True
        ).stdout
    )
