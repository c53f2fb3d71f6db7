"""A lean HTTP/1.1 keep-alive transport for the shared `httpx.AsyncClient` (plain `http://` upstreams).

httpx's default transport (httpcore on anyio) spends several hundred microseconds of CPU per request here, and
its pool scans every connection, with a `poll` system call each, on every request; at a thousand requests per
second that alone would take most of a core. This transport keeps the httpx client API (requests, responses,
timeouts, exceptions) and replaces only the wire: asyncio protocols, the httptools response parser and a
per-origin stack of idle connections. `https://` upstreams keep httpx's own transport (see `make_http_client`).

Connections idle longer than `keepalive_expiry_s` are closed rather than reused (servers such as uvicorn close
idle connections after 5 s; reusing one just as the server closes it would fail the request).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import httptools
import httpx

_HIGH_WATER_BYTES = 256 * 1024


class _Connection(asyncio.Protocol):
    """One upstream TCP connection carrying one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.complete = False
        self.received_any = False
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._read_until_close = False
        self._keep_alive = False

    # -- asyncio.Protocol -----------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"invalid HTTP response from upstream: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.headers_done and not self.complete and self._read_until_close:
            self.complete = True  # a body delimited by the end of the connection
            self._wake()
        elif not self.complete:
            self._fail(
                httpx.ReadError("upstream closed the connection")
                if self.received_any
                else httpx.RemoteProtocolError("upstream closed the connection without a response")
            )

    # -- httptools callbacks ----------------------------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        names = {name.lower() for name, _ in self.headers}
        self._read_until_close = b"content-length" not in names and b"transfer-encoding" not in names
        # Asked here: after the message is complete the parser has reset and no longer knows.
        self._keep_alive = self._parser.should_keep_alive() and not self._read_until_close
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER_BYTES and self.transport is not None:
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # -- used by the transport --------------------------------------------------------------------------------------

    def start(self, head: bytes, body: bytes) -> None:
        if self.closed or self.transport is None:
            raise httpx.ReadError("the upstream connection closed before the request could be sent")
        self._reset()
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)

    async def wait_headers(self, timeout_s: float | None) -> None:
        while not self.headers_done:
            await self._wait(timeout_s)

    async def next_chunk(self, timeout_s: float | None) -> bytes | None:
        """The next body bytes, or None at the end of the body."""
        while not self._chunks:
            if self.complete:
                return None
            await self._wait(timeout_s)
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        if self._buffered <= _HIGH_WATER_BYTES // 2 and self.transport is not None and not self.closed:
            self.transport.resume_reading()
        return chunk

    @property
    def reusable(self) -> bool:
        return self.complete and not self.closed and not self._chunks and self._keep_alive

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()

    async def _wait(self, timeout_s: float | None) -> None:
        if self._error is not None:
            raise self._error
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout_s, _expire, waiter) if timeout_s is not None else None
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        if self._error is not None:
            raise self._error

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: Exception) -> None:
        if self._error is None:
            self._error = error
        self._wake()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(httpx.ReadTimeout("timed out waiting for the upstream"))


class _Pool:
    """Connections to one origin: a stack of idle ones, a cap on the total, and a queue of waiters."""

    def __init__(self, host: str, port: int, max_connections: int, keepalive_expiry_s: float) -> None:
        self.host = host
        self.port = port
        self.max_connections = max_connections
        self.keepalive_expiry_s = keepalive_expiry_s
        self.idle: list[_Connection] = []
        self.total = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self, connect_timeout_s: float | None, pool_timeout_s: float | None) -> _Connection:
        while True:
            now = time.monotonic()
            while self.idle:
                connection = self.idle.pop()
                if not connection.closed and now - connection.idle_since < self.keepalive_expiry_s:
                    return connection
                self._discard(connection)
            if self.total < self.max_connections:
                self.total += 1
                try:
                    return await self._connect(connect_timeout_s)
                except BaseException:
                    self.total -= 1
                    self._wake_one()
                    raise
            waiter = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, pool_timeout_s)
            except TimeoutError:
                raise httpx.PoolTimeout("no upstream connection became free in time") from None
            finally:
                if waiter in self.waiters:
                    self.waiters.remove(waiter)

    async def _connect(self, timeout_s: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(loop.create_connection(_Connection, self.host, self.port), timeout_s)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {self.host}:{self.port} timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        return connection

    def release(self, connection: _Connection) -> None:
        if connection.reusable:
            connection.idle_since = time.monotonic()
            self.idle.append(connection)
        else:
            self._discard(connection)
        self._wake_one()

    def _discard(self, connection: _Connection) -> None:
        connection.close()
        self.total -= 1

    def _wake_one(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def close(self) -> None:
        for connection in self.idle:
            connection.close()
        self.total -= len(self.idle)
        self.idle.clear()


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, pool: _Pool, connection: _Connection, read_timeout_s: float | None) -> None:
        self._pool = pool
        self._connection: _Connection | None = connection
        self._read_timeout_s = read_timeout_s

    async def __aiter__(self) -> AsyncIterator[bytes]:
        connection = self._connection
        if connection is None:
            return
        while True:
            chunk = await connection.next_chunk(self._read_timeout_s)
            if chunk is None:
                break
            yield chunk
        await self.aclose()

    async def aclose(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool.release(connection)  # an unfinished response makes the connection unusable: it is closed


class LeanHTTPTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over plain TCP with per-origin keep-alive pools. See the module docstring."""

    def __init__(self, *, max_connections_per_origin: int = 512, keepalive_expiry_s: float = 4.0) -> None:
        self._max_connections = max_connections_per_origin
        self._keepalive_expiry_s = keepalive_expiry_s
        self._pools: dict[tuple[str, int], _Pool] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol(f"LeanHTTPTransport only speaks http://, not {url.scheme}://")
        key = (url.host, url.port or 80)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool(key[0], key[1], self._max_connections, self._keepalive_expiry_s)
        timeouts: dict[str, Any] = request.extensions.get("timeout", {})
        try:
            body = request.content
        except httpx.RequestNotRead:
            body = await request.aread()
        head = _request_head(request)
        connection = await pool.acquire(timeouts.get("connect"), timeouts.get("pool"))
        try:
            connection.start(head, body)
            await connection.wait_headers(timeouts.get("read"))
        except BaseException:
            connection.close()
            pool.release(connection)
            raise
        return httpx.Response(
            connection.status,
            headers=connection.headers,
            stream=_ResponseStream(pool, connection, timeouts.get("read")),
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def aclose(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


def _request_head(request: httpx.Request) -> bytes:
    lines = [request.method.encode("ascii") + b" " + request.url.raw_path + b" HTTP/1.1"]
    lines += [name + b": " + value for name, value in request.headers.raw]
    return b"\r\n".join(lines) + b"\r\n\r\n"
