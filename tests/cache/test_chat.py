"""The response cache on `/v1/chat/completions`, over real sockets: streamed chat answers stored and
replayed as `chat.completion.chunk` streams with their own id, buffered and streamed requests sharing one
entry, `Cache-Control` directives, identical requests in flight coalesced within a tenant, and a
Redis-backed cache shared by two gateways.

The upstream is a loopback OpenAI chat server answering from recordings (tests/fixtures/SOURCES.md): a
plain answer and a tool call buffered, Azure's text stream (its prompt-filter chunk first, a usage chunk
last, added) and OpenAI's stream of two parallel tool calls (arguments in pieces). It counts what it gets, and
can be held so that requests are in flight together.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.helpers.clients import sse_data
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream
from tests.helpers.waiting import wait_until

from .conftest import ALICE, BOB, MODEL, client, config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
        },
    }
]
USAGE: Any = {
    "id": "chatcmpl-DPTMcvrtSm0g72urr2OfecoBbwKEN",
    "object": "chat.completion.chunk",
    "created": 1774963446,
    "model": "gpt-4.1-mini-2025-04-14",
    "choices": [],
    "usage": {"prompt_tokens": 14, "completion_tokens": 9, "total_tokens": 23},
}


def _events(name: str) -> list[bytes]:
    text = (FIXTURES / name).read_bytes()
    return [e.strip() for e in text.split(b"\n\n") if e.strip()]


class ChatServer:
    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()

    async def handler(self, request: web.Request, received: Received) -> web.StreamResponse:
        while not self.gate.is_set():
            await asyncio.sleep(0.005)
        body = received.json()
        tools = bool(body.get("tools"))
        if not body.get("stream"):
            name = "openai/chat_tool_calls.json" if tools else "openai/chat_completion.json"
            return web.Response(body=(FIXTURES / name).read_bytes(), content_type="application/json")
        name = "openai/chat_stream_tool_calls_parallel.sse.txt" if tools else "azure/chat_stream_usage.sse.txt"
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        events = _events(name)
        if not tools:  # the recording has no usage chunk: OpenAI's, as `include_usage` asks for, before [DONE]
            events.insert(-1, b"data: " + json.dumps(USAGE).encode())
        for event in events:
            await resp.write(event + b"\n\n")
        await resp.write_eof()
        return resp


@pytest.fixture(scope="module")
def chat_server() -> Iterator[tuple[ChatServer, Upstream]]:
    server = ChatServer()
    with Upstream() as up:
        up.handler = server.handler
        yield server, up


@pytest.fixture
def up(chat_server: tuple[ChatServer, Upstream]) -> Iterator[Upstream]:
    server, upstream = chat_server
    upstream.reset()
    upstream.handler = server.handler
    server.gate.set()
    yield upstream
    server.gate.set()


@pytest.fixture(scope="module")
def gw(chat_server: tuple[ChatServer, Upstream], tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("chatcache"), config(chat_server[1])) as gateway:
        yield gateway


def ask(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "temperature": 0, **extra}


def post(gw: GatewayThread, payload: dict[str, Any], key: str = ALICE, **headers: str) -> httpx.Response:
    with client(gw.url, key) as c:
        return c.post("/v1/chat/completions", json=payload, headers=headers)


def stream(
    gw: GatewayThread, payload: dict[str, Any], key: str = ALICE, **headers: str
) -> tuple[httpx.Response, list[dict[str, Any]]]:
    resp = post(gw, payload | {"stream": True, "stream_options": {"include_usage": True}}, key, **headers)
    assert resp.status_code == 200, resp.text
    events = sse_data(resp.text)
    assert events[-1] == "[DONE]"
    return resp, [json.loads(e) for e in events[:-1]]


def assembled(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """What a client reassembling the deltas gets: content, tool calls (arguments joined per index), finish."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish = role = None
    for chunk in chunks:
        for ch in chunk["choices"]:
            delta = ch["delta"]
            role = role or delta.get("role")
            content.append(delta.get("content") or "")
            for t in delta.get("tool_calls") or ():
                call = calls.setdefault(t["index"], {"id": None, "name": None, "arguments": ""})
                call["id"] = t.get("id") or call["id"]
                fn = t.get("function") or {}
                call["name"] = fn.get("name") or call["name"]
                call["arguments"] += fn.get("arguments") or ""
            finish = ch["finish_reason"] or finish
    return {"role": role, "content": "".join(content), "calls": [calls[i] for i in sorted(calls)], "finish": finish}


def test_a_streamed_chat_is_stored_and_replayed_as_chunks_with_its_own_id(gw: GatewayThread, up: Upstream) -> None:
    first, sent = stream(gw, ask("stream me a text"))
    assert first.headers["x-gateway-cache"] == "miss"
    again, replayed = stream(gw, ask("stream me a text"))
    assert again.headers["x-gateway-cache"] == "hit"
    assert len(up.received) == 1
    assert all(c["object"] == "chat.completion.chunk" for c in replayed)
    ids = {c["id"] for c in replayed}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-") and replayed[0]["id"] != sent[0]["id"]
    assert replayed[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}  # the role first
    assert assembled(replayed) == assembled(sent)
    assert assembled(sent)["content"].startswith("Sure")  # the recording's text
    # The usage chunk last, as the upstream reported it, only when asked for.
    assert replayed[-1]["choices"] == [] and replayed[-1]["usage"] == sent[-1]["usage"]
    plain = post(gw, ask("stream me a text", stream=True))
    assert plain.headers["x-gateway-cache"] == "hit"
    assert all("usage" not in json.loads(e) for e in sse_data(plain.text)[:-1])


def test_streamed_tool_calls_replay_with_their_arguments_byte_for_byte(gw: GatewayThread, up: Upstream) -> None:
    _, sent = stream(gw, ask("weather, streamed", tools=TOOLS))
    _, replayed = stream(gw, ask("weather, streamed", tools=TOOLS))
    assert len(up.received) == 1
    want = assembled(sent)
    assert len(want["calls"]) == 2 and want["finish"] == "tool_calls"
    assert assembled(replayed) == want
    # The answer has no content: the role comes alone, as the upstream sent it (no empty content).
    assert replayed[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert [len(c["choices"][0]["delta"].get("tool_calls", ())) for c in replayed[1:3]] == [1, 1]
    # A buffered request gets the same answer as one `chat.completion`.
    buffered = post(gw, ask("weather, streamed", tools=TOOLS))
    assert buffered.headers["x-gateway-cache"] == "hit" and len(up.received) == 1
    answer = buffered.json()
    assert answer["object"] == "chat.completion" and answer["id"].startswith("chatcmpl-")
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    got = [
        {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in choice["message"]["tool_calls"]
    ]
    assert got == want["calls"]
    # Another tool list is another entry.
    other = [{"type": "function", "function": {**TOOLS[0]["function"], "name": "get_time"}}]
    assert post(gw, ask("weather, streamed", tools=other)).headers["x-gateway-cache"] == "miss"


def test_a_buffered_chat_answers_a_streamed_request(gw: GatewayThread, up: Upstream) -> None:
    fresh = post(gw, ask("buffered first"))
    assert fresh.headers["x-gateway-cache"] == "miss"
    resp, chunks = stream(gw, ask("buffered first"))
    assert resp.headers["x-gateway-cache"] == "hit" and len(up.received) == 1
    message = fresh.json()["choices"][0]["message"]
    assert assembled(chunks) == {"role": "assistant", "content": message["content"], "calls": [], "finish": "stop"}
    assert chunks[-1]["usage"] == fresh.json()["usage"]


def test_a_chats_key_holds_its_tools_once_not_again_in_its_token_count(gw: GatewayThread, up: Upstream) -> None:
    """What a chat sends beside its messages is counted for its limits (`unrendered`), a copy made from its
    fields: the entry's key holds the tools alone."""
    described = [{"type": "function", "function": {"name": "f", "description": "T" * 40_000, "parameters": {}}}]
    cache = gw.pipeline.cache
    assert cache is not None
    before = cache.memory.size()[1]
    assert post(gw, ask("tools once", tools=described)).headers["x-gateway-cache"] == "miss"
    wait_until(lambda: cache.memory.size()[1] > before)
    assert 40_000 < cache.memory.size()[1] - before < 50_000
    assert post(gw, ask("tools once", tools=described)).headers["x-gateway-cache"] == "hit"
    assert len(up.received) == 1


def test_cache_control_directives_on_chat(gw: GatewayThread, up: Upstream) -> None:
    missing = post(gw, ask("never asked"), **{"cache-control": "only-if-cached"})
    assert missing.status_code == 504 and missing.json()["error"]["code"] == "cache_miss"
    assert len(up.received) == 0
    assert post(gw, ask("directives"), **{"cache-control": "no-store"}).headers["x-gateway-cache"] == "bypass"
    assert post(gw, ask("directives")).headers["x-gateway-cache"] == "miss"
    assert post(gw, ask("directives"), **{"cache-control": "max-age=60"}).headers["x-gateway-cache"] == "hit"
    refreshed = post(gw, ask("directives"), **{"cache-control": "no-cache"})
    assert refreshed.headers["x-gateway-cache"] == "bypass"
    assert len(up.received) == 3
    # A streamed request with directives is stored too (`no-cache` asks the upstream and stores the answer).
    resp, _ = stream(gw, ask("directives, streamed"), **{"cache-control": "no-cache"})
    assert resp.headers["x-gateway-cache"] == "bypass"
    assert post(gw, ask("directives, streamed"), **{"cache-control": "only-if-cached"}).status_code == 200
    assert len(up.received) == 4


def test_identical_chats_in_flight_are_coalesced_within_a_tenant(
    gw: GatewayThread, up: Upstream, chat_server: tuple[ChatServer, Upstream]
) -> None:
    server = chat_server[0]
    server.gate.clear()
    payload = ask("in flight together")
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(post, gw, payload, ALICE)
        wait_until(lambda: len(up.received) == 1, timeout=10)
        second = pool.submit(post, gw, payload | {"stream": True}, ALICE)
        wait_until(lambda: _coalescing(gw), timeout=10)
        other_tenant = pool.submit(post, gw, payload, BOB)
        wait_until(lambda: len(up.received) == 2, timeout=10)  # Bob's asks for itself
        server.gate.set()
        a, b, c = (f.result(timeout=20) for f in (first, second, other_tenant))
    assert a.headers["x-gateway-cache"] == "miss" and c.headers["x-gateway-cache"] == "miss"
    assert b.headers["x-gateway-cache"] == "coalesced"
    assert len(up.received) == 2
    chunks = [json.loads(e) for e in sse_data(b.text)[:-1]]
    assert assembled(chunks)["content"] == a.json()["choices"][0]["message"]["content"]


def test_a_streamed_chat_leader_answers_a_buffered_one_waiting(
    gw: GatewayThread, up: Upstream, chat_server: tuple[ChatServer, Upstream]
) -> None:
    server = chat_server[0]
    server.gate.clear()
    payload = ask("stream leads")
    with ThreadPoolExecutor(2) as pool:
        lead = pool.submit(post, gw, payload | {"stream": True}, ALICE)
        wait_until(lambda: len(up.received) == 1, timeout=10)
        follow = pool.submit(post, gw, payload, ALICE)
        # The follower is inside the gateway before the leader's answer comes.
        wait_until(lambda: _coalescing(gw), timeout=10)
        server.gate.set()
        streamed, buffered = lead.result(timeout=20), follow.result(timeout=20)
    assert buffered.headers["x-gateway-cache"] == "coalesced" and len(up.received) == 1
    chunks = [json.loads(e) for e in sse_data(streamed.text)[:-1]]
    assert buffered.json()["choices"][0]["message"]["content"] == assembled(chunks)["content"]


def _coalescing(gw: GatewayThread) -> bool:
    cache = gw.pipeline.cache
    assert cache is not None
    lookups = list(cache.inflight.values())
    return any(lookup.waiter is not None for lookup in lookups)


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def test_a_redis_backed_cache_serves_chat_to_another_gateway(
    chat_server: tuple[ChatServer, Upstream], redis_server: RedisServer, tmp_path: Path
) -> None:
    upstream = chat_server[1]
    upstream.reset()
    upstream.handler = chat_server[0].handler
    text = config(upstream, f"redis: {{url: '{redis_server.url}'}}").replace(
        "cache: {mode: deterministic}", "cache: {mode: deterministic, store: redis}"
    )
    with serve_config(tmp_path, text) as one, serve_config(tmp_path, text) as two:
        assert post(one, ask("redis, buffered")).headers["x-gateway-cache"] == "miss"
        hit = post(two, ask("redis, buffered"))
        assert hit.headers["x-gateway-cache"] == "hit" and hit.json()["object"] == "chat.completion"
        first, sent = stream(one, ask("redis, streamed", tools=TOOLS))
        assert first.headers["x-gateway-cache"] == "miss"
        again, replayed = stream(two, ask("redis, streamed", tools=TOOLS))
        assert again.headers["x-gateway-cache"] == "hit"
        assert assembled(replayed) == assembled(sent)
        resp, chunks = stream(two, ask("redis, buffered"))
        assert resp.headers["x-gateway-cache"] == "hit"
        assert assembled(chunks)["content"] == hit.json()["choices"][0]["message"]["content"]
    assert len(upstream.received) == 2
    assert redis_server.client().dbsize() >= 2


def test_fireworks_chat_route_has_the_usage_on_the_finish_chunk_stored_or_not(gw: GatewayThread, up: Upstream) -> None:
    # Fireworks' route sends a stream's usage on its very last chunk unasked (seed 001), the finish chunk.
    payload = ask("fireworks route: usage on the last chunk") | {"stream": True}
    with client(gw.url) as c:
        answers = [c.post("/inference/v1/chat/completions", json=payload) for _ in range(2)]
    assert [a.headers["x-gateway-cache"] for a in answers] == ["miss", "hit"]
    assert len(up.received) == 1
    for answer in answers:
        chunks = [json.loads(e) for e in sse_data(answer.text)[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        assert chunks[-1]["usage"] == USAGE["usage"]
        assert all(ch.get("usage") is None for ch in chunks[:-1])
