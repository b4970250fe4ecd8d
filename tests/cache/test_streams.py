"""Streams: stored only when they end normally, replayed with the upstream's chunk boundaries, and
interchangeable with buffered answers."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.clients.conftest import VLLMLike
from tests.helpers.clients import sse_data
from tests.helpers.servers import serve_config
from tests.helpers.upstreams import Received, Upstream
from tests.helpers.waiting import wait_until

from .conftest import MODEL, client, config


def body(prompt: Any, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 1, **extra}


def streamed(client: httpx.Client, payload: dict[str, Any], **headers: str) -> tuple[httpx.Response, list[str]]:
    payload = payload | {"stream": True, "stream_options": {"include_usage": True}}
    resp = client.post("/v1/completions", json=payload, headers=headers)
    assert resp.status_code == 200, resp.text
    return resp, sse_data(resp.text)


def choices_of(events: list[str]) -> list[list[dict[str, Any]]]:
    return [json.loads(e)["choices"] for e in events if e != "[DONE]"]


def per_choice(events: list[str]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for choices in choices_of(events):
        for c in choices:
            out.setdefault(c["index"], []).append(c)
    return out


def test_a_streamed_hit_replays_the_upstream_chunks_then_usage_then_done(
    alice: httpx.Client, upstream: Upstream
) -> None:
    first, sent = streamed(alice, body(["stream: the cat", "stream: a mat"]))
    assert first.headers["x-gateway-cache"] == "miss"
    again, replayed = streamed(alice, body(["stream: the cat", "stream: a mat"]))
    assert again.headers["x-gateway-cache"] == "hit"
    assert len(upstream.received) == 1
    assert replayed[-1] == "[DONE]"
    assert len(replayed) == len(sent) > 4  # one event per upstream chunk, not one aggregated chunk
    # Each choice's chunks, as the upstream cut them; a batch is stored per prompt, so its prompts' chunks
    # come one prompt after the other rather than interleaved as the upstream sent them.
    assert per_choice(replayed) == per_choice(sent)
    content = [cs for cs in choices_of(sent) if cs]
    assert [cs for cs in choices_of(replayed) if cs] == sorted(content, key=lambda cs: cs[0]["index"])
    usage = [json.loads(e)["usage"] for e in replayed[:-1] if json.loads(e).get("usage")]
    assert usage == [json.loads(sent[-2])["usage"]]
    without = alice.post("/v1/completions", json=body(["stream: the cat", "stream: a mat"]) | {"stream": True})
    assert all("usage" not in json.loads(e) for e in sse_data(without.text)[:-1])


def test_buffered_and_streamed_requests_share_entries(alice: httpx.Client, upstream: Upstream) -> None:
    # Streamed first: a buffered request gets the chunks merged into the same answer the upstream gives.
    streamed(alice, body("mixed: one two"))
    merged = alice.post("/v1/completions", json=body("mixed: one two"))
    assert merged.headers["x-gateway-cache"] == "hit"
    fresh = alice.post("/v1/completions", json=body("mixed: one two"), headers={"cache-control": "no-store"})
    assert len(upstream.received) == 2
    for got, want in zip(merged.json()["choices"], fresh.json()["choices"], strict=True):
        assert (got["text"], got["finish_reason"], got["logprobs"]) == (
            want["text"],
            want["finish_reason"],
            want["logprobs"],
        )
    assert merged.json()["usage"] == fresh.json()["usage"]
    # Buffered first: a streamed request gets it as a stream.
    alice.post("/v1/completions", json=body("mixed: three"))
    resp, events = streamed(alice, body("mixed: three"))
    assert resp.headers["x-gateway-cache"] == "hit" and events[-1] == "[DONE]"
    assert "".join(c["text"] for cs in choices_of(events) for c in cs) == fresh_text(alice, "mixed: three")
    assert len(upstream.received) == 4


def fresh_text(client: httpx.Client, prompt: str) -> str:
    resp = client.post("/v1/completions", json=body(prompt), headers={"cache-control": "no-store"})
    return str(resp.json()["choices"][0]["text"])


@pytest.fixture
def own(upstream: Upstream, tmp_path: Path) -> Iterator[httpx.Client]:
    """A gateway of the test's own: a failed stream cools its target down, which must not leak."""
    with serve_config(tmp_path, config(upstream)) as gw, client(gw.url) as c:
        yield c


def test_a_stream_that_failed_is_not_stored(own: httpx.Client, upstream: Upstream) -> None:
    alice = own
    like = upstream.handler

    async def broken(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        chunk = {"id": "x", "object": "text_completion", "created": 1, "model": "m"}
        chunk |= {"choices": [{"index": 0, "text": " half", "logprobs": None, "finish_reason": None}]}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write_eof()  # no finish reason, no [DONE]
        return resp

    upstream.handler = broken
    _, events = streamed(alice, body("broken: x", logprobs=None))
    assert any("error" in json.loads(e) for e in events if e != "[DONE]")
    upstream.handler = like
    resp = alice.post(
        "/v1/completions", json=body("broken: x", logprobs=None), headers={"cache-control": "only-if-cached"}
    )
    assert resp.status_code == 504 and resp.json()["error"]["code"] == "cache_miss"


def test_a_request_waiting_on_a_stream_that_breaks_asks_for_itself(own: httpx.Client, upstream: Upstream) -> None:
    calls: list[str] = []
    like = upstream.handler

    async def breaks_once(request: web.Request, received: Received) -> web.StreamResponse:
        calls.append(received.path)
        if len(calls) > 1:
            return await like(request, received)  # the stream broke once; the target answers after it
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        chunk = {"id": "x", "object": "text_completion", "created": 1, "model": "m"}
        chunk |= {"choices": [{"index": 0, "text": " half", "logprobs": None, "finish_reason": None}]}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await asyncio.sleep(0.5)  # the identical request comes to wait meanwhile
        await resp.write_eof()  # no finish reason, no [DONE]
        return resp

    upstream.handler = breaks_once
    payload = body("breaks under a waiter: x", logprobs=None)
    with own.stream("POST", "/v1/completions", json=payload | {"stream": True}) as leader:
        assert leader.status_code == 200
        wait_until(lambda: len(calls) == 1)
        started = time.monotonic()
        follower = own.post("/v1/completions", json=payload)
        waited = time.monotonic() - started
        events = sse_data(leader.read().decode())
    assert any("error" in json.loads(e) for e in events if e != "[DONE]")
    # Neither served the broken stream's part nor left waiting on it until its deadline: once the stream broke,
    # it asked the target for itself (one early end is evidence against it, not a cooldown) and got its own answer.
    assert follower.status_code == 200, follower.text
    assert follower.headers["x-gateway-cache"] == "miss" and " half" not in follower.json()["choices"][0]["text"]
    assert len(calls) == 2
    assert waited < 5


def test_a_stream_the_client_cut_is_not_stored(own: httpx.Client, upstream: Upstream) -> None:
    like = upstream.handler
    hung_up = threading.Event()

    async def slow(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in like_chunks(received):
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                hung_up.set()
                raise
        return resp

    def like_chunks(received: Received) -> list[dict[str, Any]]:
        return VLLMLike().chunks(received.json())

    upstream.handler = slow
    payload = body("cut: the cat sat", stream=True)
    with own.stream("POST", "/v1/completions", json=payload) as resp:
        assert resp.status_code == 200
        next(resp.iter_raw())  # the first chunk, then hang up
    wait_until(hung_up.is_set)
    upstream.handler = like
    resp = own.post("/v1/completions", json=body("cut: the cat sat"), headers={"cache-control": "only-if-cached"})
    assert resp.status_code == 504


def test_a_streamed_hit_on_fireworks_route_has_the_usage_on_its_last_chunk(
    alice: httpx.Client, upstream: Upstream
) -> None:
    # Fireworks' route sends a stream's usage on its very last chunk unasked (seed 001), stored or not.
    payload = body("fireworks route: the cat") | {"stream": True}
    answers = [alice.post("/inference/v1/completions", json=payload) for _ in range(2)]
    assert [a.headers["x-gateway-cache"] for a in answers] == ["miss", "hit"]
    assert len(upstream.received) == 1
    lasts = []
    for answer in answers:
        events = [json.loads(e) for e in sse_data(answer.text)[:-1]]
        assert events[-1]["choices"] and events[-1]["usage"]["total_tokens"] > 0
        assert all(e.get("usage") is None for e in events[:-1])
        lasts.append(events[-1]["usage"])
    assert lasts[0] == lasts[1]
