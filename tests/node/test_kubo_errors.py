"""One error table for both ways KuboNode reads: httpx (``cat``) and the blocking socket (``cat_into``).

A misbehaving server on loopback produces each failure for real; both paths must
give the same error class and the same message (up to the client's own detail).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from gradstore.dag.cid import CID, RAW
from gradstore.errors import NodeError, NodeTimeoutError, NodeUnreachableError
from gradstore.node import KuboNode, Timeouts
from gradstore.node.kubo import rpc

CID_X = CID.hash(RAW, b"x")
FAST = Timeouts(connect=2.0, read=0.3, write=2.0, pool=2.0)


@contextlib.contextmanager
def serving(behave: Callable[[socket.socket], None]) -> Iterator[str]:
    """A loopback server that reads each request's head and then does ``behave(conn)``."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()
    conns: list[socket.socket] = []

    def run() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conns.append(conn)
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(65536)
                if not data:
                    break
                head += data
            behave(conn)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join()
        listener.close()
        for conn in conns:
            conn.close()


def _errors(api: str) -> tuple[NodeError, NodeError]:
    """The errors of the httpx path (``cat``) and of the socket path (``cat_into``)."""

    async def both() -> tuple[NodeError, NodeError]:
        async with KuboNode(api, timeouts=FAST) as node:
            assert node.bulk_reads
            with pytest.raises(NodeError) as via_httpx:
                async for _ in node.cat(CID_X):
                    pass
            with pytest.raises(NodeError) as via_socket:
                await node.cat_into(CID_X, bytearray(100))
        return via_httpx.value, via_socket.value

    return asyncio.run(both())


def _same_error(api: str, cls: type[NodeError], prefix: str) -> None:
    via_httpx, via_socket = _errors(api)
    assert type(via_httpx) is type(via_socket) is cls
    for error in (via_httpx, via_socket):
        assert str(error).startswith(prefix), str(error)


def test_nothing_listening_is_the_same_error_on_both_paths() -> None:
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        api = f"http://127.0.0.1:{placeholder.getsockname()[1]}"
    _same_error(api, NodeUnreachableError, f"cannot connect to {api}: is the Kubo daemon running?")


def test_a_silent_node_is_the_same_read_timeout_on_both_paths() -> None:
    with serving(lambda conn: None) as api:
        _same_error(api, NodeTimeoutError, f"kubo cat: read timeout talking to {api}")


def test_a_body_cut_short_is_the_same_broken_connection_on_both_paths() -> None:
    def cut(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        conn.close()

    with serving(cut) as api:
        _same_error(api, NodeUnreachableError, f"kubo cat: connection to {api} failed")


def test_a_connection_closed_in_the_status_line_is_a_broken_connection_on_both_paths() -> None:
    def cut(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 20")
        conn.close()

    with serving(cut) as api:
        _same_error(api, NodeUnreachableError, f"kubo cat: connection to {api} failed")


def test_every_fault_has_one_row_in_the_table() -> None:
    assert set(rpc.TRANSPORT_ERRORS) == set(rpc.Fault)
    for fault in rpc.Fault:
        error = rpc.transport_error(fault, "cat", "http://kubo.test:5001", "why")
        assert "http://kubo.test:5001" in str(error) and str(error).endswith("(why)")
        assert type(error) is rpc.TRANSPORT_ERRORS[fault][0]
