"""KuboNode without a daemon: request building, answer parsing and error mapping (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from gradstore.dag import Block, write_car
from gradstore.dag.cid import CID, DAG_PB, RAW
from gradstore.errors import (
    BlockNotFoundError,
    DAGError,
    IntegrityError,
    KuboCommandError,
    LimitExceededError,
    NodeError,
    NodeTimeoutError,
    NodeUnreachableError,
)
from gradstore.node import MAX_PUBSUB_DATA, KuboNode, Retry
from gradstore.node.kubo import rpc

FAST = Retry(retries=3, backoff=0.001, max_backoff=0.002)
Handler = Callable[[httpx.Request], httpx.Response]


def kubo_error(message: str, status: int = 500, code: int = 0) -> httpx.Response:
    return httpx.Response(status, json={"Message": message, "Code": code, "Type": "error"})


def mock_node(handler: Handler, **kwargs: Any) -> KuboNode:
    kwargs.setdefault("retry", FAST)
    return KuboNode("http://kubo.test:5001", transport=httpx.MockTransport(handler), **kwargs)


def run_with(handler: Handler, call: Callable[[KuboNode], Any], **kwargs: Any) -> Any:
    async def main() -> Any:
        async with mock_node(handler, **kwargs) as node:
            return await call(node)

    return asyncio.run(main())


def multipart_file(request: httpx.Request) -> bytes:
    """The content of the single file part of a multipart request."""
    body = request.read()
    ctype = request.headers["content-type"]
    assert ctype.startswith("multipart/form-data; boundary=")
    boundary = ctype.split("boundary=", 1)[1].encode()
    head, _, rest = body.partition(b"\r\n\r\n")
    assert head.startswith(b"--" + boundary + b"\r\n")
    assert b'name="file"' in head
    tail = b"\r\n--" + boundary + b"--\r\n"
    assert rest.endswith(tail)
    return rest[: -len(tail)]


# --- pure helpers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "url"),
    [
        ("/ip4/127.0.0.1/tcp/5001", "http://127.0.0.1:5001"),
        ("/ip6/::1/tcp/5001", "http://[::1]:5001"),
        ("/dns/kubo.example/tcp/443/https", "https://kubo.example:443"),
        ("http://127.0.0.1:5001/", "http://127.0.0.1:5001"),
        ("http://127.0.0.1:5001/api/v0", "http://127.0.0.1:5001"),
        ("localhost:5001", "http://localhost:5001"),
        ("gradstore_kubo_1:5001", "http://gradstore_kubo_1:5001"),  # a Docker service name
        ("https://kubo.example/proxy/api/v0/", "https://kubo.example/proxy"),
        ("été.example:5001", "http://xn--t-9fab.example:5001"),
    ],
)
def test_api_url_accepts_urls_and_multiaddrs(address: str, url: str) -> None:
    assert rpc.api_url(address) == url


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("", "empty"),
        ("/ip4/127.0.0.1/udp/5001", "unsupported"),
        ("ftp://x:1", "not an http(s)"),
        # text that no resolver could look up was percent-encoded into a host name
        ("not an address", "spaces"),
        ("http://exa mple.com", "spaces"),
        ("http://a..b:5001", "not a host name"),
        ("http://kubo!:5001", "not a host name"),
        # ports: httpx's own error type, and ports no socket has
        ("127.0.0.1:abc", "Invalid port"),
        ("http://127.0.0.1:99999", "out of range"),
        ("/ip4/127.0.0.1/tcp/70000", "out of range"),
        # parts that were silently dropped: credentials and queries never reached Kubo
        ("http://user:pw@127.0.0.1:5001", "credentials"),
        ("http://127.0.0.1:5001?token=x", "query"),
    ],
)
def test_api_url_refuses_unusable_addresses(address: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        rpc.api_url(address)


def test_multibase_u_is_unpadded_base64url_and_round_trips() -> None:
    assert rpc.multibase_u(b"hello") == "uaGVsbG8"
    assert rpc.multibase_u(b"\xfb\xff") == "u-_8"  # url-safe alphabet
    for data in (b"", b"a", b"ab", b"abc", bytes(range(256))):
        assert rpc.decode_multibase(rpc.multibase_u(data)) == data
    assert rpc.decode_multibase("maGVsbG8=") == b"hello"  # standard base64 is understood too


@pytest.mark.parametrize("text", ["", "zabc", "u*"])
def test_decode_multibase_refuses_garbage(text: str) -> None:
    with pytest.raises(NodeError):
        rpc.decode_multibase(text)


def test_multipart_stream_frames_pieces_without_copying() -> None:
    big = bytearray(600 * 1024)
    pieces: list[bytes | memoryview] = [b"head", memoryview(big)]

    async def collect() -> list[bytes | memoryview]:
        return [part async for part in rpc.multipart_stream(pieces, "BOUND")]

    parts = asyncio.run(collect())
    assert parts[0] == rpc.multipart_head("BOUND")
    assert parts[-1] == b"\r\n--BOUND--\r\n"
    body = parts[1:-1]
    assert b"".join(body) == b"head" + bytes(big)
    # the big piece is sent as slices of the caller's buffer, none over UPLOAD_CHUNK
    views = [p for p in body if isinstance(p, memoryview) and p.obj is big]
    assert sum(len(v) for v in views) == len(big)
    assert max(len(v) for v in views) <= 256 * 1024


def test_error_body_json_becomes_kubo_command_error() -> None:
    body = json.dumps({"Message": "pin: merkledag: not here", "Code": 7, "Type": "error"}).encode()
    error = rpc.error_from_response("pin/add", 500, body)
    assert isinstance(error, KuboCommandError)
    assert (error.command, error.message, error.code, error.status) == (
        "pin/add",
        "pin: merkledag: not here",
        7,
        500,
    )


def test_plain_text_404_becomes_kubo_command_error() -> None:
    error = rpc.error_from_response("nosuch", 404, b"404 page not found\n")
    assert isinstance(error, KuboCommandError)
    assert (error.message, error.code, error.status) == ("404 page not found", None, 404)


def test_not_found_about_a_cid_becomes_block_not_found() -> None:
    cid = CID.hash(RAW, b"x")
    body = json.dumps(
        {"Message": f"block was not found locally (offline): {cid}", "Code": 0}
    ).encode()
    error = rpc.error_from_response("block/stat", 500, body, cid=cid)
    assert isinstance(error, BlockNotFoundError)
    assert error.cid == str(cid)


def _all_subclasses(cls: type) -> set[type]:
    found: set[type] = set()
    for sub in cls.__subclasses__():
        found |= {sub} | _all_subclasses(sub)
    return found


@pytest.mark.parametrize(
    "exc_type", sorted(_all_subclasses(httpx.TransportError), key=lambda t: t.__name__)
)
def test_every_httpx_transport_error_is_mapped_to_a_specific_class(exc_type: type) -> None:
    error = rpc.error_from_transport(exc_type("boom"), "id", "http://127.0.0.1:1")
    expected = (
        NodeTimeoutError if issubclass(exc_type, httpx.TimeoutException) else NodeUnreachableError
    )
    assert type(error) is expected
    assert "127.0.0.1:1" in str(error)


def test_parse_dag_import_reports_roots_and_pin_errors() -> None:
    cid = CID.hash(RAW, b"x")
    ok = [{"Root": {"Cid": {"/": str(cid)}, "PinErrorMsg": ""}}, {"Stats": {"BlockCount": 1}}]
    assert rpc.parse_dag_import(ok) == [cid]
    failing = [{"Root": {"Cid": {"/": str(cid)}, "PinErrorMsg": "ipld: could not find x"}}]
    with pytest.raises(KuboCommandError, match="could not pin root"):
        rpc.parse_dag_import(failing)


def test_a_guarded_import_accepts_only_its_guard_as_unpinnable() -> None:
    guard, other = CID.hash(RAW, b"guard"), CID.hash(RAW, b"other")
    unpinnable = {"Cid": {"/": str(guard)}, "PinErrorMsg": f"ipld: could not find {guard}"}
    rpc.parse_guarded_import([{"Root": unpinnable}], guard)  # expected: the guard is never stored
    with pytest.raises(NodeError, match="unexpected root"):
        rpc.parse_guarded_import([{"Root": {"Cid": {"/": str(other)}}}], guard)


def test_dag_put_params_store_the_block_as_it_is() -> None:
    assert rpc.dag_put_params(DAG_PB, pin=True) == [
        ("input-codec", "dag-pb"),
        ("store-codec", "dag-pb"),
        ("pin", "true"),
    ]
    assert ("input-codec", "raw") in rpc.dag_put_params(RAW, pin=False)


def test_parse_pubsub_message_decodes_multibase_fields() -> None:
    item = {
        "from": "12D3KooWPeer",
        "data": rpc.multibase_u(b"\x00payload\xff"),
        "seqno": rpc.multibase_u(b"\x00\x00\x00\x01"),
        "topicIDs": [rpc.multibase_u(b"t")],
    }
    msg = rpc.parse_pubsub_message(item, "t")
    assert (msg.topic, msg.data, msg.from_peer, msg.seqno) == (
        "t",
        b"\x00payload\xff",
        "12D3KooWPeer",
        b"\x00\x00\x00\x01",
    )


# --- KuboNode over a mock transport --------------------------------------------------------------


def test_calls_are_posts_to_api_v0_with_the_authorization_header() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"Version": "0.42.0"})

    assert run_with(handler, lambda n: n.version(), auth="Bearer s3cret") == "0.42.0"
    (request,) = seen
    assert request.method == "POST"
    assert request.url.path == "/api/v0/version"
    assert request.headers["authorization"] == "Bearer s3cret"


def test_put_block_sends_multipart_and_checks_the_reported_cid() -> None:
    data = b"block bytes"
    expected = CID.hash(DAG_PB, data)

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v0/block/put"
        assert request.url.params["cid-codec"] == "dag-pb"
        assert request.url.params["mhtype"] == "sha2-256"
        assert multipart_file(request) == data
        return httpx.Response(200, json={"Key": str(expected), "Size": len(data)})

    assert run_with(handler, lambda n: n.put_block(data, DAG_PB)) == expected


def test_put_block_refuses_a_node_that_reports_another_cid() -> None:
    other = CID.hash(RAW, b"something else")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"Key": str(other), "Size": 1})

    with pytest.raises(IntegrityError):
        run_with(handler, lambda n: n.put_block(b"mine", RAW))


def test_get_block_refuses_bytes_that_do_not_match_the_cid() -> None:
    cid = CID.hash(RAW, b"the real block")

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.params["arg"] == str(cid)
        return httpx.Response(200, content=b"a forged block")

    with pytest.raises(IntegrityError) as info:
        run_with(handler, lambda n: n.get_block(cid))
    assert info.value.cid == str(cid)


def test_has_block_asks_offline_and_maps_not_found_to_false() -> None:
    cid = CID.hash(RAW, b"x")

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v0/block/stat"
        assert request.url.params["offline"] == "true"
        return kubo_error(f"block was not found locally (offline): ipld: could not find {cid}")

    assert run_with(handler, lambda n: n.has_block(cid)) is False


def test_kubo_error_carries_command_code_and_message_and_is_not_retried() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return kubo_error("pin: invalid path", code=1)

    with pytest.raises(KuboCommandError) as info:
        run_with(handler, lambda n: n.pin(CID.hash(RAW, b"x")))
    assert (info.value.command, info.value.code, info.value.message) == (
        "pin/add",
        1,
        "pin: invalid path",
    )
    assert calls == 1


def test_connection_refused_names_the_url_and_the_daemon() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main() -> None:
        async with KuboNode(f"http://127.0.0.1:{port}", retry=Retry(retries=0)) as node:
            await node.version()

    with pytest.raises(NodeUnreachableError, match=f"127.0.0.1:{port}.*is the Kubo daemon running"):
        asyncio.run(main())


def test_connection_errors_are_retried_until_success() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={"Version": "0.42.0"})

    assert run_with(handler, lambda n: n.version()) == "0.42.0"
    assert calls == 3


def test_retries_stop_after_the_configured_number() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(503, text="service unavailable")

    with pytest.raises(KuboCommandError) as info:
        run_with(handler, lambda n: n.version(), retry=Retry(retries=2, backoff=0.001))
    assert info.value.status == 503
    assert calls == 3


class _BreaksAfter(httpx.AsyncByteStream):
    """A 200 body that sends ``chunks`` and then fails as a dropped connection does."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        raise httpx.ReadError("connection reset")


async def _collect(stream: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in stream])


def test_export_car_is_retried_until_its_first_byte_arrives() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise httpx.ConnectError("refused", request=request)
        if calls == 2:
            return httpx.Response(200, stream=_BreaksAfter([]))  # fails before any byte
        return httpx.Response(200, content=b"car bytes")

    root = CID.hash(RAW, b"x")
    assert run_with(handler, lambda n: _collect(n.export_car(root))) == b"car bytes"
    assert calls == 3


def test_export_car_failing_after_its_first_byte_raises_and_is_not_retried() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(200, stream=_BreaksAfter([b"car", b" by"]))

    root = CID.hash(RAW, b"x")
    with pytest.raises(NodeUnreachableError, match=r"dag/export.*ReadError"):
        run_with(handler, lambda n: _collect(n.export_car(root)))
    assert calls == 1


def test_timeout_becomes_node_timeout_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    with pytest.raises(NodeTimeoutError, match="id"):
        run_with(handler, lambda n: n.identity())


def test_publish_encodes_topic_as_multibase_and_retries_validation_ignored() -> None:
    calls = 0
    payload = bytes(range(256)) * 4

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        assert request.url.path == "/api/v0/pubsub/pub"
        assert request.url.params["arg"] == "u" + "Z3JhZHN0b3JlL3YxL2pvYi9ncmFkaWVudHM"
        assert multipart_file(request) == payload
        if calls == 1:
            return kubo_error("validation ignored")
        return httpx.Response(200)

    run_with(handler, lambda n: n.publish("gradstore/v1/job/gradients", payload))
    assert calls == 2


def test_publish_refuses_oversized_messages_before_sending() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("nothing should be sent")

    with pytest.raises(LimitExceededError):
        run_with(handler, lambda n: n.publish("t", bytes(MAX_PUBSUB_DATA)))


def test_car_roots_learns_the_header_from_any_split_of_the_stream() -> None:
    root = CID.hash(RAW, b"x")
    car = b"".join(bytes(p) for p in write_car([root], [Block(root, b"x")]))
    for step in (1, 3, len(car)):
        seen = rpc.CarRoots()
        for i in range(0, len(car), step):
            seen.see(car[i : i + step])
        assert seen.roots == [root]


def test_car_roots_refuses_an_absurd_header_length() -> None:
    with pytest.raises(DAGError, match="header length"):
        rpc.CarRoots().see(b"\xff\xff\xff\x7f")


def test_import_car_streams_the_body_then_pins_the_roots_offline() -> None:
    root = CID.hash(RAW, b"x")
    pieces = list(write_car([root], [Block(root, memoryview(b"x"))]))
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        if request.url.path == "/api/v0/dag/import":
            assert request.url.params["pin-roots"] == "false"
            assert "content-length" not in request.headers  # streamed, not one big body
            assert multipart_file(request) == b"".join(bytes(p) for p in pieces)
            return httpx.Response(200, content=b"")
        assert request.url.params["arg"] == str(root)
        assert request.url.params["offline"] == "true"
        return httpx.Response(200, json={})

    assert run_with(handler, lambda n: n.import_car(iter(pieces))) == [root]
    assert seen == ["/api/v0/dag/import", "/api/v0/dag/stat", "/api/v0/pin/add"]


def test_import_car_of_an_incomplete_dag_is_block_not_found() -> None:
    root, leaf = CID.hash(DAG_PB, b"node"), CID.hash(RAW, b"leaf")

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v0/dag/import":
            return httpx.Response(200, content=b"")
        assert request.url.path == "/api/v0/dag/stat"
        return kubo_error(
            f"error traversing DAG: block was not found locally: could not find {leaf}"
        )

    with pytest.raises(BlockNotFoundError) as info:
        run_with(handler, lambda n: n.import_car(write_car([root], [])))
    assert info.value.cid == str(leaf)  # names the missing block, not just the root


def test_import_car_error_inside_the_stream_raises() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        line = json.dumps({"Message": "import failed: bad car", "Code": 0, "Type": "error"})
        return httpx.Response(200, content=(line + "\n").encode())

    with pytest.raises(KuboCommandError, match="bad car"):
        run_with(handler, lambda n: n.import_car([b"junk"]))


def test_unpin_of_something_not_pinned_is_a_no_op() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return kubo_error("not pinned or pinned indirectly")

    assert run_with(handler, lambda n: n.unpin(CID.hash(RAW, b"x"))) is None


def test_pins_parses_recursive_pins() -> None:
    a, b = CID.hash(RAW, b"a"), CID.hash(DAG_PB, b"b")

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.params["type"] == "recursive"
        keys = {str(a): {"Type": "recursive"}, str(b): {"Type": "recursive"}}
        return httpx.Response(200, json={"Keys": keys})

    assert run_with(handler, lambda n: n.pins()) == {a, b}


def test_subscription_reads_ndjson_messages_in_order() -> None:
    lines = [
        {"from": "P", "data": rpc.multibase_u(f"m{i}".encode()), "seqno": rpc.multibase_u(b"\x01")}
        for i in range(3)
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v0/pubsub/sub"
        assert request.url.params["arg"] == rpc.multibase_u(b"topic")
        body = "".join(json.dumps(line) + "\n" for line in lines).encode()
        return httpx.Response(200, content=body)

    async def main(node: KuboNode) -> list[bytes]:
        async with node.subscribe("topic") as sub:
            got = [(await sub.get(2)).data for _ in range(3)]
            with pytest.raises(NodeError, match="ended the stream"):
                await sub.get(2)
            return got

    assert run_with(handler, main) == [b"m0", b"m1", b"m2"]


def test_subscription_error_answer_raises_on_enter() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return kubo_error("experimental pubsub feature not enabled")

    async def main(node: KuboNode) -> None:
        async with node.subscribe("topic"):
            pass

    with pytest.raises(KuboCommandError, match="pubsub feature not enabled"):
        run_with(handler, main)


def test_find_providers_reads_the_provider_events_of_routing_findprovs() -> None:
    """What a node on a real network answers (the suite's daemons have no routing, so none
    finds a provider): query events, then a provider; duplicates and other events skipped."""
    cid = CID.hash(RAW, b"wanted")
    seen: list[httpx.Request] = []
    events = [
        {"Extra": "", "ID": "QmQuery", "Responses": None, "Type": 0},
        {"Extra": "", "ID": "", "Responses": [{"Addrs": [], "ID": "12D3KooWProvider"}], "Type": 4},
        {"Extra": "", "ID": "", "Responses": [{"Addrs": [], "ID": "12D3KooWProvider"}], "Type": 4},
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content="".join(json.dumps(e) + "\n" for e in events))

    found = run_with(handler, lambda n: n.find_providers(cid, limit=2))
    assert found == ["12D3KooWProvider"]
    assert seen[0].url.path == "/api/v0/routing/findprovs"
    assert seen[0].url.params.get_list("arg") == [str(cid)]
    assert seen[0].url.params["num-providers"] == "2"


def test_find_providers_gives_what_it_found_when_its_time_is_up() -> None:
    """A DHT query for a CID nobody provides goes on for a minute: the answer is bounded."""
    cid = CID.hash(RAW, b"wanted")

    async def endless() -> AsyncIterator[bytes]:
        yield b'{"Extra":"","ID":"QmQuery","Responses":null,"Type":0}\n'
        await asyncio.sleep(60)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=endless())

    loop_time: list[float] = []

    async def call(node: KuboNode) -> list[str]:
        start = asyncio.get_running_loop().time()
        try:
            return await node.find_providers(cid, timeout=0.3)
        finally:
            loop_time.append(asyncio.get_running_loop().time() - start)

    assert run_with(handler, call) == []
    assert loop_time[0] < 5
