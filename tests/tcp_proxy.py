"""A loopback TCP server in front of a real daemon's API, for the failure paths a real node
will not produce on demand (a lying answer, a connection closed while idle): each accepted
connection goes to ``handle`` in a thread of its own."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar


class TcpProxy:
    """Accepts on a port of its own (``url``); ``upstream`` is the daemon's API url."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.connections = 0
        self.stopped = threading.Event()

    def serve(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            self.connections += 1
            threading.Thread(target=self.handle, args=(client,), daemon=True).start()

    def handle(self, client: socket.socket) -> None:
        raise NotImplementedError


P = TypeVar("P", bound=TcpProxy)


@contextmanager
def serving(proxy: P) -> Iterator[P]:
    """``proxy`` accepting connections until the block ends."""
    server = threading.Thread(target=proxy.serve, daemon=True)
    server.start()
    try:
        yield proxy
    finally:
        proxy.stopped.set()
        server.join(5)
        proxy.server.close()
