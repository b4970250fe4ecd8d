"""Streams that trickle without progress: `timeouts.stream_idle_ms` ends them, through the gateway served by uvicorn,
over real sockets, on both transports.

A comment or an ignored event every so often, each within the read timeout, and never a token: too few bytes for
`caps.upstream_idle_stream_bytes`, so before, only `total_ms` ended the request, holding the client, its slot and
the upstream connection. Now the stream fails once a keep-alive arrives that long after the last event that
carried anything (the silence before the first keep-alive counted): an error event after the first event, resumed
with `resume_streams`, a failed attempt that fails over before it, on completions and chat; counted and logged
once. Unset, the time is `first_byte_ms`; pings between events that carry something never meet it.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Final

import httpx
import pytest
from aiohttp import web

from tests.helpers.accesslog import Lines
from tests.helpers.clients import sse_data
from tests.helpers.faults import CHUNKS, DONE_EVENT, RECORDED_STREAM_TEXT, RECORDED_TEXTS
from tests.helpers.upstreams import Received, Upstream, reply_sse
from tests.security.test_stream_idle import Flood, closed_soon, failures, post, route, serve, texts

IDLE_MS: Final = 1500
IDLE_S: Final = IDLE_MS / 1000
TOTAL_MS: Final = 10_000  # far beyond what a test waits: only the idle time can end a trickle in time
# A stream ended by the idle time was held at most one ping (and the upstream's next write, which finds the
# connection closed) past it; one left to `total_ms` is held 10 s.
LATE_S: Final = 0.8
TRICKLES: Final = {
    "comments": b": ping\n\n",
    "ignored_events": b'data: {"id":"x","object":"text_completion","created":1,"model":"m","choices":[]}\n\n',
}
# The `flood` provider's own timeouts, which direct requests to it use.
OWN: Final = f"connect_ms: 2000, first_byte_ms: 5000, total_ms: {TOTAL_MS}, stream_idle_ms: {IDLE_MS}"


class Trickle(Flood):
    """An upstream stream: `first` recorded events, then `junk` every `every` s until the gateway hangs up.
    `gap`: silence between the last event and the first junk; `quiet`: silence before the last event, which then
    comes in one write with the first junk, as two chunks of the body (one socket read for the gateway)."""

    def __init__(self, junk: bytes, first: int, every: float = 0.1, gap: float = 0.0, quiet: float = 0.0) -> None:
        super().__init__(junk, first)
        self.every, self.gap, self.quiet = every, gap, quiet
        self.progress: list[float] = []  # when each call's last recorded event went out (its head, without any)

    async def __call__(self, request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        self.began.append(time.monotonic())
        self.progress.append(self.began[-1])
        try:
            for i, event in enumerate(CHUNKS[: self.first]):
                if i < self.first - 1 or not self.quiet:
                    await resp.write(event + b"\n\n")
                else:
                    await asyncio.sleep(self.quiet)
                    framed = [event + b"\n\n", self.junk]
                    assert request.transport is not None
                    request.transport.write(b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in framed))
                self.progress[-1] = time.monotonic()
            await asyncio.sleep(self.gap)
            while time.monotonic() - self.began[-1] < 60:
                await resp.write(self.junk)
                self.sent += len(self.junk)
                await asyncio.sleep(self.every)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.ended.append(time.monotonic())
        return resp

    def held(self, call: int = 0) -> float:
        """How long a call's stream went on after its last event that carried anything."""
        return self.ended[call] - self.progress[call]


@pytest.mark.parametrize("kind", list(TRICKLES))
@pytest.mark.parametrize("transport", ["h1", "httpx"])
def test_a_trickle_after_the_first_events_ends_the_stream_with_the_idle_error(
    tmp_path: Path, upstream: Upstream, access: Lines, transport: str, kind: str
) -> None:
    trickle = Trickle(TRICKLES[kind], first=3)
    route(upstream, flood=trickle)
    with serve(tmp_path, upstream, transport, total=TOTAL_MS, flood_timeouts=OWN) as gw:
        before = failures(gw, "flood/davinci-002")
        resp = post(gw, "flood/davinci-002")
        closed_soon(trickle, 1)
        after = failures(gw, "flood/davinci-002")
        # The gateway still answers, and the pool hands out a clean connection.
        route(upstream, flood=reply_sse([*CHUNKS, DONE_EVENT]))
        again = post(gw, "flood/davinci-002")
    assert IDLE_S <= trickle.held() < IDLE_S + LATE_S, trickle.held()
    assert resp.status_code == 200, resp.text[:300]
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]", data[-3:]
    error = json.loads(data[-2])["error"]
    assert (error["code"], error["type"]) == ("upstream_stream_idle", "upstream_error"), error
    assert f"went more than {IDLE_MS} ms" in error["message"], error
    assert "timeouts.stream_idle_ms" in error["message"], error
    assert texts(data[:-2]) == RECORDED_TEXTS[:3]  # what came before the trickle reached the client as it came
    [line] = [x for x in access.lines if x["request_id"] == resp.headers["x-request-id"]]
    assert (line["status"], line["error"], line["cause"], line["target"]) == (
        502,
        "upstream_stream_idle",
        "stream_idle",
        "flood/davinci-002",
    )
    assert after - before == 1  # counted once
    assert "".join(texts(sse_data(again.text)[:-1])) == RECORDED_STREAM_TEXT


@pytest.mark.parametrize(
    ("gap", "quiet"),
    [
        # Silent for most of the idle time after the last event, then pinging: ended a ping after the idle time
        # from the event, not a whole idle time after the first ping.
        pytest.param(1.2, 0.0, id="silence_before_the_first_ping"),
        # The last event after a long silence, a ping read with it: the idle time starts at that event, not at
        # the silence before it.
        pytest.param(0.0, 1.2, id="a_ping_read_with_the_event"),
    ],
)
@pytest.mark.parametrize("transport", ["h1", "httpx"])
def test_the_idle_time_counts_from_the_last_event_that_carried_something(
    tmp_path: Path, upstream: Upstream, transport: str, gap: float, quiet: float
) -> None:
    made = Trickle(TRICKLES["comments"], first=3, gap=gap, quiet=quiet)
    route(upstream, flood=made)
    with serve(tmp_path, upstream, transport, total=TOTAL_MS, flood_timeouts=OWN) as gw:
        resp = post(gw, "flood/davinci-002")
        closed_soon(made, 1)
    assert json.loads(sse_data(resp.text)[-2])["error"]["code"] == "upstream_stream_idle", resp.text[-300:]
    assert IDLE_S <= made.held() < IDLE_S + LATE_S, made.held()


@pytest.mark.parametrize("transport", ["h1", "httpx"])
def test_a_trickle_before_the_first_event_is_a_failed_attempt_that_fails_over(
    tmp_path: Path, upstream: Upstream, transport: str
) -> None:
    trickle = Trickle(TRICKLES["comments"], first=0)
    route(upstream, flood=trickle, whole=reply_sse([*CHUNKS, DONE_EVENT]))
    with serve(tmp_path, upstream, transport, timeouts=f"stream_idle_ms: {IDLE_MS}", total=TOTAL_MS) as gw:
        # Alone: nothing reached the client, so the failure is the answer, in the dialect's shape.
        alone = post(gw, "flood/davinci-002")
        # With another target: the request moves on to it, and the client never sees the trickle.
        moved = post(gw, "ordered")
        closed_soon(trickle, 2)
    assert alone.status_code == 502, alone.text[:300]
    assert alone.json()["error"]["code"] == "upstream_stream_idle"
    assert "timeouts.stream_idle_ms" in alone.json()["error"]["message"]
    assert all(IDLE_S <= trickle.held(i) < IDLE_S + LATE_S for i in range(2)), trickle.ended
    assert moved.status_code == 200, moved.text[:300]
    assert moved.headers["x-gateway-attempts"] == "2"
    assert "".join(texts(sse_data(moved.text)[:-1])) == RECORDED_STREAM_TEXT
    assert [r.path.split("/")[1] for r in upstream.received] == ["flood", "flood", "whole"]


def test_a_chat_stream_meets_the_same_idle_time(tmp_path: Path, upstream: Upstream) -> None:
    trickle = Trickle(TRICKLES["comments"], first=0)
    route(upstream, flood=trickle)
    body = {"model": "flood/davinci-002", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    with (
        serve(tmp_path, upstream, total=TOTAL_MS, flood_timeouts=OWN) as gw,
        httpx.Client(trust_env=False, timeout=60) as client,
    ):
        resp = client.post(gw.url + "/v1/chat/completions", json=body)
        closed_soon(trickle, 1)
    assert resp.status_code == 502, resp.text[:300]
    assert resp.json()["error"]["code"] == "upstream_stream_idle"
    assert upstream.received[0].path == "/flood/v1/chat/completions"


def test_unset_it_is_first_byte_ms(tmp_path: Path, upstream: Upstream) -> None:
    """A ping every 0.25 s, well within the read timeout of 1.5 s: the stream ends 1.5 s after its last event."""
    trickle = Trickle(TRICKLES["comments"], first=3, every=0.25)
    route(upstream, flood=trickle)
    own = f"first_byte_ms: {IDLE_MS}, total_ms: {TOTAL_MS}"
    with serve(tmp_path, upstream, total=TOTAL_MS, flood_timeouts=own) as gw:
        resp = post(gw, "flood/davinci-002")
        closed_soon(trickle, 1)
    error = json.loads(sse_data(resp.text)[-2])["error"]
    assert error["code"] == "upstream_stream_idle", error
    assert f"went more than {IDLE_MS} ms" in error["message"], error
    assert IDLE_S <= trickle.held() < IDLE_S + LATE_S, trickle.held()


def test_a_trickle_after_the_first_events_is_resumed_elsewhere_with_resume_streams(
    tmp_path: Path, upstream: Upstream
) -> None:
    trickle = Trickle(TRICKLES["ignored_events"], first=3)

    async def rest(request: web.Request, received: Received) -> web.StreamResponse:
        left = int(received.json()["max_tokens"])  # what the trickle's three tokens left of 16
        result: web.StreamResponse = await reply_sse([*CHUNKS[len(CHUNKS) - left :], DONE_EVENT])(request, received)
        return result

    route(upstream, flood=trickle, whole=rest)
    with serve(tmp_path, upstream, timeouts=f"stream_idle_ms: {IDLE_MS}", total=TOTAL_MS) as gw:
        resp = post(gw, "resumed")
        closed_soon(trickle, 1)
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]" and all("error" not in json.loads(d) for d in data[:-1]), data[-3:]
    assert "".join(texts(data[:-1])) == RECORDED_STREAM_TEXT  # one uninterrupted stream
    assert [r.path.split("/")[1] for r in upstream.received] == ["flood", "whole"]
    assert upstream.received[1].json()["max_tokens"] == 16 - 3


def test_pings_between_events_that_carry_something_never_meet_it(tmp_path: Path, upstream: Upstream) -> None:
    """A second of pings before each of four events, more than twice the idle time in all: the stream is whole."""

    async def thinking(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for event in CHUNKS[:4]:
            for _ in range(10):
                await resp.write(TRICKLES["comments"])
                await asyncio.sleep(0.1)
            await resp.write(event + b"\n\n")
        for event in [*CHUNKS[4:], DONE_EVENT]:
            await resp.write(event + b"\n\n")
        await resp.write_eof()
        return resp

    route(upstream, flood=thinking)
    with serve(tmp_path, upstream, total=TOTAL_MS, flood_timeouts=OWN) as gw:
        resp = post(gw, "flood/davinci-002")
    assert "".join(texts(sse_data(resp.text)[:-1])) == RECORDED_STREAM_TEXT
