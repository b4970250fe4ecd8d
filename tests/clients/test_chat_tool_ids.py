"""The ids the gateway makes for tool calls an upstream sent without one, with the official `openai` SDK over
real sockets: unique across the choices of one answer (`n` fanned out into one upstream call per choice, or
asked of the server), streamed or not, and across answers; a cached answer replays its own.

The upstream is a loopback server speaking OpenAI's chat wire from the recordings (tests/fixtures/SOURCES.md:
OpenAI's tool call answer and its stream of two parallel calls), with every call's id taken out (left out of a
message's calls; null or empty on a stream's first piece of each), as an OpenAI-compatible server that sends
none answers. `fan` is a llama-server (kind llamacpp, whose chat route has no `n`: the gateway fans it out),
`hosted` a vLLM server, which takes `n` and answers its choices in one call.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from aiohttp import web

from tests.helpers.clients import openai_client
from tests.helpers.recordings import fixture_bytes, fixture_json, sse_events
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
unsupported_params: error
retries: {{attempts: 1}}
timeouts: {{connect_ms: 2000, first_byte_ms: 10000, total_ms: 20000}}
providers:
  fan: {{kind: llamacpp, base_url: {u}}}
  hosted: {{kind: vllm, base_url: {u}/v1}}
models:
  - name: cached
    targets: [{{model: fan/served}}]
    cache: {{mode: always}}
"""
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
        },
    }
]
MESSAGES: list[Any] = [{"role": "user", "content": "What's the weather like in San Francisco and Tokyo?"}]


def _without_ids(answer: dict[str, Any], n: int) -> dict[str, Any]:
    """A recorded answer or chunk with its calls' ids taken out, its choice repeated for the `n` asked."""
    choices = []
    for i in range(n):
        choice = copy.deepcopy(answer["choices"][0]) if answer["choices"] else None
        if choice is None:
            break
        choice["index"] = i
        for call in (choice.get("message") or choice.get("delta") or {}).get("tool_calls") or ():
            if "message" in choice:
                del call["id"]
            elif "id" in call:
                call["id"] = "" if call["index"] % 2 else None
        choices.append(choice)
    return answer | {"choices": choices}


async def _handler(request: web.Request, received: Received) -> web.StreamResponse:
    body = received.json()
    n = body.get("n") or 1
    if not body.get("stream"):
        return web.json_response(_without_ids(fixture_json("openai/chat_tool_calls.json"), n))
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for event in sse_events(fixture_bytes("openai/chat_stream_tool_calls_parallel.sse.txt")):
        if event.strip() != b"data: [DONE]":
            event = b"data: " + json.dumps(_without_ids(json.loads(event[len(b"data: ") :]), n)).encode()
        await resp.write(event + b"\n\n")
    await resp.write_eof()
    return resp


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        server.handler = _handler
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("chat-tool-ids"), CONFIG.format(u=upstream.url), {}) as gw:
        yield gw


@pytest.fixture(scope="module")
def client(gateway: GatewayThread) -> Iterator[openai.OpenAI]:
    sdk = openai_client(gateway.url + "/v1", "unused")
    yield sdk
    sdk.close()


@pytest.fixture
def received(upstream: Upstream) -> Iterator[list[Received]]:
    upstream.received = []
    yield upstream.received


def _buffered_ids(client: openai.OpenAI, model: str, n: int) -> list[str]:
    answer = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, n=n)
    assert [c.index for c in answer.choices] == list(range(n))
    return [call.id for c in answer.choices for call in c.message.tool_calls or ()]


def _streamed_ids(client: openai.OpenAI, model: str, n: int) -> dict[tuple[int, int], str]:
    """Each (choice, call index)'s id, from the one piece that carries it."""
    ids: dict[tuple[int, int], str] = {}
    for chunk in client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, n=n, stream=True):
        for choice in chunk.choices:
            for piece in choice.delta.tool_calls or ():
                if piece.id is not None:
                    assert (choice.index, piece.index) not in ids, "an id is sent on a call's first piece only"
                    ids[(choice.index, piece.index)] = piece.id
    return ids


@pytest.mark.parametrize("model", ["fan/served", "hosted/served"])
def test_made_ids_are_unique_across_the_choices_of_an_answer(
    client: openai.OpenAI, received: list[Received], model: str
) -> None:
    ids = _buffered_ids(client, model, 3)
    assert len(ids) == 3 and len(set(ids)) == 3, ids
    assert all(i.startswith("call_") for i in ids)
    # Fanned out: three upstream calls, each asked for one choice; else one call asked for three.
    sent = [r.json() for r in received]
    assert [s.get("n") for s in sent] == ([None] * 3 if model.startswith("fan/") else [3])
    assert all("id" not in c for r in received for c in r.json()["messages"])  # nothing of ours went upstream


@pytest.mark.parametrize("model", ["fan/served", "hosted/served"])
def test_made_ids_are_unique_across_the_choices_of_a_stream(
    client: openai.OpenAI, received: list[Received], model: str
) -> None:
    ids = _streamed_ids(client, model, 3)
    # Three choices of two parallel calls each: six calls, six ids.
    assert sorted(ids) == [(i, k) for i in range(3) for k in range(2)], ids
    assert len(set(ids.values())) == 6, ids
    assert len(received) == (3 if model.startswith("fan/") else 1)


def test_made_ids_differ_between_answers(client: openai.OpenAI) -> None:
    # A client keeps each answer's calls in its history: the next answer's must not repeat them.
    first = _buffered_ids(client, "fan/served", 2) + list(_streamed_ids(client, "fan/served", 2).values())
    second = _buffered_ids(client, "fan/served", 2) + list(_streamed_ids(client, "fan/served", 2).values())
    assert len(set(first)) == len(first) == 6 and len(set(second)) == 6
    assert not set(first) & set(second)


def test_a_cached_answer_replays_its_own_ids(client: openai.OpenAI, received: list[Received]) -> None:
    stored = _buffered_ids(client, "cached", 3)
    assert len(set(stored)) == 3 and len(received) == 3
    replayed = client.chat.completions.with_raw_response.create(model="cached", messages=MESSAGES, tools=TOOLS, n=3)
    assert replayed.headers["x-gateway-cache"] == "hit"
    assert [call.id for c in replayed.parse().choices for call in c.message.tool_calls or ()] == stored
    assert len(received) == 3
