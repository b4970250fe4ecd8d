"""gateway/upstream/h1.py never hands one request's answer to another: interim 1xx, 101, extra bytes, early answers.

Each test runs two or more requests through one `h1.Client` against a real loopback server (aiohttp, or a
raw asyncio server where the bytes must be ones no framework would send) and checks that every request
gets its own answer: a connection with anything unread on it must never go back to the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import pytest
from aiohttp import web

from gateway.upstream import h1

Script = Callable[[int, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """(head, body) of one request framed by Content-Length, as h1 always sends it."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head, await reader.readexactly(length)


def answer(body: bytes, *, status: bytes = b"200 OK", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-length: %d\r\n%s\r\n%s" % (status, len(body), extra, body)


def own(body: bytes) -> bytes:
    """What a well-behaved server answers to a request whose body is `body`."""
    return answer(b"answer to " + body)


class RawServer:
    """A loopback server speaking raw bytes: connection number `n` runs `script(n, reader, writer)`."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.url = ""
        self._server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = self.connections
        self.connections += 1
        try:
            await self.script(n, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1/completions"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1):
                await self._server.wait_closed()


async def well_behaved(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer every further request on this connection with its own answer."""
    while True:
        _, body = await read_request(reader)
        writer.write(own(body))
        await writer.drain()


async def call(
    client: h1.Client, url: str, body: bytes, headers: Mapping[str, str] | None = None, *, total_s: float = 5.0
) -> tuple[int, bytes]:
    resp = await client.request(
        "POST",
        url,
        {"content-type": "application/json", **(headers or {})},
        body,
        connect_s=2.0,
        first_byte_s=min(total_s, 3.0),
        total_s=total_s,
    )
    try:
        return resp.status, await resp.read()
    finally:
        resp.release()


@pytest.fixture
async def client() -> AsyncIterator[h1.Client]:
    c = h1.Client(4)
    try:
        yield c
    finally:
        c.close()


# -- interim answers -----------------------------------------------------------------------------


async def test_expect_100_continue_answered_by_aiohttp_never_desyncs_the_pool(client: h1.Client) -> None:
    """The reproduced cross-tenant leak: a real aiohttp upstream answers `Expect: 100-continue` with an
    interim 100, then the real answer; the next request on that connection must get its own answer."""
    seen: list[Mapping[str, str]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(request.headers.copy())
        body = await request.read()
        await asyncio.sleep(0.05)  # the real answer comes well after the interim one
        return web.Response(body=b"answer to " + body)

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/completions"
    try:
        first = await call(client, url, b"tenant-a", {"Expect": "100-continue"})
        second = await call(client, url, b"tenant-b", {"Expect": "100-continue"})
        third = await call(client, url, b"tenant-c")
    finally:
        await runner.cleanup()
    assert first == (200, b"answer to tenant-a")
    assert second == (200, b"answer to tenant-b")
    assert third == (200, b"answer to tenant-c")


async def test_unsolicited_interim_answers_are_skipped_and_the_connection_stays_in_step(client: h1.Client) -> None:
    """100, 102 and 103 (with headers) before the final answer, split across writes: skipped, and the
    connection is still reused, each request getting its own answer."""

    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            _, body = await read_request(reader)
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.02)
            writer.write(b"HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </s.css>\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.02)
            writer.write(own(body))
            await writer.drain()

    async with RawServer(script) as srv:
        got = [await call(client, srv.url, b"req-%d" % i) for i in range(4)]
        assert got == [(200, b"answer to req-%d" % i) for i in range(4)]
        assert srv.connections == 1


async def test_an_interim_answer_never_leaks_its_headers_into_the_final_one(client: h1.Client) -> None:
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, body = await read_request(reader)
        writer.write(b"HTTP/1.1 103 Early Hints\r\nx-interim: 1\r\n\r\n" + answer(body, extra=b"x-final: 1\r\n"))
        await writer.drain()

    async with RawServer(script) as srv:
        resp = await client.request("POST", srv.url, {}, b"x", connect_s=2, first_byte_s=2, total_s=2)
        assert resp.status == 200
        assert "x-final" in resp.headers and "x-interim" not in resp.headers
        assert await resp.read() == b"x"


async def test_101_switching_protocols_is_an_error_and_never_pooled(client: h1.Client) -> None:
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if n == 0:
            await read_request(reader)
            writer.write(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n")
            writer.write(own(b"stolen"))  # whatever the "new protocol" says must never reach a request
            await writer.drain()
            await asyncio.sleep(1)
            return
        await well_behaved(reader, writer)

    async with RawServer(script) as srv:
        with pytest.raises(h1.Malformed, match="101"):
            await call(client, srv.url, b"first")
        assert await call(client, srv.url, b"second") == (200, b"answer to second")
        assert srv.connections == 2


async def test_an_interim_answer_with_a_body_is_refused(client: h1.Client) -> None:
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if n == 0:
            _, body = await read_request(reader)
            writer.write(b"HTTP/1.1 150 Odd\r\ncontent-length: 3\r\n\r\nabc" + own(body))
            await writer.drain()
            await asyncio.sleep(1)
            return
        await well_behaved(reader, writer)

    async with RawServer(script) as srv:
        with pytest.raises(h1.Malformed):
            await call(client, srv.url, b"first")
        assert await call(client, srv.url, b"second") == (200, b"answer to second")


# -- bytes beyond the answer ---------------------------------------------------------------------


async def test_a_204_with_a_smuggled_answer_in_its_body_is_not_pooled(client: h1.Client) -> None:
    """A 204 has no body whatever its Content-Length says (RFC 9110 15.3.5): the bytes after it are a
    second answer to one request; the first request sees the 204 and the connection is closed."""

    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if n == 0:
            await read_request(reader)
            smuggled = answer(b"answer to second")
            writer.write(b"HTTP/1.1 204 No Content\r\ncontent-length: %d\r\n\r\n" % len(smuggled) + smuggled)
            await writer.drain()
            await read_request(reader)  # if the client reused the connection, the smuggled answer was its
            await asyncio.sleep(1)
            return
        await well_behaved(reader, writer)

    async with RawServer(script) as srv:
        assert await call(client, srv.url, b"first") == (204, b"")
        assert await call(client, srv.url, b"second") == (200, b"answer to second")
        assert srv.connections == 2


async def test_a_204_declaring_a_body_is_not_pooled_even_when_the_body_comes_later(client: h1.Client) -> None:
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if n == 0:
            await read_request(reader)
            smuggled = answer(b"stolen")
            writer.write(b"HTTP/1.1 204 No Content\r\ncontent-length: %d\r\n\r\n" % len(smuggled))
            await writer.drain()
            await read_request(reader)  # the next request, if the client reused this connection
            writer.write(smuggled)
            await writer.drain()
            await asyncio.sleep(1)
            return
        await well_behaved(reader, writer)

    async with RawServer(script) as srv:
        assert await call(client, srv.url, b"first") == (204, b"")
        assert await call(client, srv.url, b"second") == (200, b"answer to second")
        assert srv.connections == 2


async def test_a_second_answer_pipelined_after_the_first_is_never_read_as_the_next_requests(
    client: h1.Client,
) -> None:
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if n == 0:
            _, body = await read_request(reader)
            writer.write(own(body) + answer(b"stolen by the next tenant"))
            await writer.drain()
            await asyncio.sleep(1)
            return
        await well_behaved(reader, writer)

    async with RawServer(script) as srv:
        assert await call(client, srv.url, b"first") == (200, b"answer to first")
        assert await call(client, srv.url, b"second") == (200, b"answer to second")


async def test_garbage_after_the_answer_closes_the_connection(client: h1.Client) -> None:
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if n == 0:
            _, body = await read_request(reader)
            writer.write(own(body) + b"\x00garbage")
            await writer.drain()
            await asyncio.sleep(1)
            return
        await well_behaved(reader, writer)

    async with RawServer(script) as srv:
        assert await call(client, srv.url, b"first") == (200, b"answer to first")
        assert await call(client, srv.url, b"second") == (200, b"answer to second")
        assert srv.connections == 2


async def test_a_late_answer_arriving_while_idle_closes_the_connection(client: h1.Client) -> None:
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if n == 0:
            _, body = await read_request(reader)
            writer.write(own(body))
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(answer(b"stolen"))
            await writer.drain()
            await asyncio.sleep(1)
            return
        await well_behaved(reader, writer)

    async with RawServer(script) as srv:
        assert await call(client, srv.url, b"first") == (200, b"answer to first")
        await asyncio.sleep(0.2)
        assert await call(client, srv.url, b"second") == (200, b"answer to second")
        assert srv.connections == 2


async def test_an_answer_before_the_request_was_fully_sent_is_not_pooled(client: h1.Client) -> None:
    """The server answers after the head, without reading a large body: the rest of that body would be
    read as the next request, so the connection must not be reused."""
    big = b"x" * (32 * 1024 * 1024)  # far more than loopback socket buffers hold

    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if n == 0:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer(b"too large", status=b"413 Payload Too Large"))
            await writer.drain()
            await asyncio.sleep(1)
            return
        await well_behaved(reader, writer)

    async with RawServer(script) as srv:
        assert await call(client, srv.url, big) == (413, b"too large")
        assert await call(client, srv.url, b"second") == (200, b"answer to second")
        assert srv.connections == 2


async def test_connection_close_answers_are_not_pooled(client: h1.Client) -> None:
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, body = await read_request(reader)
        writer.write(answer(b"answer to " + body, extra=b"connection: close\r\n"))
        await writer.drain()
        await asyncio.sleep(0.5)

    async with RawServer(script) as srv:
        assert await call(client, srv.url, b"a") == (200, b"answer to a")
        assert await call(client, srv.url, b"b") == (200, b"answer to b")
        assert srv.connections == 2


async def test_a_keep_alive_close_racing_reuse_is_a_disconnect_never_a_wrong_answer(client: h1.Client) -> None:
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, body = await read_request(reader)
        writer.write(own(body))
        await writer.drain()
        # Closes the idle connection at once, as a server whose keep-alive timeout is shorter than ours.

    async with RawServer(script) as srv:
        for i in range(10):
            try:
                assert await call(client, srv.url, b"r%d" % i) == (200, b"answer to r%d" % i)
            except h1.Disconnected:
                pass  # the failover loop retries it; what matters is that no request reads another's answer


# -- what the client sends -----------------------------------------------------------------------


async def test_hop_by_hop_and_framing_headers_from_callers_never_reach_the_wire(client: h1.Client) -> None:
    heads: list[bytes] = []

    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head, body = await read_request(reader)
            heads.append(head.lower())
            writer.write(own(body))
            await writer.drain()

    hostile = {
        "Expect": "100-continue",
        "Connection": "upgrade",
        "Upgrade": "h2c",
        "Keep-Alive": "timeout=1000",
        "TE": "trailers",
        "Trailer": "x-late",
        "Transfer-Encoding": "chunked",
        "Content-Length": "0",
        "Host": "evil.example",
        "Proxy-Authorization": "Basic c2VjcmV0",
        "Proxy-Connection": "keep-alive",
        "x-kept": "yes",
    }
    async with RawServer(script) as srv:
        assert await call(client, srv.url, b"body", hostile) == (200, b"answer to body")
    (head,) = heads
    for name in hostile:
        if name != "x-kept" and name not in ("Content-Length", "Host"):
            assert name.lower().encode() + b":" not in head, name
    assert head.count(b"content-length:") == 1 and head.count(b"host:") == 1
    assert b"evil.example" not in head and b"x-kept: yes" in head


@pytest.mark.parametrize("method", ["HEAD", "CONNECT"])
async def test_methods_whose_answers_llhttp_cannot_frame_are_refused(client: h1.Client, method: str) -> None:
    with pytest.raises(ValueError, match=method):
        await client.request(method, "http://127.0.0.1:9/", {}, b"", connect_s=1, first_byte_s=1, total_s=1)


@pytest.mark.parametrize("target", ["/a b", "/a\x00b", "/caf\u00e9", "/a\x7f"])
async def test_a_target_that_would_break_the_request_line_is_refused(client: h1.Client, target: str) -> None:
    with pytest.raises(ValueError, match="request target"):
        await client.request("POST", "http://127.0.0.1:9" + target, {}, b"", connect_s=1, first_byte_s=1, total_s=1)


@pytest.mark.parametrize("value", ["a\rb", "a\nb", "a\x00b"])
async def test_a_header_value_that_would_break_the_head_is_refused(client: h1.Client, value: str) -> None:
    with pytest.raises(ValueError, match="x-bad"):
        await client.request(
            "POST", "http://127.0.0.1:9/", {"x-ok": "1", "x-bad": value}, b"", connect_s=1, first_byte_s=1, total_s=1
        )
