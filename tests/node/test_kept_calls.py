"""Publishing on one kept-alive connection (``kubo.kept``), on a real Kubo: many calls on one
connection, a connection the node closed while idle (a proxy in front of the daemon closes it
after each answer: the call goes again on a new one, and is published once), an error answer
(the connection is dropped, the next call opens another)."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest

from gradstore.errors import KuboCommandError
from gradstore.node import KuboDaemon, KuboNode
from gradstore.node.kubo.kept import KeptCalls

from ..tcp_proxy import TcpProxy, serving

pytestmark = pytest.mark.kubo
TOPIC = "gradstore/v1/kept/results"


class _ClosingProxy(TcpProxy):
    """Forwards each request to the daemon on a connection of its own and sends the answer
    back as if the connection stayed open, then closes it: a node that closes idle
    connections. ``connections`` and ``requests`` count what it took in and passed on."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.requests = 0

    def handle(self, client: socket.socket) -> None:
        with client:
            data = bytearray()
            while b"\r\n\r\n" not in data:
                got = client.recv(65536)
                if not got:
                    return
                data += got
            head, _, body = bytes(data).partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            while len(body) < length:
                body += client.recv(65536)
            self.requests += 1
            with socket.create_connection(self.upstream) as up:
                up.sendall(head + b"\r\nConnection: close\r\n\r\n" + body)
                answer = bytearray()
                while got := up.recv(65536):
                    answer += got
            lines = bytes(answer).split(b"\r\n")
            kept = b"\r\n".join(x for x in lines if not x.lower().startswith(b"connection:"))
            client.sendall(kept)


async def _heard(sub: object, n: int) -> list[bytes]:
    got = []
    for _ in range(n):
        got.append((await sub.get(10)).data)  # type: ignore[attr-defined]
    with contextlib.suppress(TimeoutError):
        got.append((await sub.get(0.5)).data)  # type: ignore[attr-defined]
    return got


def test_many_publishes_share_one_connection(kubo: KuboDaemon) -> None:
    async def main() -> None:
        async with kubo.node() as node, kubo.node() as listener:
            async with listener.subscribe(TOPIC) as sub:
                messages = [f"status {i}".encode() for i in range(40)]
                for m in messages:
                    await node.publish(TOPIC, m)
                assert sorted(await _heard(sub, len(messages))) == sorted(messages)
            sock = node._kept._sock
            assert sock is not None  # still open, for the next call
            await node.publish(TOPIC, b"one more")
            assert node._kept._sock is sock

    asyncio.run(main())


def test_a_connection_closed_while_idle_is_reopened_and_the_call_goes_once(
    kubo: KuboDaemon,
) -> None:
    async def main() -> None:
        with serving(_ClosingProxy(kubo.api_url)) as p:
            async with (
                KuboNode(p.url) as node,
                kubo.node() as listener,
                listener.subscribe(TOPIC) as sub,
            ):
                for m in (b"first", b"second", b"third"):
                    await node.publish(TOPIC, m)
                    await asyncio.sleep(0.1)  # idle: the proxy has closed it by now
                assert sorted(await _heard(sub, 3)) == [b"first", b"second", b"third"]
        assert p.requests == 3  # none sent twice
        assert p.connections >= 3

    asyncio.run(main())


def test_an_error_answer_drops_the_connection_and_the_next_call_opens_another(
    kubo: KuboDaemon,
) -> None:
    async def main() -> None:
        node = KuboNode(kubo.api_url)
        kept = KeptCalls(node.api, auth=None, timeouts=node.timeouts)
        try:
            await kept.call("pubsub/pub", [("arg", "u")])  # no topic, no body: refused
        except KuboCommandError as exc:
            assert "argument" in str(exc).lower() or "topic" in str(exc).lower(), exc
        else:
            raise AssertionError("Kubo accepted a publish without a topic or data")
        assert kept._sock is None
        answer = await kept.call("version", [])
        assert b"Version" in answer
        kept.close()
        await node.aclose()

    asyncio.run(main())


def test_quick_pin_calls_share_a_kept_connection_of_their_own(kubo: KuboDaemon) -> None:
    """An offline ``pin/ls`` and a direct pin go on their own kept connection (not httpx,
    not the publishes' one, where a pin's disk sync would hold messages back), with the
    same answers; a recursive pin, which may wait on the network, stays on httpx."""
    from gradstore.dag.cid import DAG_CBOR, RAW

    async def main() -> None:
        async with kubo.node() as node:
            through_httpx: list[str] = []
            call = node.client.call

            async def counted(command: str, *args: object, **kwargs: object) -> bytes:
                through_httpx.append(command)
                return await call(command, *args, **kwargs)  # type: ignore[arg-type]

            node.client.call = counted  # type: ignore[method-assign]
            record = await node.put_block(b"\xa1\x61r\x65ecord", DAG_CBOR)  # {"r": "ecord"}
            leaf = await node.put_block(b"a leaf", RAW)
            await node.pin(record, recursive=False)
            await node.publish(TOPIC, b"a message between")
            sock = node._pin_calls._sock
            assert sock is not None and sock is not node._kept._sock
            await node.pin_many([leaf])  # its pin/ls: not pinned yet, an error answer
            assert await node.pinned_recursively([leaf]) == {leaf}
            sock = node._pin_calls._sock
            assert sock is not None
            assert await node.pinned_recursively([leaf, record]) == {leaf}
            assert through_httpx.count("pin/add") == 1  # the recursive pin only
            assert "pin/ls" not in through_httpx
        direct = kubo.run("pin", "ls", "--type=direct", "--quiet").stdout.decode().split()
        assert str(record) in direct

    asyncio.run(main())
