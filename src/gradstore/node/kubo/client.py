"""``KuboClient``: one Kubo RPC endpoint (``/api/v0``) over httpx, the send path of ``KuboNode``.

Request building and answer parsing live in ``rpc``; this module only sends: one
``httpx.AsyncClient`` per endpoint, every failure mapped to the node layer's errors, retries
for calls that are safe to repeat, streamed bodies and answers, and long-lived streams
(``pubsub/sub``) on a client of their own.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

import httpx

from ..._closing import AsyncClosing
from ...dag.cid import CID
from ...errors import NodeError
from .._config import Retry
from . import rpc
from .counts import count
from .settings import DEFAULT_TIMEOUTS, Timeouts

if TYPE_CHECKING:
    from typing_extensions import Buffer

BodyFactory = Callable[[], AsyncIterator[bytes | memoryview]]
"""Builds a fresh request body per attempt, so a retried call sends its body again."""


class KuboClient(AsyncClosing):
    """Sends RPC commands to the Kubo at ``api`` (a URL, ``host:port`` or a multiaddr).

    ``auth`` is sent as the ``Authorization`` header; ``retry`` paces the calls that are
    safe to repeat; ``transport`` is for tests (``httpx.MockTransport``).
    """

    def __init__(
        self,
        api: str,
        *,
        auth: str | None = None,
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
        retry: Retry | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.api = rpc.api_url(api)
        self.auth = auth or None
        self.timeouts = timeouts
        self.retry = retry if retry is not None else Retry()
        self.transport = transport
        self._client = self._new_client(timeouts.to_httpx())

    def __repr__(self) -> str:
        return f"KuboClient({self.api!r})"

    def _new_client(self, timeout: httpx.Timeout) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.api + rpc.API_PREFIX,
            headers={"Authorization": self.auth} if self.auth else {},
            timeout=timeout,
            transport=self.transport,
            # a plain http:// API uses no TLS: no certificate bundle to load (about 50 ms of
            # every command); an https:// one verifies as usual
            verify=not self.api.startswith("http://"),
        )

    async def aclose(self) -> None:
        """Close the HTTP client (streams opened by ``stream`` close on their own)."""
        await self._client.aclose()

    def _request(
        self,
        client: httpx.AsyncClient,
        command: str,
        params: rpc.Params,
        body: BodyFactory | None,
        boundary: str,
        length: int | None = None,
    ) -> httpx.Request:
        query = httpx.QueryParams(tuple(params))
        if body is None:
            return client.build_request("POST", command, params=query)
        content = cast("AsyncIterator[bytes]", body())  # httpx sends memoryviews as they are
        headers = {"Content-Type": rpc.multipart_content_type(boundary)}
        if length is not None:
            # a body of known length goes out with Content-Length, not chunked: Kubo closes
            # the connection after most chunked uploads, so each one paid a new TCP connect
            headers["Content-Length"] = str(length)
        return client.build_request("POST", command, params=query, content=content, headers=headers)

    @staticmethod
    def transient(error: Exception) -> bool:
        """Whether ``error`` is a failure that repeating the call may cure."""
        return isinstance(error, NodeError) and rpc.is_transient(error)

    @contextlib.contextmanager
    def _mapped(self, command: str) -> Iterator[None]:
        """Translate httpx's exceptions while reading an answer to ``command``."""
        try:
            yield
        except httpx.HTTPError as exc:
            raise rpc.error_from_transport(exc, command, self.api) from exc

    async def _send(
        self,
        command: str,
        params: rpc.Params,
        *,
        body: BodyFactory | None = None,
        boundary: str = "",
        cid: CID | None = None,
        client: httpx.AsyncClient | None = None,
        length: int | None = None,
    ) -> httpx.Response:
        """Send one request; return its streaming answer once it is a 200 (the caller closes it).
        ``length``: the body's size in bytes, when known before it is sent."""
        client = client or self._client
        count(command)
        request = self._request(client, command, params, body, boundary, length)
        with self._mapped(command):
            response = await client.send(request, stream=True)
        if response.status_code == 200:
            return response
        try:
            with self._mapped(command):
                content = await response.aread()
        finally:
            await response.aclose()
        raise rpc.error_from_response(command, response.status_code, content, cid=cid)

    @contextlib.asynccontextmanager
    async def open(
        self,
        command: str,
        params: rpc.Params,
        *,
        body: BodyFactory | None = None,
        boundary: str = "",
        cid: CID | None = None,
        client: httpx.AsyncClient | None = None,
        length: int | None = None,
    ) -> AsyncIterator[httpx.Response]:
        """Send one request and yield the streaming response once it is a 200; map every failure.

        An error answer about ``cid`` may be ``BlockNotFoundError`` (``rpc.error_from_response``).
        """
        response = await self._send(
            command, params, body=body, boundary=boundary, cid=cid, client=client, length=length
        )
        try:
            with self._mapped(command):
                yield response
        finally:
            await response.aclose()

    @contextlib.asynccontextmanager
    async def stream(self, command: str, params: rpc.Params) -> AsyncIterator[httpx.Response]:
        """``open`` on a client of its own with no read timeout, for a long-lived answer.

        The hook subscriptions use: a quiet ``pubsub/sub`` stream is not an error, and it must
        not hold a connection of the client every other call shares.
        """
        client = self._new_client(self.timeouts.streaming())
        try:
            async with self.open(command, params, client=client) as response:
                yield response
        finally:
            await client.aclose()

    async def call(
        self,
        command: str,
        params: rpc.Params | None = None,
        *,
        body: BodyFactory | None = None,
        boundary: str = "",
        cid: CID | None = None,
        retry: bool = True,
        length: int | None = None,
    ) -> bytes:
        """One RPC call, whole answer read; with ``retry``, transient failures are retried.
        ``length``: the body's size in bytes, if known (sent as Content-Length)."""

        async def attempt() -> bytes:
            async with self.open(
                command, params or [], body=body, boundary=boundary, cid=cid, length=length
            ) as response:
                return await response.aread()

        if not retry:
            return await attempt()
        return await self.retry.call(attempt, retry_on=self.transient)

    async def json(self, command: str, params: rpc.Params | None = None, **kwargs: Any) -> Any:
        """``call``, its answer parsed as one JSON value."""
        return rpc.parse_json(command, await self.call(command, params, **kwargs))

    async def upload(
        self,
        command: str,
        params: rpc.Params,
        pieces: AsyncIterable[Buffer] | Iterable[Buffer],
        *,
        retry: bool,
        filename: str = "file",
    ) -> bytes:
        """POST ``pieces`` as one streamed multipart file; ``retry`` only if they can be re-read.
        A list or tuple of pieces (their sizes known) is sent with its Content-Length."""
        boundary = rpc.new_boundary()

        def body() -> AsyncIterator[bytes | memoryview]:
            return rpc.multipart_stream(pieces, boundary, filename=filename)

        length = (
            rpc.multipart_length(pieces, boundary, filename=filename)
            if isinstance(pieces, list | tuple)
            else None
        )
        return await self.call(
            command, params, body=body, boundary=boundary, retry=retry, length=length
        )

    async def chunks(
        self, command: str, params: rpc.Params, *, cid: CID | None = None
    ) -> AsyncIterator[bytes]:
        """The answer's body as it arrives; retried until the first byte, after that a failure
        raises."""

        async def first_chunk() -> tuple[httpx.Response, AsyncIterator[bytes], bytes | None]:
            response = await self._send(command, params, cid=cid)
            chunks = response.aiter_bytes()
            try:
                with self._mapped(command):
                    return response, chunks, await anext(chunks, None)
            except BaseException:
                await response.aclose()
                raise

        response, chunks, first = await self.retry.call(first_chunk, retry_on=self.transient)
        try:
            with self._mapped(command):
                if first is not None:
                    yield first
                async for chunk in chunks:
                    yield chunk
        finally:
            await response.aclose()
