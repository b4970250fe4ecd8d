"""Interim `1xx` answers under the httpx transport: up to ten are skipped, a flood is refused at the count cap
(`caps.upstream_interim_answers`) or, that raised, at the head's byte cap, promptly.

h11 (under httpx) skips interim answers and reads on, so an upstream that sends them without end, none of them
late, would hold a request until `total_ms`. Over real loopback sockets, a raw upstream floods `100 Continue`
and `103 Early Hints` answers: through the gateway served by uvicorn (as h1 does, a 502 naming the cap long
before the timeout), and through a proxy's tunnel, a forwarding proxy and TLS, each pool httpx routes through.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from gateway.config import parse_config
from gateway.upstream.client import Upstream
from tests.helpers.faults import RECORDED_COMPLETION, RECORDED_JSON
from tests.helpers.servers import serve_config
from tests.security.httpx_rig import Pki, Proxy, call
from wire.errors import GatewayError

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
HINTS = b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\nlink: </app.js>; rel=preload\r\n\r\n"
# About 2 KiB, sent every 5 ms: never a read timeout. Few fields, so the byte cap is what both transports meet
# first (h1 counts interim answers' fields against its 200 too).
FLOOD = CONTINUE * 80 + HINTS
TOO_LARGE = "the response headers are larger than the cap of 65536 bytes (caps.upstream_header_bytes)"
TOO_MANY = "the response has more than 10 interim (1xx) answers (caps.upstream_interim_answers)"
# Each cap, and what a flood meets: the count first; with the count raised out of the way, the byte cap.
CAPS = {"count": ("", TOO_MANY), "bytes": ("caps: {upstream_interim_answers: 1000000}\n", TOO_LARGE)}


class Interims:
    """A raw upstream (TLS when given a context). A request under `/flood/` gets interim answers until the
    connection closes; under `/hints/`, one 103 and then the answer; under `/ten/`, ten 100s and the answer
    (as many as the cap lets through); any other, one 100 and the answer."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.port = 0
        self.flood_ended: list[float] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"https://localhost:{self.port}" if self.tls else f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1):
                await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                fields = (line.partition(":") for line in lines[1:])
                await reader.readexactly(next((int(v) for k, _, v in fields if k.lower() == "content-length"), 0))
                target = lines[0].split(" ")[1]  # absolute through a forwarding proxy: the path is still in it
                if "/flood/" in target:
                    try:
                        while True:
                            writer.write(FLOOD)
                            await writer.drain()
                            await asyncio.sleep(0.005)
                    finally:
                        self.flood_ended.append(time.monotonic())
                interim = HINTS if "/hints/" in target else CONTINUE * 10 if "/ten/" in target else CONTINUE
                head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                writer.write(interim + head % len(RECORDED_JSON) + RECORDED_JSON)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, asyncio.CancelledError):
            pass  # a cancellation is stop(): ending quietly keeps asyncio's stream callback from logging it
        finally:
            self._tasks.discard(task)
            writer.transport.abort()


@pytest.fixture
async def plain() -> AsyncIterator[Interims]:
    server = Interims()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def gateway_config(url: str, transport: str, caps: str = "") -> str:
    return (
        caps + "server: {host: 127.0.0.1, port: 0}\n"
        "keys: [{name: t, key: gk-interim}]\n"
        "retries: {attempts: 1}\n"
        "timeouts: {connect_ms: 2000, first_byte_ms: 5000, total_ms: 15000}\n"
        "providers:\n"
        f"  flood: {{kind: openai, api_key: sk-up, base_url: '{url}/flood/v1', transport: {transport}}}\n"
        f"  hints: {{kind: openai, api_key: sk-up, base_url: '{url}/hints/v1', transport: {transport}}}\n"
        f"  cont: {{kind: openai, api_key: sk-up, base_url: '{url}/continue/v1', transport: {transport}}}\n"
        f"  ten: {{kind: openai, api_key: sk-up, base_url: '{url}/ten/v1', transport: {transport}}}\n"
    )


async def complete(client: httpx.AsyncClient, url: str, provider: str) -> httpx.Response:
    body = {"model": f"{provider}/davinci-002", "prompt": "Say hello", "max_tokens": 16}
    return await client.post(url + "/v1/completions", json=body, headers={"authorization": "Bearer gk-interim"})


@pytest.mark.parametrize("cap", list(CAPS))
@pytest.mark.parametrize("transport", ["httpx", "h1"])
async def test_an_interim_flood_is_a_502_naming_the_cap_long_before_the_timeout(
    plain: Interims, tmp_path: Path, transport: str, cap: str
) -> None:
    caps, refused = CAPS[cap]
    with serve_config(tmp_path, gateway_config(plain.url, transport, caps)) as gw:
        async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
            started = time.monotonic()
            resp = await complete(client, gw.url, "flood")
            took = time.monotonic() - started
            assert took < 3, took  # total_ms is 15 s: refused at the cap, not by a timeout
            assert resp.status_code == 502, resp.text
            error = resp.json()["error"]
            assert (error["code"], error["message"]) == ("upstream_answer_too_large", f"Upstream 'flood' {refused}")
            for _ in range(100):  # the upstream connection is closed, not left flooding
                if plain.flood_ended:
                    break
                await asyncio.sleep(0.02)
            assert plain.flood_ended and plain.flood_ended[0] - started < 3
            # One interim answer before the answer is no flood, nor are ten: skipped, and the answer relayed.
            for provider in ("cont", "hints", "ten"):
                done = await complete(client, gw.url, provider)
                assert done.status_code == 200, done.text
                assert done.json()["choices"][0]["text"] == RECORDED_COMPLETION["choices"][0]["text"]


@pytest.mark.parametrize("cap", list(CAPS))
@pytest.mark.parametrize("route", ["tunnel", "forward", "tls"])
async def test_the_cap_holds_through_proxies_and_tls(route: str, proxy: Proxy, pki: Pki, cap: str) -> None:
    caps, refused = CAPS[cap]
    server = Interims(pki.server if route != "forward" else None)
    await server.start()
    via = f"proxy: '{proxy.url}', " if route != "tls" else ""
    provider = f"  p: {{kind: openai, api_key: k, transport: httpx, {via}ca_bundle: '{pki.ca_file}'}}"
    up = Upstream(parse_config(f"{caps}providers:\n{provider}", env={}))
    try:
        assert await call(up, "p", server.url + "/hints") == (200, RECORDED_JSON)
        # A proxy's answer to CONNECT is no interim answer: ten of the upstream's own still pass its tunnel.
        assert await call(up, "p", server.url + "/ten") == (200, RECORDED_JSON)
        started = time.monotonic()
        with pytest.raises(GatewayError) as caught:
            await call(up, "p", server.url + "/flood")
        assert time.monotonic() - started < 3  # the rig's total timeout is 10 s
        assert (caught.value.code, caught.value.message) == ("upstream_answer_too_large", f"Upstream 'p' {refused}")
        assert await call(up, "p", server.url + "/continue") == (200, RECORDED_JSON)
        via_proxy = {"tunnel": "CONNECT localhost", "forward": f"POST {server.url}/hints/v1/completions"}
        if route in via_proxy:
            assert proxy.lines and proxy.lines[0].startswith(via_proxy[route]), proxy.lines
        else:
            assert proxy.lines == []
    finally:
        await up.close()
        await server.stop()
