"""Chat emulation through the gateway over real sockets: `n` fanned out where a chat route lacks it, stop
sequences beyond a provider's count cut by the gateway, and `response_format: json_schema` sent as an
engine's guided decoding (TGI's grammar) or refused naming the field and the provider.

The upstream is a loopback server: Anthropic's Messages answers from the recordings (tests/fixtures/
anthropic, SOURCES.md), and OpenAI-shaped chat answers and streams whose text each test chooses.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.helpers.clients import sse_data
from tests.helpers.recordings import fixture_bytes, fixture_json, sse_events
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
unsupported_params: error
retries: {{attempts: 1}}
timeouts: {{connect_ms: 2000, first_byte_ms: 10000, total_ms: 20000}}
providers:
  claude: {{kind: anthropic, base_url: {u}/claude, api_key: sk-ant, default_max_tokens: 64}}
  oa: {{kind: openai, base_url: {u}/oa/v1, api_key: sk-oa}}
  tgi: {{kind: tgi, base_url: {u}/tgi}}
  ds: {{kind: deepseek, base_url: {u}/ds, api_key: sk-ds}}
"""
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
STOPS = ["s1", "s2", "s3", "s4", "END"]  # OpenAI takes four: the fifth is the gateway's


def _chat(content: str, finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-up",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "gpt-4o-mini",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish,
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16},
    }


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-up",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode()


# The OpenAI-shaped answer the `oa` and `tgi` upstreams give: a text that holds the gateway's stop.
TEXT = "Paris is the capital. END of answer"
PIECES = ["Paris is", " the capital. E", "ND of", " answer"]


async def _handler(request: web.Request, received: Received) -> web.StreamResponse:
    body = received.json()
    if received.path == "/claude/v1/messages":
        if not body.get("stream"):
            return web.Response(body=fixture_bytes("anthropic/messages_end_turn.json"), content_type="application/json")
        events = sse_events(fixture_bytes("anthropic/messages_stream.sse.txt"))
    elif not body.get("stream"):
        return web.json_response(_chat(TEXT))
    else:
        events = [_chunk({"role": "assistant", "content": ""})]
        events += [_chunk({"content": p}) for p in PIECES]
        usage = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1700000000, "model": "gpt-4o-mini"}
        usage |= {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16}}
        events += [_chunk({}, "stop"), b"data: " + json.dumps(usage).encode(), b"data: [DONE]"]
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for event in events:
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
    with serve_config(tmp_path_factory.mktemp("chat-emulation"), CONFIG.format(u=upstream.url), {}) as gw:
        yield gw


@pytest.fixture
def api(gateway: GatewayThread, upstream: Upstream) -> Iterator[httpx.Client]:
    upstream.received = []
    gateway.pipeline.health.reset()
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as http:
        yield http


def _chunks(resp: httpx.Response) -> list[dict[str, Any]]:
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]", data
    return [json.loads(d) for d in data[:-1]]


def test_n_is_fanned_out_for_anthropic(api: httpx.Client, upstream: Upstream) -> None:
    recorded = fixture_json("anthropic/messages_end_turn.json")
    resp = api.post("/v1/chat/completions", json={"model": "claude/claude-3-opus", "messages": MESSAGES, "n": 3})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    text = recorded["content"][0]["text"]
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in body["choices"]] == [
        (i, text, "stop") for i in range(3)
    ]
    usage = recorded["usage"]
    assert (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"]) == (
        3 * usage["input_tokens"],
        3 * usage["output_tokens"],
    )
    assert body["usage"]["total_tokens"] == 3 * (usage["input_tokens"] + usage["output_tokens"])
    # Three plain Messages calls: `n` never reaches Anthropic.
    sent = [r.json() for r in upstream.received]
    assert (
        sent
        == [
            {
                "model": "claude-3-opus",
                "messages": [{"role": "user", "content": [{"type": "text", "text": MESSAGES[0]["content"]}]}],
                "max_tokens": 64,
            }
        ]
        * 3
    )


def test_n_is_fanned_out_for_anthropic_streams(api: httpx.Client, upstream: Upstream) -> None:
    body = {
        "model": "claude/claude-sonnet",
        "messages": MESSAGES,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    resp = api.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    chunks = _chunks(resp)
    per: dict[int, list[dict[str, Any]]] = {}
    for c in chunks:
        assert c["object"] == "chat.completion.chunk" and c["model"] == "claude/claude-sonnet"
        for ch in c["choices"]:
            per.setdefault(ch["index"], []).append(ch)
    assert sorted(per) == [0, 1]
    for choices in per.values():
        assert choices[0]["delta"].get("role") == "assistant"
        assert "".join(ch["delta"].get("content") or "" for ch in choices) == "2"
        assert [ch["finish_reason"] for ch in choices][-1] == "stop"
    assert len({c["id"] for c in chunks}) == 1
    # One usage chunk, last, the two calls' usage summed (the recording: 20 in, 5 out each).
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 40
    assert chunks[-1]["usage"]["completion_tokens"] == 10
    assert [c for c in chunks if c.get("usage")] == [chunks[-1]]
    assert len(upstream.received) == 2 and all("n" not in r.json() for r in upstream.received)


def test_stops_beyond_the_providers_count_are_cut_by_the_gateway(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/v1/chat/completions", json={"model": "oa/gpt-4o-mini", "messages": MESSAGES, "stop": STOPS})
    assert resp.status_code == 200, resp.text
    (choice,) = resp.json()["choices"]
    assert choice["message"]["content"] == TEXT[: TEXT.index("END")]
    assert choice["finish_reason"] == "stop"
    # OpenAI is sent the four it takes.
    assert upstream.only().json()["stop"] == STOPS[:4]


def test_stops_beyond_the_providers_count_are_cut_in_streams(api: httpx.Client, upstream: Upstream) -> None:
    body = {"model": "oa/gpt-4o-mini", "messages": MESSAGES, "stop": STOPS, "stream": True}
    resp = api.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    chunks = _chunks(resp)
    content = [ch for c in chunks for ch in c["choices"]]
    assert content[0]["delta"]["role"] == "assistant"
    assert "".join(ch["delta"].get("content") or "" for ch in content) == TEXT[: TEXT.index("END")]
    assert [ch["finish_reason"] for ch in content] == [None] * (len(content) - 1) + ["stop"]
    # Nothing after the stop reached the client, and no usage chunk it did not ask for.
    assert all(c["choices"] for c in chunks)
    assert upstream.only().json()["stop"] == STOPS[:4]


def test_a_stream_the_upstream_ended_itself_keeps_its_usage_with_the_gateways_stops(
    api: httpx.Client, upstream: Upstream
) -> None:
    # No stop in the text: the upstream ends the answer, and its usage chunk follows. The gateway reads on to
    # it rather than estimating; it stops reading early only when a stop of its own ended the answer.
    body = {"model": "oa/gpt-4o-mini", "messages": MESSAGES, "stop": [*STOPS[:4], "zzz"], "stream": True}
    resp = api.post("/v1/chat/completions", json=body | {"stream_options": {"include_usage": True}})
    assert resp.status_code == 200, resp.text
    chunks = _chunks(resp)
    assert "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"]) == TEXT
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16}


def test_json_schema_is_sent_as_tgis_grammar(api: httpx.Client, upstream: Upstream) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    resp = api.post("/v1/chat/completions", json={"model": "tgi/tgi", "messages": MESSAGES, "response_format": fmt})
    assert resp.status_code == 200, resp.text
    sent = upstream.only()
    assert sent.path == "/tgi/v1/chat/completions"
    assert sent.json()["response_format"] == {"type": "json", "value": schema}
    # The guided fields take the same road.
    upstream.received = []
    resp = api.post("/v1/chat/completions", json={"model": "tgi/tgi", "messages": MESSAGES, "guided_regex": "[A-Z]+"})
    assert resp.status_code == 200, resp.text
    assert upstream.only().json()["response_format"] == {"type": "regex", "value": "[A-Z]+"}


@pytest.mark.parametrize(
    ("model", "fmt"),
    [
        ("ds/deepseek-chat", {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}),
        ("tgi/tgi", {"type": "json_object"}),
        ("claude/claude-sonnet", {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}),
    ],
)
def test_a_format_without_native_or_guided_decoding_is_refused(
    api: httpx.Client, upstream: Upstream, model: str, fmt: dict[str, Any]
) -> None:
    resp = api.post("/v1/chat/completions", json={"model": model, "messages": MESSAGES, "response_format": fmt})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["param"], error["code"]) == ("response_format", "unsupported_parameter")
    assert f"'{model.split('/')[0]}'" in error["message"]
    assert upstream.received == []


def test_deepseek_json_object_is_native(api: httpx.Client, upstream: Upstream) -> None:
    body = {"model": "ds/deepseek-chat", "messages": MESSAGES, "response_format": {"type": "json_object"}}
    assert api.post("/v1/chat/completions", json=body).status_code == 200
    assert upstream.only().json()["response_format"] == {"type": "json_object"}
