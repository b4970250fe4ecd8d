"""The differential suite: every hostile upstream behaviour in `hostile.py` through both transports.

Each case is sent through `gateway.upstream.client.Upstream` (the layer the pipeline calls) once with
`transport: h1` and once with `transport: httpx`, buffered (`send`) and relayed (`open_stream`), over
real loopback sockets to the raw server. The outcome the gateway would act on (status and body, or
the gateway error class and message) must be the same for both, and must be what RFC 9112 asks where
the case names it. Then several plain requests go through the same pool, one after another: each must
get its own answer, which proves the hostile answer left no bytes behind for another tenant to read.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import pytest

from gateway.config import parse_config
from gateway.upstream.client import Upstream
from gateway.upstream.transport import Timeouts
from wire.errors import GatewayError
from wire.upstream import UpstreamRequest

from .hostile import BODY_CAP, CASES, Case, HostileServer

TRANSPORTS = ("h1", "httpx")
# Short enough for a fast suite, long enough that loopback never trips them by accident.
TIMEOUTS = Timeouts(connect=2.0, first_byte=1.0, total=2.5)
FOLLOW_UPS = 4

Seen = tuple[str, int, bytes] | tuple[str, str, str]


def config(url: str) -> str:
    return f"""
caps: {{upstream_body_bytes: {BODY_CAP}}}
providers:
  h1: {{kind: openai, api_key: k, base_url: {url}/v1, transport: h1, max_connections: 4}}
  httpx: {{kind: openai, api_key: k, base_url: {url}/v1, transport: httpx, max_connections: 4}}
"""


@pytest.fixture
async def server() -> AsyncIterator[HostileServer]:
    srv = HostileServer()
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


def request(url: str, headers: dict[str, str]) -> UpstreamRequest:
    return UpstreamRequest("POST", url + "/v1/completions", {"content-type": "application/json", **headers}, b"{}")


async def outcome(upstream: Upstream, provider: str, req: UpstreamRequest, stream: bool) -> Seen:
    try:
        if not stream:
            resp = await upstream.send(provider, req, TIMEOUTS)
            return ("ok", resp.status, resp.body)
        opened = await upstream.open_stream(provider, req, TIMEOUTS)
        try:
            body = b"".join([chunk async for chunk in opened.chunks()])
        finally:
            opened.close()
        return ("ok", opened.status, body)
    except GatewayError as exc:
        return ("error", type(exc).__name__, exc.message.replace(f"'{provider}'", "'P'"))


def expected(case: Case, seen: Seen, stream: bool) -> bool:
    if case.expect is None or (stream and case.buffered_only):
        return True
    if case.expect[0] == "ok":
        return seen == case.expect
    return seen[0] == "error" and case.expect[1] in ("", seen[1])


async def run(server: HostileServer, case: Case, transport: str, stream: bool) -> tuple[Seen, list[Seen]]:
    upstream = Upstream(parse_config(config(server.url), env={}))
    try:
        first = await outcome(upstream, transport, request(server.url, {"x-case": case.name}), stream)
        await asyncio.sleep(case.pause)
        follow: list[Seen] = []
        for i in range(FOLLOW_UPS):
            follow.append(await outcome(upstream, transport, request(server.url, {"x-req": str(i)}), stream))
        return first, follow
    finally:
        await upstream.close()


def test_the_catalogue_is_big_enough() -> None:
    assert len({c.name for c in CASES}) == len(CASES) >= 40


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "stream"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_both_transports_agree_and_the_pool_stays_in_sync(
    server: HostileServer, case: Case, stream: bool
) -> None:
    seen: dict[str, Seen] = {}
    own = [("ok", 200, b'{"n":%d}' % i) for i in range(FOLLOW_UPS)]
    for transport in TRANSPORTS:
        first, follow = await run(server, case, transport, stream)
        seen[transport] = first
        if case.race and follow[0] == ("error", "UpstreamConnectError", "Upstream 'P' closed the connection"):
            follow[0] = own[0]  # lost the race with the server's close: failed, never someone else's answer
        # The proof of no desync: every later request on this pool reads its own answer, nobody else's.
        assert follow == own, (transport, follow)
        assert expected(case, first, stream), (transport, case.expect, first, case.why)
    if not case.divergence:
        assert seen["h1"] == seen["httpx"], seen


async def test_connect_failures_and_connect_timeouts_map_alike() -> None:
    """Nothing listening, and a TLS handshake that never completes (the connect timeout covers it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    held: list[asyncio.StreamWriter] = []

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        await reader.read()  # never answers; ends when the client gives up

    silent = await asyncio.start_server(mute, "127.0.0.1", 0)
    mute = silent.sockets[0].getsockname()[1]
    fast = Timeouts(connect=0.3, first_byte=5.0, total=5.0)
    try:
        for url, expect in (
            # Nothing reached the upstream: its own class (failed over at once), and the same cause from both.
            (
                f"http://127.0.0.1:{closed}",
                (
                    "UpstreamUnreachableError",
                    "upstream_connection_refused",
                    "Upstream 'P' could not be reached: the connection was refused",
                ),
            ),
            (
                f"https://localhost:{mute}",
                (
                    "UpstreamTimeoutError",
                    "upstream_connect_timeout",
                    "Upstream 'P' timed out connecting (timeouts.connect_ms)",
                ),
            ),
        ):
            upstream = Upstream(parse_config(config(url), env={}))
            try:
                for transport in TRANSPORTS:
                    started = time.monotonic()
                    req = UpstreamRequest("POST", url + "/v1/completions", {}, b"{}")
                    with pytest.raises(GatewayError) as info:
                        await upstream.send(transport, req, fast)
                    message = info.value.message.replace(f"'{transport}'", "'P'")
                    seen = (type(info.value).__name__, info.value.code, message)
                    assert seen == expect, (transport, url)
                    assert time.monotonic() - started < 2.0  # the connect timeout, not the total one
            finally:
                await upstream.close()
    finally:
        for w in held:
            w.transport.abort()
        silent.close()
        await silent.wait_closed()
