"""gateway/upstream/h1.py, the upstream HTTP/1.1 client, against real loopback servers.

The gateway-level suites already drive it through every provider and fault; these pin the transport
facts they would only show indirectly: bodies larger than the stream buffer, each way a body can be
framed, connection reuse and its limit, and what each kind of failure is reported as.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path

import pytest
import trustme
import uvloop
from aiohttp import web

from gateway.upstream import h1

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Server:
    def __init__(self) -> None:
        self.handler: Handler | None = None
        self.peers: list[object] = []
        self.requests: list[tuple[str, str, Mapping[str, str], bytes]] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append((request.method, request.path_qs, request.headers.copy(), body))
        self.peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        assert self.handler is not None
        return await self.handler(request)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    srv = Server()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", srv.handle)
    # A short shutdown timeout: the hanging handlers below are cancelled at teardown, not waited for.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    srv.url = f"http://127.0.0.1:{port}"
    try:
        yield srv
    finally:
        await runner.cleanup()


async def call(
    client: h1.Client, url: str, body: bytes = b"{}", *, first_byte_s: float = 5.0, total_s: float = 10.0
) -> h1.Response:
    return await client.request(
        "POST",
        url,
        {"content-type": "application/json", "authorization": "Bearer k"},
        body,
        connect_s=2.0,
        first_byte_s=first_byte_s,
        total_s=total_s,
    )


async def test_a_body_larger_than_the_stream_buffer_is_read_whole(server: Server) -> None:
    big = bytes(range(256)) * (3 * 1024 * 1024 // 256)  # 3 MiB, three times the pause threshold

    async def answer(request: web.Request) -> web.StreamResponse:
        return web.Response(body=big)

    server.handler = answer
    client = h1.Client(4)
    try:
        resp = await call(client, server.url + "/v1/completions?x=1", b'{"a":1}')
        assert resp.status == 200
        assert await resp.read() == big
        method, path, headers, sent = server.requests[0]
        assert (method, path, sent) == ("POST", "/v1/completions?x=1", b'{"a":1}')
        assert headers["Host"] == server.url.removeprefix("http://")
        assert headers["authorization"] == "Bearer k"
    finally:
        client.close()


async def test_a_chunked_stream_arrives_piece_by_piece_and_a_slow_reader_loses_nothing(server: Server) -> None:
    pieces = [f"data: {i}\n\n".encode() * 2000 for i in range(60)]  # ~1.4 MB in all, above the pause threshold

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for piece in pieces:
            await resp.write(piece)
        await resp.write_eof()
        return resp

    server.handler = stream
    client = h1.Client(4)
    try:
        resp = await call(client, server.url + "/s")
        got = bytearray()
        async for chunk in resp.iter_chunks():
            got += chunk
            await asyncio.sleep(0)  # a reader slower than the socket
        assert bytes(got) == b"".join(pieces)
        assert resp.at_eof
    finally:
        client.close()


async def test_gzip_bodies_are_decoded_and_compression_is_asked_for(server: Server) -> None:
    async def zipped(request: web.Request) -> web.StreamResponse:
        return web.Response(body=gzip.compress(b'{"ok":true}'), headers={"content-encoding": "gzip"})

    server.handler = zipped
    client = h1.Client(4)
    try:
        resp = await call(client, server.url + "/")
        assert await resp.read() == b'{"ok":true}'
        assert "gzip" in server.requests[0][2]["Accept-Encoding"]
    finally:
        client.close()


async def test_keep_alive_reuses_one_connection_and_the_limit_queues_the_rest(server: Server) -> None:
    async def ok(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(0.02)
        return web.Response(body=b"{}")

    server.handler = ok
    client = h1.Client(2)
    try:
        for _ in range(5):
            await (await call(client, server.url + "/")).read()
        assert len(set(server.peers)) == 1
        server.peers.clear()

        async def one() -> bytes:
            return await (await call(client, server.url + "/")).read()

        assert await asyncio.gather(*[one() for _ in range(8)]) == [b"{}"] * 8
        assert len(set(server.peers)) <= 2  # never more than the provider's max_connections
    finally:
        client.close()


async def test_each_wait_on_a_reused_connection_is_timed_from_its_own_start(server: Server) -> None:
    """The connection's one timer, armed by an earlier request, neither ends a later wait early nor lets it
    run past its own timeout, whether that timeout is longer or shorter than the earlier one's."""
    loop = asyncio.get_running_loop()

    async def after(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(float(request.query["s"]))
        return web.Response(body=b"{}")

    server.handler = after
    client = h1.Client(1)
    try:
        await (await call(client, server.url + "/?s=0", first_byte_s=1.0)).read()  # the timer: due in 1 s
        await asyncio.sleep(0.6)
        # Answered 1.2 s after the first request began, within its own 1 s: the timer fires first and waits on.
        await (await call(client, server.url + "/?s=0.6", first_byte_s=1.0)).read()
        started = loop.time()
        with pytest.raises(TimeoutError, match="first_byte_timeout"):
            await call(client, server.url + "/?s=5", first_byte_s=0.5)
        assert 0.45 <= loop.time() - started < 2.0
        # A shorter wait than the one the timer is armed for: it still ends on time.
        await (await call(client, server.url + "/?s=0", first_byte_s=5.0)).read()
        started = loop.time()
        with pytest.raises(TimeoutError, match="first_byte_timeout"):
            await call(client, server.url + "/?s=5", first_byte_s=0.3)
        assert 0.25 <= loop.time() - started < 2.0
        assert len(set(server.peers[:2])) == 1  # the first two shared one connection
    finally:
        client.close()


@pytest.mark.parametrize("framing", [b"", b"transfer-encoding: notchunked\r\n", b"transfer-encoding: chunked, x\r\n"])
async def test_a_close_delimited_body_ends_with_the_connection(framing: bytes) -> None:
    # Without Content-Length, and with a Transfer-Encoding whose last coding is not chunked, the body is
    # whatever comes before the server closes (RFC 9112 6.3): a whole answer, not a truncated one.
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + framing + b"connection: close\r\n\r\n"
        writer.write(head + b'{"x": 1}')
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    client = h1.Client(2)
    try:
        resp = await call(client, f"http://127.0.0.1:{port}/", b"")
        assert await resp.read() == b'{"x": 1}'
    finally:
        client.close()
        srv.close()
        await srv.wait_closed()


async def test_failures_are_told_apart(server: Server) -> None:
    client = h1.Client(2)
    try:
        # Nothing listens: the connection cannot be opened.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            free = s.getsockname()[1]
        with pytest.raises(h1.ConnectFailed):
            await call(client, f"http://127.0.0.1:{free}/")

        async def hang(request: web.Request) -> web.StreamResponse:
            await asyncio.sleep(5)
            return web.Response()

        server.handler = hang
        with pytest.raises(TimeoutError):
            await call(client, server.url + "/", first_byte_s=0.2)

        async def reset(request: web.Request) -> web.StreamResponse:
            assert request.transport is not None
            request.transport.abort()
            await asyncio.sleep(1)
            return web.Response()

        server.handler = reset
        with pytest.raises(h1.Disconnected):
            await call(client, server.url + "/")

        async def cut(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse()
            await resp.prepare(request)
            await resp.write(b"data: 1\n\n")
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.abort()
            return resp

        server.handler = cut
        resp = await call(client, server.url + "/")
        with pytest.raises(h1.Malformed):
            async for _ in resp.iter_chunks():
                pass
    finally:
        client.close()


async def test_a_header_with_a_line_break_is_refused_before_anything_is_sent(server: Server) -> None:
    client = h1.Client(2)
    try:
        with pytest.raises(ValueError, match="line break"):
            await client.request(
                "POST", server.url + "/", {"x-a": "1\r\nx-b: 2"}, b"", connect_s=1, first_byte_s=1, total_s=1
            )
        assert server.requests == []
    finally:
        client.close()


async def test_https_verifies_the_upstream_certificate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every hosted provider is HTTPS: the client must speak TLS with SNI and refuse a certificate it cannot trust."""
    ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_tls)

    async def answer(request: web.Request) -> web.StreamResponse:
        return web.Response(body=b'{"tls":true}')

    app = web.Application()
    app.router.add_post("/v1/completions", answer)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_tls)
    await site.start()
    url = f"https://localhost:{runner.addresses[0][1]}/v1/completions"
    try:
        # The system's trust store does not know this CA: refused before a byte of the request is sent.
        untrusting = h1.Client(2)
        try:
            with pytest.raises(h1.ConnectFailed, match="CERTIFICATE_VERIFY_FAILED"):
                await call(untrusting, url)
        finally:
            untrusting.close()
        # Trusted through the standard SSL_CERT_FILE variable, which the default context reads.
        ca_file = tmp_path / "ca.pem"
        ca.cert_pem.write_to_path(str(ca_file))
        monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
        trusting = h1.Client(2)
        try:
            resp = await call(trusting, url)
            assert (resp.status, await resp.read()) == (200, b'{"tls":true}')
        finally:
            trusting.close()
    finally:
        await runner.cleanup()


def test_an_answer_that_came_in_time_while_the_loop_was_busy_is_read_not_taken_for_a_timeout() -> None:
    """uvloop (the server's loop) runs its due timers before it polls its sockets again: a loop held busy in
    another connection's I/O callback past `first_byte_s` must still read the answer waiting in the socket before
    it calls the upstream late."""

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}"

    def upstream() -> None:  # in a thread of its own: it answers while the client's loop is held
        conn, _ = listener.accept()
        with conn, contextlib.suppress(OSError):  # a client that gave up resets the connection
            for _ in range(2):
                got = b""
                while b"\r\n\r\n" not in got or not got.endswith(b"{}"):
                    got += conn.recv(65536)
                time.sleep(0.05)  # after the poll that starts the hold, well before the hold ends
                conn.sendall(answer)
            conn.recv(1)

    thread = threading.Thread(target=upstream, daemon=True)
    thread.start()

    async def main() -> bytes:
        loop = asyncio.get_running_loop()
        client = h1.Client(4)
        busy, poke = socket.socketpair()

        def other_work() -> None:  # another connection's, in its I/O callback, holding the loop past the timeout
            busy.recv(1)
            time.sleep(0.6)

        loop.add_reader(busy, other_work)
        try:
            url = f"http://127.0.0.1:{port}/"
            await (await call(client, url)).read()  # connected; the second exchange reuses the connection
            exchange = asyncio.ensure_future(call(client, url, first_byte_s=0.2))
            loop.call_soon(poke.send, b"x")  # right after the exchange's write: the poll that follows runs it
            return await (await exchange).read()
        finally:
            loop.remove_reader(busy)
            busy.close()
            poke.close()
            client.close()

    loop = uvloop.new_event_loop()
    try:
        assert loop.run_until_complete(main()) == b"{}"
    finally:
        loop.close()
        listener.close()
        thread.join(2)
