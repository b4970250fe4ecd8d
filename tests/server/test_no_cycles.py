"""A served request leaves no reference cycle behind: what it allocated is freed when its answer is out.

An object in a cycle outlives its request until the collector finds it; at thousands of requests a second,
a dozen such objects per request made every young collection walk ~11,000 of them (milliseconds each, every
few hundred requests, stalling every request in flight). Each test sends requests over real sockets to a
real uvicorn on a loopback port, then asks the collector what it would free (`gc.DEBUG_SAVEALL` keeps it in
`gc.garbage` to be looked at).
"""

from __future__ import annotations

import asyncio
import collections
import gc
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gateway.server import DISCONNECT
from gateway.upstream.h1 import MAX_HEADERS
from tests.helpers.faults import RECORDED_400, RECORDED_JSON, RECORDED_SSE
from tests.helpers.rawhttp import Client, answer, get, post, read_body, serve
from tests.helpers.recordings import fixture_bytes, sse_events
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread, free_port
from tests.helpers.upstreams import Handler, Received, Upstream, reply, reply_sse

KEY = "gk-no-cycles-71d2"
REQUESTS = 150


def _ours(obj: object) -> bool:
    """An object the gateway made: its type is the gateway's, or it is a coroutine, task or frame of its code."""
    kind = type(obj)
    if kind.__module__.split(".")[0] in ("gateway", "providers", "wire"):
        return True
    code = getattr(obj, "cr_code", None) or getattr(obj, "f_code", None)
    if isinstance(obj, asyncio.Task):
        code = getattr(obj.get_coro(), "cr_code", None)
    return code is not None and "/gateway/" in code.co_filename


def left_in_cycles(send: Callable[[int], None], requests: int = REQUESTS) -> collections.Counter[str]:
    """What of the gateway's own is left in reference cycles by `requests` calls of `send`, by type."""
    send(5)  # first-use work (connections, caches, lazily built tables) is not per request
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        send(requests)
        gc.collect()
        return collections.Counter(type(o).__qualname__ for o in gc.garbage if _ours(o))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def test_a_served_request_that_subscribes_to_its_clients_leaving_leaves_no_cycle() -> None:
    """The protocol's own objects: the request's state, its task, the scope's disconnect extension."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope["extensions"][DISCONNECT](lambda: None)  # as the gateway's endpoints do
        await read_body(receive)
        await answer(send, b"ok")

    with serve(app) as server:
        client = Client(server.config.port)

        def send(n: int) -> None:
            for _ in range(n):
                client.send(get("/x"))
                assert client.response().body == b"ok"

        assert left_in_cycles(send) == {}


# What the everything-on gateway adds: rpm + tpm limits on the key in Redis (and a key whose one request a
# minute is spent at once: every later one a 429), the response cache (every request after the first of a
# body a hit), the ledger on SQLite and the fair queue, as a platform team runs it (bench/everything.py).
EVERYTHING = """
redis: {{url: "{redis}", refresh_ms: 0}}
keys:
  - {{name: k, key: "{key}", limits: {{rpm: 100000000, tpm: 10000000000}}}}
  - {{name: spent, key: "{spent}", limits: {{rpm: 1}}}}
cache: {{mode: always}}
ledger: {{url: "sqlite:///{ledger}"}}
providers:
  up: {{kind: openai, base_url: "{upstream}/v1", api_key: sk-upstream, max_concurrency: 100000, discover: true}}
  again: {{kind: openai, base_url: "{upstream}/v1", api_key: sk-upstream, max_concurrency: 100000}}
  viahttpx: {{kind: openai, base_url: "{upstream}/v1", api_key: sk-upstream, transport: httpx, max_concurrency: 100000}}
  native: {{kind: ollama, base_url: "{upstream}", max_concurrency: 100000}}
  slow: {{kind: openai, base_url: "{upstream}/v1", api_key: sk-upstream, timeouts: {{first_byte_ms: 20}}}}
  down: {{kind: openai, base_url: "http://127.0.0.1:{closed}/v1", api_key: sk-upstream}}
"""
PLAIN = """
keys: [{{name: k, key: "{key}"}}, {{name: spent, key: "{spent}", limits: {{rpm: 1}}}}]
providers:
  up: {{kind: openai, base_url: "{upstream}/v1", api_key: sk-upstream, discover: true}}
  again: {{kind: openai, base_url: "{upstream}/v1", api_key: sk-upstream}}
  viahttpx: {{kind: openai, base_url: "{upstream}/v1", api_key: sk-upstream, transport: httpx}}
  native: {{kind: ollama, base_url: "{upstream}"}}
  slow: {{kind: openai, base_url: "{upstream}/v1", api_key: sk-upstream, timeouts: {{first_byte_ms: 20}}}}
  down: {{kind: openai, base_url: "http://127.0.0.1:{closed}/v1", api_key: sk-upstream}}
"""
# A failing target is retried once at once, and cools down for a millisecond at most (a dropped connection cools
# it at once): every request below reaches the upstream.
COMMON = """
server: {{host: 127.0.0.1, port: 0}}
retries: {{attempts: 2, initial_backoff_ms: 0, max_backoff_ms: 0}}
cooldown: {{min_requests: 100000, base_ms: 1, max_ms: 1}}
# The upstream lists no models (a 404): the background discovery of `up` fails every 100 ms, during every test here.
discovery: {{ttl_ms: 100}}
# A second call goes to the other target when the first has not answered within 5 ms.
models:
  - name: hedged
    hedge_after_ms: 5
    targets: [{{model: up/davinci-002}}, {{model: again/davinci-002}}]
"""
SPENT = "gk-no-cycles-spent-44a0"


@pytest.fixture(
    scope="module",
    params=[("gateway", PLAIN), ("httptools", PLAIN), ("gateway", EVERYTHING)],
    ids=["own protocol", "uvicorn's httptools", "everything on"],
)
def gateway(
    request: pytest.FixtureRequest, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayThread, Upstream]]:
    """The gateway behind its own HTTP/1.1 protocol (the default), behind uvicorn's (`serve --http
    httptools`), and with every feature on."""
    http, features = request.param
    directory: Path = tmp_path_factory.mktemp("no-cycles")
    with Upstream() as upstream:
        config = (COMMON + features).format(
            key=KEY,
            spent=SPENT,
            upstream=upstream.url,
            closed=free_port(),  # free a moment ago: nothing listens there
            redis=redis_server.url,
            ledger=directory / "ledger.db",
        )
        (directory / "gw.yaml").write_text(config)
        with GatewayThread(directory / "gw.yaml", {}, http=http) as gw:
            yield gw, upstream


def _post(path: str, body: bytes, key: str = KEY) -> bytes:
    return post(path, body, f"authorization: Bearer {key}\r\n")


COMPLETION = b'{"model": "up/davinci-002", "prompt": "Say this is a test", "max_tokens": 7}'
# Prompts of their own: with the cache on, a case must not be answered from another's entry.
FAILING = b'{"model": "up/davinci-002", "prompt": "Say this fails", "max_tokens": 7}'
SPEND = b'{"model": "up/davinci-002", "prompt": "Spend the minute", "max_tokens": 7}'
CUT = b'{"model": "up/davinci-002", "prompt": "Cut this", "max_tokens": 7, "stream": true}'
HEDGED = b'{"model": "hedged", "prompt": "Say this fails twice", "max_tokens": 7}'
STREAM = b'{"model": "up/davinci-002", "prompt": "Say this is a test", "max_tokens": 7, "stream": true}'
VIA_HTTPX = b'{"model": "viahttpx/davinci-002", "prompt": "Say this fails through httpx", "max_tokens": 7}'
# Two choices from a provider that answers one per call: the gateway makes two calls and merges their streams.
FAN_OUT = b'{"model": "native/llama3", "prompt": "Cut these two", "max_tokens": 7, "n": 2, "stream": true}'
FAN_OUT_FAILS = b'{"model": "native/llama3", "prompt": "Both of these fail", "max_tokens": 7, "n": 2}'
# `down` is a port nothing listens on.
REFUSED = b'{"model": "down/davinci-002", "prompt": "Nobody there", "max_tokens": 7}'
# `slow` waits 20 ms for an answer to begin and between two reads of it.
SLOW = b'{"model": "slow/davinci-002", "prompt": "Too slow", "max_tokens": 7}'
STALLS = b'{"model": "slow/davinci-002", "prompt": "Stalls midway", "max_tokens": 7, "stream": true}'
CHAT = b'{"model": "up/o3-mini", "messages": [{"role": "user", "content": "Say this is a test"}]}'


def slowly(status: int) -> Handler:
    """An error answered after 20 ms: late enough for the hedge to start its second call."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        await asyncio.sleep(0.02)
        return web.Response(status=status, text='{"error": {"message": "boom"}}', content_type="application/json")

    return handler


def dropped(pieces: list[bytes], headers: dict[str, str]) -> Handler:
    """An answer that sends `pieces`, then drops the connection."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers=headers)
        await resp.prepare(request)
        for piece in pieces:
            await resp.write(piece)
        assert request.transport is not None
        request.transport.close()
        return resp

    return handler


def cut(events: int) -> Handler:
    """A stream that sends `events` of the recording's events, then drops the connection."""
    return dropped([e + b"\n\n" for e in sse_events(RECORDED_SSE)[:events]], {"content-type": "text/event-stream"})


def too_many_headers() -> Handler:
    """An answer with more header fields than the gateway takes from an upstream."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        headers = {f"x-filler-{i}": "x" for i in range(MAX_HEADERS + 1)}
        return web.Response(body=RECORDED_JSON, content_type="application/json", headers=headers)

    return handler


def cut_lines(lines: int) -> Handler:
    """An NDJSON stream (Ollama's) that sends `lines` of the recording's lines, then drops the connection."""
    recorded = fixture_bytes("ollama/generate_stream.ndjson").splitlines(keepends=True)
    return dropped(recorded[:lines], {"content-type": "application/x-ndjson"})


def cut_short() -> Handler:
    """An answer that promises 1,000 bytes, sends a few, then drops the connection."""
    return dropped([b'{"id": "x"'], {"content-type": "application/json", "content-length": "1000"})


def late(seconds: float) -> Handler:
    """The recorded answer, `seconds` late: past the `slow` provider's 20 ms for a first byte."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        await asyncio.sleep(seconds)
        return web.Response(body=RECORDED_JSON, content_type="application/json")

    return handler


def stalls(events: int) -> Handler:
    """A stream that sends `events` of the recording's events, then nothing for longer than a read may wait."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for event in sse_events(RECORDED_SSE)[:events]:
            await resp.write(event + b"\n\n")
        await asyncio.sleep(0.1)
        return resp

    return handler


# (request body, what the upstream answers, the statuses the client may get, what its answer holds)
CASES: dict[str, tuple[bytes, Handler, tuple[int, ...], bytes]] = {
    "completion": (COMPLETION, reply(RECORDED_JSON), (200,), b'"text_completion"'),
    "streamed completion": (STREAM, reply_sse(sse_events(RECORDED_SSE)), (200,), b"[DONE]"),
    "chat": (CHAT, reply(fixture_bytes("openai/chat_o3mini_stop_sequence.json")), (200,), b'"chat.completion"'),
    "invalid request": (
        b'{"model": "up/davinci-002", "prompt": "x", "max_tokens": -1}',
        reply(b""),
        (400,),
        b"max_tokens",
    ),
    "upstream refuses": (FAILING, reply(RECORDED_400, status=400), (400,), b"model_not_found"),
    "upstream fails": (FAILING, reply(b'{"error": {"message": "boom"}}', status=500), (502,), b"error"),
    "both hedged calls fail": (HEDGED, slowly(500), (502,), b"error"),
    # A dropped connection cools its target at once; with health shared through Redis the next request may
    # find it still cooling (the probe's hold): a 503 then, as for the stream cut midway below.
    "upstream body cut short": (FAILING, cut_short(), (502, 503), b"error"),
    "refused head through httpx": (VIA_HTTPX, too_many_headers(), (502,), b"error"),
    "a fanned-out stream cut midway": (FAN_OUT, cut_lines(3), (200, 503), b"error"),
    "upstream too slow to answer": (SLOW, late(0.1), (502, 503, 504), b"error"),
    "upstream stream stalls": (STALLS, stalls(2), (200, 503, 504), b"error"),
    "upstream refuses connections": (REFUSED, reply(b""), (502, 503), b"error"),
    "every call of a fan-out fails": (FAN_OUT_FAILS, reply(b'{"error": "boom"}', status=500), (502, 503), b"error"),
    # With the targets' health shared through Redis, a broken stream may keep its target cooling for the next
    # request (its probe's hold): a 503 then, and the next reaches the upstream again.
    "upstream stream cut midway": (CUT, cut(3), (200, 503), b"error"),
    "rate limited": (FAILING, reply(RECORDED_JSON), (429,), b"rate_limit"),
    "unknown key": (COMPLETION, reply(RECORDED_JSON), (401,), b"error"),
}
# The key each case presents: a key whose one request a minute went in the warm-up, one no one issued.
KEYS = {"rate limited": SPENT, "unknown key": "gk-no-cycles-unknown-0000"}
# Each request of these waits out a timer of 20 ms or more (the hedge's late error, a first byte, a stalled read),
# on the same path every time: a cycle it leaves shows after 50 as surely as after 150, in a third of the time.
TIMED = {"both hedged calls fail": 50, "upstream too slow to answer": 50, "upstream stream stalls": 50}


@pytest.mark.parametrize("case", list(CASES))
def test_a_request_through_the_gateway_leaves_no_cycle(gateway: tuple[GatewayThread, Upstream], case: str) -> None:
    gw, upstream = gateway
    port = gw.port
    body, handler, statuses, holds = CASES[case]
    upstream.handler = handler
    client = Client(port)
    route = "/v1/chat/completions" if b'"messages"' in body else "/v1/completions"
    key = KEYS.get(case, KEY)
    try:
        if key == SPENT:  # its one request a minute, answered
            client.send(_post(route, SPEND, key))
            assert client.response().status == 200

        cooling = 0

        def send(n: int) -> None:
            nonlocal cooling
            for _ in range(n):
                client.send(_post(route, body, key))
                response = client.response()
                assert response.status in statuses, response.body
                assert holds in response.body
                if response.status == 503:
                    # The target was still cooling from the last break (1 ms): wait it out, so that the next
                    # request reaches the upstream however fast this loop runs.
                    cooling += 1
                    time.sleep(0.005)

        requests = TIMED.get(case, REQUESTS)
        assert left_in_cycles(send, requests) == {}
        if body in (CUT, FAN_OUT):  # most of them reached the upstream and broke midway
            prompt = b"Cut this" if body == CUT else b"Cut these two"
            reached = sum(prompt in r.body for r in upstream.received)
            assert reached >= 5 + requests - cooling
            assert reached > requests // 2
    finally:
        client.close()


def test_a_client_that_leaves_mid_stream_leaves_no_cycle(gateway: tuple[GatewayThread, Upstream]) -> None:
    """The 499 path: the client hangs up after the first event; the gateway cancels its upstream call."""
    gw, upstream = gateway
    port = gw.port
    first = sse_events(RECORDED_SSE)[0]
    ended = threading.Semaphore(0)

    async def first_then_hang(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(first + b"\n\n")
        try:
            await asyncio.sleep(30)
        finally:
            ended.release()  # cancelled: the gateway hung up on it
        return resp

    upstream.handler = first_then_hang
    body = b'{"model": "up/davinci-002", "prompt": "Leave midway", "max_tokens": 7, "stream": true}'

    def send(n: int) -> None:
        for _ in range(n):
            client = Client(port)
            client.send(_post("/v1/completions", body))
            assert client.head()[0] == 200
            client._until(b"data: ")  # the first event reached the client
            client.close()
            assert ended.acquire(timeout=5), "the gateway did not hang up on its upstream"

    assert left_in_cycles(send, requests=40) == {}


def test_a_failing_model_listing_leaves_no_cycle(gateway: tuple[GatewayThread, Upstream]) -> None:
    """The background discovery, whose listing call fails (the upstream answers 404): no request involved."""
    _, upstream = gateway

    def wait(n: int) -> None:
        asked = len(upstream.listed)
        deadline = time.monotonic() + 10
        while len(upstream.listed) < asked + n // 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(upstream.listed) >= asked + n // 5, "discovery did not ask the upstream again"

    assert left_in_cycles(wait, requests=100) == {}
