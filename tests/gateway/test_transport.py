"""The lean HTTP/1.1 transport against scripted raw-socket servers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest

from gateway.http_client import ProxyClient
from gateway.transport import LeanHTTPTransport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await reader.readexactly(length)


class ScriptedServer:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> str:
        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(reader, writer)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


async def keep_alive_json(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        _, body = await read_request(reader)
        payload = b'{"echo": ' + str(len(body)).encode() + b"}"
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(payload))
        writer.write(payload)
        await writer.drain()


def client(**kwargs) -> httpx.AsyncClient:
    return ProxyClient(transport=LeanHTTPTransport(**kwargs), timeout=httpx.Timeout(5.0))


async def test_connections_are_reused():
    server = ScriptedServer(keep_alive_json)
    async with server as url, client() as http:
        for size in (0, 10, 100_000):
            response = await http.post(f"{url}/x", content=b"a" * size)
            assert response.json() == {"echo": size}
        await asyncio.gather(*(http.post(f"{url}/x", content=b"b") for _ in range(20)))
    assert server.connections <= 20


async def test_chunked_streaming_response_arrives_chunk_by_chunk():
    release = asyncio.Event()

    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n")
        writer.write(b"6\r\nfirst\n\r\n")
        await writer.drain()
        await release.wait()
        writer.write(b"7\r\nsecond\n\r\n0\r\n\r\n")
        await writer.drain()

    async with ScriptedServer(handler) as url, client() as http:
        async with http.stream("POST", f"{url}/s", content=b"{}") as response:
            chunks = response.aiter_raw()
            assert await chunks.__anext__() == b"first\n"
            release.set()
            assert [c async for c in chunks] == [b"second\n"]


async def test_body_delimited_by_connection_close_and_connection_close_header():
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end")
        await writer.drain()

    server = ScriptedServer(handler)
    async with server as url, client() as http:
        assert (await http.get(f"{url}/a")).text == "until the end"
        assert (await http.get(f"{url}/a")).text == "until the end"
    assert server.connections == 2


async def test_idle_connections_past_expiry_are_not_reused():
    server = ScriptedServer(keep_alive_json)
    async with server as url, client(keepalive_expiry_s=0.0) as http:
        await http.post(f"{url}/x", content=b"1")
        await http.post(f"{url}/x", content=b"2")
    assert server.connections == 2


async def test_server_closing_an_idle_connection_is_noticed():
    async def one_request_per_connection(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        # then close without saying so in the headers

    server = ScriptedServer(one_request_per_connection)
    transport = LeanHTTPTransport()
    async with server as url, ProxyClient(transport=transport) as http:
        assert (await http.get(f"{url}/a")).text == "ok"
        (pool,) = transport._pools.values()
        for _ in range(500):  # wait (bounded) until the server's close has reached the idle connection
            if all(connection.closed for connection in pool.idle):
                break
            await asyncio.sleep(0.01)
        assert (await http.get(f"{url}/a")).text == "ok"
    assert server.connections == 2


async def test_errors_map_to_httpx_exceptions():
    async def silent(reader, writer):
        await read_request(reader)
        await asyncio.sleep(5)

    async def hang_up(reader, writer):
        await read_request(reader)

    async def garbage(reader, writer):
        await read_request(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async with client() as http:
        with pytest.raises(httpx.ConnectError):
            await http.get("http://127.0.0.1:9/")
        async with ScriptedServer(silent) as url:
            with pytest.raises(httpx.ReadTimeout):
                await http.get(f"{url}/", timeout=httpx.Timeout(5.0, read=0.2))
        async with ScriptedServer(hang_up) as url:
            with pytest.raises(httpx.RemoteProtocolError):
                await http.get(f"{url}/")
        async with ScriptedServer(garbage) as url:
            with pytest.raises(httpx.RemoteProtocolError):
                await http.get(f"{url}/")


async def test_pool_limit_queues_requests():
    server = ScriptedServer(keep_alive_json)
    async with server as url, client(max_connections_per_origin=2) as http:
        responses = await asyncio.gather(*(http.post(f"{url}/x", content=b"z") for _ in range(10)))
    assert all(r.status_code == 200 for r in responses)
    assert server.connections == 2


async def test_cookies_are_never_kept():
    async def set_cookie(reader, writer):
        while True:
            head, _ = await read_request(reader)
            body = b"cookie" if b"cookie:" in head.lower() else b"none"
            writer.write(b"HTTP/1.1 200 OK\r\nset-cookie: a=1\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    async with ScriptedServer(set_cookie) as url, client() as http:
        assert (await http.get(f"{url}/")).text == "none"
        assert (await http.get(f"{url}/")).text == "none"
