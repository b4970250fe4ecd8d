"""Streams end to end: relayed as they arrive, usage only on request, errors before and after the first byte,
and a client that hangs up takes the upstream request down with it."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from tests.helpers.clients import async_openai_client, sse_data
from tests.helpers.errors import ALL_ROUTES, assert_error
from tests.helpers.recordings import fixture_bytes, fixture_json, sse_events
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Received, Upstream, reply, reply_sse
from tests.helpers.waiting import wait_for

from .conftest import FULL_KEY

DAVINCI = "openai/completion_davinci002.json"
DAVINCI_STREAM = "openai/completion_stream_davinci002.sse.txt"
RECORDED = sse_events(fixture_bytes(DAVINCI_STREAM))  # 16 completion chunks, then `data: [DONE]`
CONTENT_EVENTS = RECORDED[:-1]
RECORDED_TEXT = "".join(json.loads(e[len(b"data: ") :])["choices"][0]["text"] for e in CONTENT_EVENTS)
DAVINCI_REQ = {"model": "openai/davinci-002", "prompt": "Tell me a joke", "stream": True}


def usage_event() -> bytes:
    """The chunk OpenAI sends last when asked for usage: empty choices plus usage.

    Synthesized (the recorded stream had no stream_options): the recorded chunk's envelope with
    `choices: []` and the usage block of the recorded non-streaming davinci completion.
    """
    chunk = json.loads(CONTENT_EVENTS[0][len(b"data: ") :])
    chunk["choices"] = []
    chunk["usage"] = fixture_json(DAVINCI)["usage"]
    return b"data: " + json.dumps(chunk).encode()


WITH_USAGE = [*CONTENT_EVENTS, usage_event(), RECORDED[-1]]


def _chunks(resp: httpx.Response) -> list[dict[str, Any]]:
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    assert data.count("[DONE]") == 1
    return [json.loads(d) for d in data[:-1]]


# -- relaying --------------------------------------------------------------------------------------


def gated_stream(gate: threading.Event, state: dict[str, bool]) -> Any:
    """Send the first recorded event, wait until the test says the client has it, then send the rest.

    If the gateway buffered anything, the client would never see the first event before the upstream
    sent the second: `released_by_client` would be False (after a 5 s bound) and the test fails.
    """

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(WITH_USAGE[0] + b"\n\n")
        state["released_by_client"] = await wait_for(gate, 5)
        for event in WITH_USAGE[1:]:
            await resp.write(event + b"\n\n")
        state["rest_sent"] = True
        await resp.write_eof()
        return resp

    return handler


def test_chunks_are_relayed_as_they_arrive_raw(api: httpx.Client, upstream: Upstream) -> None:
    gate, state = threading.Event(), {"released_by_client": False, "rest_sent": False}
    upstream.handler = gated_stream(gate, state)
    buffer = ""
    with api.stream("POST", "/v1/completions", json=DAVINCI_REQ) as resp:
        assert resp.status_code == 200
        for text in resp.iter_text():
            buffer += text
            if not gate.is_set() and "\n\n" in buffer:
                first = json.loads(sse_data(buffer.split("\n\n")[0] + "\n\n")[0])
                assert first["choices"][0]["text"] == "-common"
                assert not state["rest_sent"]
                gate.set()
    assert state["released_by_client"] is True
    assert sse_data(buffer)[-1] == "[DONE]"
    assert len(sse_data(buffer)) == 17


def test_chunks_are_relayed_as_they_arrive_sdk(oai: openai.OpenAI, upstream: Upstream) -> None:
    gate, state = threading.Event(), {"released_by_client": False, "rest_sent": False}
    upstream.handler = gated_stream(gate, state)
    texts: list[str] = []
    with oai.completions.create(model="openai/davinci-002", prompt="Tell me a joke", stream=True) as stream:
        for chunk in stream:
            if not texts:
                assert not state["rest_sent"]
                gate.set()
            texts.append(chunk.choices[0].text)
    assert state["released_by_client"] is True
    assert "".join(texts) == RECORDED_TEXT


# -- usage -----------------------------------------------------------------------------------------


def test_usage_chunk_only_when_requested(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply_sse(WITH_USAGE)
    chunks = _chunks(api.post("/v1/completions", json=DAVINCI_REQ))
    assert len(chunks) == 16
    for chunk in chunks:
        assert "usage" not in chunk
        assert len(chunk["choices"]) == 1
    # ...although the gateway asked the upstream for it.
    assert upstream.only().json()["stream_options"] == {"include_usage": True}


def test_usage_chunk_when_requested(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply_sse(WITH_USAGE)
    resp = api.post("/v1/completions", json={**DAVINCI_REQ, "stream_options": {"include_usage": True}})
    chunks = _chunks(resp)
    assert len(chunks) == 17
    *content, last = chunks
    assert all("usage" not in c for c in content)
    assert "".join(c["choices"][0]["text"] for c in content) == RECORDED_TEXT
    # One stream, one creation time: the usage chunk carries the upstream's `created` like the rest.
    assert {c["created"] for c in chunks} == {content[0]["created"]}
    assert last == {
        "object": "text_completion",
        "id": content[0]["id"],
        "created": last["created"],
        "model": "openai/davinci-002",
        "choices": [],
        "usage": {"prompt_tokens": 8, "completion_tokens": 16, "total_tokens": 24},
    }
    assert upstream.only().json()["stream_options"] == {"include_usage": True}


def test_usage_chunk_of_an_upstream_that_ended_the_stream_itself_with_the_gateways_stops(
    api: httpx.Client, upstream: Upstream
) -> None:
    # Five stops, none in the text: the gateway scans for the fifth, the upstream ends the answer, and its
    # usage chunk follows. The gateway reads on to it rather than estimating the usage.
    upstream.handler = reply_sse(WITH_USAGE)
    stops = ["Q:", "A:", "###", "END", "zzz"]
    resp = api.post("/v1/completions", json={**DAVINCI_REQ, "stop": stops, "stream_options": {"include_usage": True}})
    *content, last = _chunks(resp)
    assert "".join(c["choices"][0]["text"] for c in content) == RECORDED_TEXT
    assert last["choices"] == [] and last["usage"] == {"prompt_tokens": 8, "completion_tokens": 16, "total_tokens": 24}
    assert upstream.only().json()["stop"] == stops[:4]


async def test_usage_chunk_through_the_async_sdk(gateway: GatewayThread, upstream: Upstream) -> None:
    upstream.handler = reply_sse(WITH_USAGE)
    async with async_openai_client(gateway.url + "/v1", FULL_KEY) as client:
        stream = await client.completions.create(
            model="davinci", prompt="Tell me a joke", stream=True, stream_options={"include_usage": True}
        )
        chunks = [c async for c in stream]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == 24
    assert "".join(c.choices[0].text for c in chunks[:-1]) == RECORDED_TEXT


@pytest.mark.parametrize("route", ALL_ROUTES)
@pytest.mark.parametrize("include_usage", [False, True])
def test_fake_stream_matches_its_non_stream_answer(api: httpx.Client, route: str, include_usage: bool) -> None:
    body: dict[str, Any] = {"model": "demo/text", "prompt": ["alpha", "beta gamma"], "n": 2, "seed": 11}
    whole = api.post(route, json=body).json()
    stream_body = {**body, "stream": True}
    if include_usage:
        stream_body["stream_options"] = {"include_usage": True}
    chunks = _chunks(api.post(route, json=stream_body))
    texts: dict[int, str] = {}
    finish: dict[int, str | None] = {}
    for chunk in chunks:
        assert chunk["id"] == chunks[0]["id"]
        assert chunk["model"] == "demo/text"
        for choice in chunk["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
            finish[choice["index"]] = choice["finish_reason"]
    assert texts == {c["index"]: c["text"] for c in whole["choices"]}
    assert finish == {c["index"]: c["finish_reason"] for c in whole["choices"]}
    if include_usage:
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["usage"] == whole["usage"]
    elif route == "/inference/v1/completions":  # Fireworks' stream: the usage on its very last chunk, unasked
        assert chunks[-1]["choices"] and chunks[-1]["usage"] == whole["usage"]
        assert all("usage" not in c and c["choices"] for c in chunks[:-1])
    else:
        assert all("usage" not in c and c["choices"] for c in chunks)


# -- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("route", ALL_ROUTES)
def test_upstream_error_before_first_byte_is_a_normal_error(api: httpx.Client, upstream: Upstream, route: str) -> None:
    upstream.handler = reply(fixture_bytes("openai/error_400_model_not_found.json"), status=400)
    resp = api.post(route, json={**DAVINCI_REQ, "model": "openai/gpt-5.2-proo"})
    assert_error(
        resp,
        route,
        status=400,
        type="invalid_request_error",
        param="model",
        code="model_not_found",
        message="openai error (400): The requested model 'gpt-5.2-proo' does not exist.",
        field_error=False,
    )


def test_upstream_429_before_first_byte_keeps_retry_after(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(b'{"error": "rate limited"}', status=429, headers={"retry-after": "4"})
    resp = api.post("/v1/completions", json=DAVINCI_REQ)
    assert resp.headers["retry-after"] == "4"
    assert_error(
        resp,
        "/v1/completions",
        status=429,
        type="rate_limit_error",
        message="openai error (429): rate limited",
        code="upstream_http_429",
    )


def dropping_stream(after: int) -> Any:
    """Send `after` recorded events, then drop the TCP connection without ending the chunked body."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for event in CONTENT_EVENTS[:after]:
            await resp.write(event + b"\n\n")
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()
        return resp

    return handler


DROPPED = {
    "error": {
        "message": "Upstream 'openai/davinci-002' sent a truncated response",
        "type": "upstream_error",
        "param": None,
        "code": "upstream_truncated_response",
    }
}


@pytest.mark.parametrize("route", ALL_ROUTES)
def test_upstream_dropped_mid_stream_gives_error_event_then_done(
    api: httpx.Client, upstream: Upstream, route: str
) -> None:
    upstream.handler = dropping_stream(after=3)
    chunks = _chunks(api.post(route, json={**DAVINCI_REQ, "stream_options": {"include_usage": True}}))
    assert [c["choices"][0]["text"] for c in chunks[:3]] == ["-common", ".\n\n", "I"]
    # Every dialect gets OpenAI's error event mid-stream, and no usage chunk after a failure.
    assert chunks[3:] == [DROPPED]


def test_upstream_dropped_mid_stream_through_the_sdk(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.handler = dropping_stream(after=2)
    texts: list[str] = []
    with pytest.raises(openai.APIError) as info:
        with oai.completions.create(model="openai/davinci-002", prompt="x", stream=True) as stream:
            for chunk in stream:
                texts.append(chunk.choices[0].text)
    assert texts == ["-common", ".\n\n"]
    assert info.value.message == "Upstream 'openai/davinci-002' sent a truncated response"
    assert info.value.body == DROPPED["error"]


def test_invalid_event_mid_stream(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply_sse([CONTENT_EVENTS[0], b"data: {not json", CONTENT_EVENTS[1], RECORDED[-1]])
    chunks = _chunks(api.post("/v1/completions", json=DAVINCI_REQ))
    assert chunks[0]["choices"][0]["text"] == "-common"
    assert chunks[1:] == [
        {
            "error": {
                "message": "Upstream 'openai/davinci-002' sent an invalid stream event",
                "type": "upstream_error",
                "param": None,
                "code": "invalid_upstream_response",
            }
        }
    ]


def test_error_event_from_upstream_mid_stream(api: httpx.Client, upstream: Upstream) -> None:
    # An OpenAI-compatible server reporting a failure after the first byte, in the recorded error
    # envelope's shape (openai/error_400_model_not_found.json) with a server-side message.
    failure = fixture_json("openai/error_400_model_not_found.json")
    failure["error"].update(message="Engine loop has died", type="server_error", code=None, param=None)
    upstream.handler = reply_sse([CONTENT_EVENTS[0], b"data: " + json.dumps(failure).encode(), RECORDED[-1]])
    chunks = _chunks(api.post("/v1/completions", json=DAVINCI_REQ))
    assert chunks[0]["choices"][0]["text"] == "-common"
    assert chunks[1:] == [
        {
            "error": {
                # parse_event does not know the provider's name, so the event says "upstream".
                "message": "upstream error (500): Engine loop has died",
                "type": "upstream_error",
                "param": None,
                "code": "server_error",
            }
        }
    ]


# -- client disconnect -----------------------------------------------------------------------------


def test_client_disconnect_cancels_the_upstream_request(gateway: GatewayThread, upstream: Upstream) -> None:
    cancelled = threading.Event()

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(CONTENT_EVENTS[0] + b"\n\n")
        try:
            await asyncio.sleep(30)  # a long generation
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return resp

    upstream.handler = handler
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=10) as client:
        with client.stream(
            "POST", "/v1/completions", json=DAVINCI_REQ, headers={"authorization": f"Bearer {FULL_KEY}"}
        ) as resp:
            assert resp.status_code == 200
            raw = resp.iter_raw()  # keep a reference: a collected iterator would close the response
            assert next(raw).startswith(b"data: ")
            # While the client is connected, the upstream request stays open.
            assert not cancelled.wait(0.2)
        # Leaving the block without reading to the end closes the client's connection.
    assert cancelled.wait(5), "the upstream request was still running 5 s after the client hung up"


# -- framing robustness ----------------------------------------------------------------------------


def sliced_stream(raw: bytes, size: int) -> Any:
    """Replay a recorded SSE body in `size`-byte writes, so events arrive split at arbitrary points."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for start in range(0, len(raw), size):
            await resp.write(raw[start : start + size])
            await asyncio.sleep(0.002)
        await resp.write_eof()
        return resp

    return handler


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(fixture_bytes(DAVINCI_STREAM), id="recorded-lf"),
        # Gemini frames its events with CRLF (fixtures INDEX.md); the same recording in that framing.
        pytest.param(fixture_bytes(DAVINCI_STREAM).replace(b"\n", b"\r\n"), id="crlf"),
        # An upstream that ends without [DONE] and without the blank line after its last event.
        pytest.param(b"\n\n".join(CONTENT_EVENTS), id="no-done-no-final-blank-line"),
    ],
)
def test_stream_split_at_arbitrary_points(api: httpx.Client, upstream: Upstream, raw: bytes) -> None:
    upstream.handler = sliced_stream(raw, size=37)
    chunks = _chunks(api.post("/v1/completions", json=DAVINCI_REQ))
    assert [c["choices"][0]["text"] for c in chunks] == [
        json.loads(e[len(b"data: ") :])["choices"][0]["text"] for e in CONTENT_EVENTS
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_upstream_stalling_mid_stream_times_out_with_an_error_event(api: httpx.Client, upstream: Upstream) -> None:
    cancelled = threading.Event()

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(CONTENT_EVENTS[0] + b"\n\n")
        try:
            await asyncio.sleep(30)  # stalls after the first event
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return resp

    upstream.handler = handler
    started = time.monotonic()
    # openai-slow allows 400 ms in total and between reads.
    chunks = _chunks(api.post("/v1/completions", json={**DAVINCI_REQ, "model": "openai-slow/davinci-002"}))
    assert time.monotonic() - started < 3
    assert chunks[0]["choices"][0]["text"] == "-common"
    assert chunks[1:] == [
        {
            "error": {
                "message": "Upstream 'openai-slow/davinci-002' timed out (timeouts.total_ms or inference_timeout)",
                "type": "timeout_error",
                "param": None,
                "code": "upstream_total_timeout",
            }
        }
    ]
    assert cancelled.wait(5)


def test_dropped_params_header_on_an_upstream_stream(api: httpx.Client, upstream: Upstream) -> None:
    # No Together stream was ever recorded; the recorded OpenAI stream stands in (this test is about the
    # request the gateway sends and the headers it answers with, not Together's chunk format).
    upstream.handler = reply_sse(RECORDED)
    resp = api.post(
        "/v1/completions",
        json={"model": "together-drop/m", "prompt": "Tell me a joke", "stream": True, "user": "u-1", "top_k": 3},
    )
    assert resp.headers["x-gateway-dropped-params"] == "user"
    assert resp.headers["x-gateway-provider"] == "together-drop"
    assert len(_chunks(resp)) == 16
    # Together documents no stream_options: the gateway does not send it there.
    assert upstream.only().json() == {"model": "m", "prompt": "Tell me a joke", "top_k": 3, "stream": True}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream-before-first-event"])
def test_client_disconnect_before_the_answer_cancels_the_upstream_request(
    gateway: GatewayThread, upstream: Upstream, stream: bool
) -> None:
    # The upstream has not answered anything yet (a slow generation, or a stream before its first
    # event): a client that gives up must still stop the upstream call, not leave it to total_ms.
    started = threading.Event()
    cancelled = threading.Event()

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return web.Response(status=500)

    upstream.handler = handler
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=0.5) as client:
        with pytest.raises(httpx.ReadTimeout):
            client.post(
                "/v1/completions",
                json={**DAVINCI_REQ, "stream": stream},
                headers={"authorization": f"Bearer {FULL_KEY}"},
            )
    assert started.is_set()
    assert cancelled.wait(5), "the upstream request was still running 5 s after the client hung up"
