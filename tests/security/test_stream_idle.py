"""Streams that go on without progress: `caps.upstream_idle_stream_bytes` ends them, through the gateway served by
uvicorn, over real sockets, on both transports.

An upstream that sends blank lines, SSE comments or events the gateway ignores, fast and without end, resets the
read timeout at each read: before, only `total_ms` (10 minutes by default) ended the request, holding the client,
the upstream connection and a worker's CPU all along. Now the stream fails once that many bytes came without an
event carrying text, a choice, usage or a finish: an error event after the first event (or, with
`resume_streams`, a continuation elsewhere), a failed attempt (retried and failed over) before it, on completions
and chat; counted and logged once with its cause, the connection closed. Keep-alive pings a few bytes every few
seconds, and one large event arriving in many reads, never meet it.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
from aiohttp import web

from tests.e2e.test_observability import metric
from tests.helpers.accesslog import Lines
from tests.helpers.clients import sse_data
from tests.helpers.faults import CHUNKS, DONE_EVENT, RECORDED_STREAM_TEXT, RECORDED_TEXTS
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream, reply_sse

KiB: Final = 1024
MiB: Final = 1024 * KiB
TOTAL_MS: Final = 30_000  # far beyond what a test waits: only the idle cap can end a flood in time
# What the upstream sends without end, 4 KiB a write: each kind carries nothing for the client.
FLOODS: Final = {
    "blank_lines": b"\n" * 4096,
    "comments": b": ping\n\n" * 512,
    "ignored_events": b'data: {"id":"x","object":"text_completion","created":1,"model":"m","choices":[]}\n\n' * 48,
}

CONFIG: Final = """
server: {{host: 127.0.0.1, port: 0}}
timeouts: {{connect_ms: 2000, first_byte_ms: 5000, total_ms: {total}{timeouts}}}
retries: {{attempts: 2, same_target: 0, initial_backoff_ms: 0, max_backoff_ms: 0}}
cooldown: {{min_requests: 100}}
{caps}
providers:
  flood: {{kind: openai, api_key: sk-idle, base_url: '{url}/flood/v1', transport: {transport}{own}}}
  whole: {{kind: openai, api_key: sk-idle, base_url: '{url}/whole/v1', transport: {transport}}}
models:
  - name: ordered
    strategy: ordered
    targets: [{{model: flood/davinci-002}}, {{model: whole/davinci-002}}]
  - name: resumed
    strategy: ordered
    resume_streams: true
    targets: [{{model: flood/davinci-002}}, {{model: whole/davinci-002}}]
"""


class Flood:
    """An upstream stream: `first` recorded events, then `junk` as fast as the gateway takes it, until it hangs up."""

    def __init__(self, junk: bytes, first: int) -> None:
        self.junk = junk
        self.first = first
        self.began: list[float] = []
        self.ended: list[float] = []
        self.sent = 0  # junk bytes written, every call together

    async def __call__(self, request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        self.began.append(time.monotonic())
        try:
            for event in CHUNKS[: self.first]:
                await resp.write(event + b"\n\n")
            while time.monotonic() - self.began[-1] < 60:
                await resp.write(self.junk)
                self.sent += len(self.junk)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.ended.append(time.monotonic())
        return resp


def serve(
    tmp_path: Path,
    upstream: Upstream,
    transport: str = "h1",
    caps: str = "",
    timeouts: str = "",
    total: int = TOTAL_MS,
    flood_timeouts: str = "",
) -> Any:
    """The gateway for these upstreams; `timeouts`: more of the global block, `flood_timeouts`: the `flood`
    provider's own block (which replaces the global one for direct requests to it)."""
    config = CONFIG.format(
        url=upstream.url,
        transport=transport,
        total=total,
        timeouts=f", {timeouts}" if timeouts else "",
        caps=f"caps: {{{caps}}}" if caps else "",
        own=f", timeouts: {{{flood_timeouts}}}" if flood_timeouts else "",
    )
    return serve_config(tmp_path, config)


def route(upstream: Upstream, **handlers: Any) -> None:
    """Each provider's path (`/flood/...`, `/whole/...`) to its handler."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        result: web.StreamResponse = await handlers[request.path.split("/")[1]](request, received)
        return result

    upstream.handler = handler


def post(gw: GatewayThread, model: str) -> httpx.Response:
    body = {"model": model, "prompt": "Say this is a test", "max_tokens": 16, "stream": True}
    with httpx.Client(trust_env=False, timeout=60) as client:
        return client.post(gw.url + "/v1/completions", json=body)


def failures(gw: GatewayThread, target: str) -> float:
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=15) as c:
        return metric(c.get("/metrics").text, "gateway_upstream_failures_total", target=target, cause="stream_idle")


def texts(events: list[str]) -> list[str]:
    return [ch["text"] for e in events for ch in json.loads(e).get("choices", ())]


def closed_soon(flood: Flood, calls: int) -> None:
    """The upstream connection of each of `calls` floods was closed by the gateway, not left streaming."""
    deadline = time.monotonic() + 5
    while len(flood.ended) < calls and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(flood.ended) == calls, (flood.began, flood.ended)


@pytest.mark.parametrize("kind", list(FLOODS))
@pytest.mark.parametrize("transport", ["h1", "httpx"])
def test_a_flood_after_the_first_events_ends_the_stream_with_the_idle_error(
    tmp_path: Path, upstream: Upstream, access: Lines, transport: str, kind: str
) -> None:
    flood = Flood(FLOODS[kind], first=3)
    route(upstream, flood=flood)
    with serve(tmp_path, upstream, transport) as gw:
        before = failures(gw, "flood/davinci-002")
        started = time.monotonic()
        resp = post(gw, "flood/davinci-002")
        took = time.monotonic() - started
        closed_soon(flood, 1)
        after = failures(gw, "flood/davinci-002")
        # The gateway still answers, and the pool hands out a clean connection.
        route(upstream, flood=reply_sse([*CHUNKS, DONE_EVENT]))
        again = post(gw, "flood/davinci-002")
    assert took < 10, took  # loopback takes the default 1 MiB in well under a second; total_ms is 30 s
    assert resp.status_code == 200, resp.text[:300]
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]", data[-3:]
    error = json.loads(data[-2])["error"]
    assert (error["code"], error["type"]) == ("upstream_stream_idle", "upstream_error"), error
    assert "caps.upstream_idle_stream_bytes" in error["message"]
    assert texts(data[:-2]) == RECORDED_TEXTS[:3]  # what came before the flood reached the client as it came
    # Stopped near the cap, plus what sat in the socket buffers on the way (megabytes on loopback), not after
    # the minute the upstream would go on for.
    assert 1 * MiB <= flood.sent < 32 * MiB, flood.sent
    [line] = [x for x in access.lines if x["request_id"] == resp.headers["x-request-id"]]
    assert (line["status"], line["error"], line["cause"], line["target"]) == (
        502,
        "upstream_stream_idle",
        "stream_idle",
        "flood/davinci-002",
    )
    assert after - before == 1  # counted once
    assert "".join(texts(sse_data(again.text)[:-1])) == RECORDED_STREAM_TEXT


@pytest.mark.parametrize("transport", ["h1", "httpx"])
def test_a_flood_before_the_first_event_is_a_failed_attempt_that_fails_over(
    tmp_path: Path, upstream: Upstream, transport: str
) -> None:
    flood = Flood(FLOODS["comments"], first=0)
    route(upstream, flood=flood, whole=reply_sse([*CHUNKS, DONE_EVENT]))
    with serve(tmp_path, upstream, transport) as gw:
        # Alone: nothing reached the client, so the failure is the answer, in the dialect's shape.
        alone = post(gw, "flood/davinci-002")
        # With another target: the request moves on to it, and the client never sees the flood.
        moved = post(gw, "ordered")
        closed_soon(flood, 2)
    assert alone.status_code == 502, alone.text[:300]
    assert alone.json()["error"]["code"] == "upstream_stream_idle"
    assert moved.status_code == 200, moved.text[:300]
    assert moved.headers["x-gateway-attempts"] == "2"
    assert "".join(texts(sse_data(moved.text)[:-1])) == RECORDED_STREAM_TEXT
    assert [r.path.split("/")[1] for r in upstream.received] == ["flood", "flood", "whole"]


def test_a_chat_stream_meets_the_same_cap(tmp_path: Path, upstream: Upstream) -> None:
    flood = Flood(FLOODS["comments"], first=0)
    route(upstream, flood=flood)
    body = {"model": "flood/davinci-002", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    with serve(tmp_path, upstream) as gw, httpx.Client(trust_env=False, timeout=60) as client:
        resp = client.post(gw.url + "/v1/chat/completions", json=body)
        closed_soon(flood, 1)
    assert resp.status_code == 502, resp.text[:300]
    assert resp.json()["error"]["code"] == "upstream_stream_idle"
    assert upstream.received[0].path == "/flood/v1/chat/completions"


def test_a_flood_after_the_first_events_is_resumed_elsewhere_with_resume_streams(
    tmp_path: Path, upstream: Upstream
) -> None:
    flood = Flood(FLOODS["blank_lines"], first=3)

    async def rest(request: web.Request, received: Received) -> web.StreamResponse:
        left = int(received.json()["max_tokens"])  # what the flood's three tokens left of 16
        handler = reply_sse([*CHUNKS[len(CHUNKS) - left :], DONE_EVENT])
        result: web.StreamResponse = await handler(request, received)
        return result

    route(upstream, flood=flood, whole=rest)
    with serve(tmp_path, upstream) as gw:
        resp = post(gw, "resumed")
        closed_soon(flood, 1)
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]" and all("error" not in json.loads(d) for d in data[:-1]), data[-3:]
    assert "".join(texts(data[:-1])) == RECORDED_STREAM_TEXT  # one uninterrupted stream
    assert [r.path.split("/")[1] for r in upstream.received] == ["flood", "whole"]
    assert upstream.received[1].json()["max_tokens"] == 16 - 3


def test_keep_alive_pings_between_events_never_meet_the_cap(tmp_path: Path, upstream: Upstream) -> None:
    """A ping every 20 ms while the model thinks, a second long, between every two events: the stream is whole."""
    pings = b": ping\n\n"

    async def slow(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for event in CHUNKS[:2]:
            for _ in range(50):
                await resp.write(pings)
                await asyncio.sleep(0.02)
            await resp.write(event + b"\n\n")
        for event in [*CHUNKS[2:], DONE_EVENT]:
            await resp.write(event + b"\n\n")
        await resp.write_eof()
        return resp

    route(upstream, flood=slow)
    with serve(tmp_path, upstream, caps="upstream_idle_stream_bytes: 1024") as gw:
        resp = post(gw, "flood/davinci-002")
    assert "".join(texts(sse_data(resp.text)[:-1])) == RECORDED_STREAM_TEXT  # 400 bytes of pings before each


def test_a_large_event_arriving_in_many_reads_is_not_idle(tmp_path: Path, upstream: Upstream) -> None:
    """Pings just under the cap, then an event near the event cap in 1 KiB writes: only what came before the
    event counts, so it is relayed; the same pings with as many bytes of comments after them are not."""
    big = json.loads(CHUNKS[0][len(b"data: ") :])
    big["choices"][0]["text"] = "a" * (60 * KiB)
    event = b"data: " + json.dumps(big).encode() + b"\n\n"

    def handler(junk: bytes) -> Any:
        async def send(request: web.Request, received: Received) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b": ping\n\n" * (7 * KiB))  # 56 KiB
            await asyncio.sleep(0.05)
            for i in range(0, len(junk), KiB):
                await resp.write(junk[i : i + KiB])
                await asyncio.sleep(0)
            for e in [*CHUNKS[1:], DONE_EVENT]:
                await resp.write(e + b"\n\n")
            await resp.write_eof()
            return resp

        return send

    caps = "upstream_event_bytes: 65536, upstream_idle_stream_bytes: 65536"
    route(upstream, flood=handler(event))
    with serve(tmp_path, upstream, caps=caps) as gw:
        whole = post(gw, "flood/davinci-002")
        route(upstream, flood=handler(b": " + b"x" * (len(event) - 3) + b"\n"))
        idle = post(gw, "flood/davinci-002")
    assert "".join(texts(sse_data(whole.text)[:-1])) == "a" * (60 * KiB) + "".join(RECORDED_TEXTS[1:])
    assert idle.status_code == 502 and idle.json()["error"]["code"] == "upstream_stream_idle", idle.text[:300]
