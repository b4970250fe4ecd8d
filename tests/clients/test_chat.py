"""`/v1/chat/completions` through the gateway, with the official `openai` SDK, over real sockets.

The upstream is a loopback server speaking OpenAI's chat wire from recordings (tests/fixtures/SOURCES.md):
a plain answer, a tool call, a stream of two parallel tool calls (arguments in pieces), and Azure's text
stream (its prompt-filter chunk first). The gateway serves them on the chat routes of every dialect, with
the same keys, routing, response cache and ledger as completions; what a chat request may not say is a
400 naming the field, and a provider kind without a chat route is a 400 naming the provider.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import openai
import pytest
from aiohttp import web
from openai.types.chat import ChatCompletionMessageFunctionToolCall

from providers.openai_compat import OpenAICompatible
from providers.registry import register, unregister
from tests.helpers.clients import openai_client
from tests.helpers.recordings import fixture_json
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.sqlite import opened
from tests.helpers.upstreams import Received, Upstream

KEY = "gk-chat-3f1a"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Get the current weather",
            "parameters": {
                "type": "object",
                "properties": {"location": {"type": "string", "description": "The city and state"}},
                "required": ["location"],
            },
        },
    }
]
MESSAGES: list[Any] = [{"role": "user", "content": "What's the weather like in San Francisco?"}]
CALL: Final = {"name": "get_current_weather", "arguments": '{"location": "Boston, MA"}'}

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
unsupported_params: error
timeouts: {{connect_ms: 2000, first_byte_ms: 10000, total_ms: 20000}}
retries: {{attempts: 1}}
ledger: {{url: "sqlite:///{db}", flush_ms: 50}}
keys:
  - {{name: chat, key: "${{CHAT_KEY}}"}}
providers:
  oa: {{kind: openai, base_url: {u}/v1, api_key: sk-upstream}}
  hosted: {{kind: vllm, base_url: {u}/v1}}
  demo: {{kind: fake}}
  claude: {{kind: anthropic, base_url: {u}, api_key: sk-ant}}
  legacy: {{kind: nochat, base_url: {u}/v1}}
  down: {{kind: vllm, base_url: "http://127.0.0.1:1/v1"}}
models:
  - name: resilient
    targets: [{{model: down/served}}]
    fallbacks: [oa/gpt-3.5-turbo]
    retries: {{attempts: 2}}
  - name: cached
    targets: [{{model: hosted/served}}]
    cache: {{mode: always}}
"""


def _sse(name: str) -> list[bytes]:
    """A recorded stream's `data:` events, as recorded."""
    text = (FIXTURES / name).read_bytes()
    return [e.strip() for e in text.split(b"\n\n") if e.strip()]


def _data(events: list[bytes]) -> list[dict[str, Any]]:
    return [json.loads(e[len(b"data: ") :]) for e in events if e != b"data: [DONE]"]


async def _handler(request: web.Request, received: Received) -> web.StreamResponse:
    if received.path == "/v1/messages":
        return await _anthropic(request, received)
    if not received.path.endswith("/chat/completions"):
        return web.json_response({"error": {"message": "not found"}}, status=404)
    body = received.json()
    if not body.get("stream"):
        name = "openai/chat_tool_calls.json" if body.get("tools") else "openai/chat_completion.json"
        answer = (FIXTURES / name).read_bytes()
        return web.Response(body=_without_ids(answer, body["model"]), content_type="application/json")
    name = "openai/chat_stream_tool_calls_parallel.sse.txt" if body.get("tools") else "azure/chat_stream_usage.sse.txt"
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for event in _sse(name):
        if event != b"data: [DONE]":
            event = b"data: " + _without_ids(event[len(b"data: ") :], body["model"])
        await resp.write(event + b"\n\n")
    await resp.write_eof()
    return resp


def _without_ids(body: bytes, model: str) -> bytes:
    """A recorded answer or chunk as it came; for the model `noids`, with its tool calls' ids taken out (left out
    of a message's calls, empty in a stream's first piece of each), as an OpenAI-compatible server that sends
    none would answer."""
    if model != "noids":
        return body
    answer = json.loads(body)
    for choice in answer["choices"]:
        for call in (choice.get("message") or choice.get("delta") or {}).get("tool_calls") or ():
            if "message" in choice:
                del call["id"]
            elif "id" in call:
                call["id"] = "" if call["index"] % 2 else None  # an id of "" or null: neither names the call
    return json.dumps(answer).encode()


async def _anthropic(request: web.Request, received: Received) -> web.StreamResponse:
    if not received.json().get("stream"):
        body = (FIXTURES / "anthropic/messages_tool_use.json").read_bytes()
        return web.Response(body=body, content_type="application/json")
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for event in _sse("anthropic/messages_stream_tool_use.sse.txt"):
        await resp.write(event + b"\n\n")
    await resp.write_eof()
    return resp


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        server.handler = _handler
        yield server


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chat-ledger") / "ledger.db"


class NoChatAdapter(OpenAICompatible):
    """A kind with a completion route only: the gateway speaks no chat route for it."""

    kind = "nochat"
    needs_api_key = False


@pytest.fixture(scope="module")
def nochat() -> Iterator[None]:
    register(NoChatAdapter)
    yield
    unregister("nochat")


@pytest.fixture(scope="module")
def gateway(
    upstream: Upstream, db: Path, tmp_path_factory: pytest.TempPathFactory, nochat: None
) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("chat"), CONFIG.format(u=upstream.url, db=db), {"CHAT_KEY": KEY}) as gw:
        yield gw


@pytest.fixture
def received(upstream: Upstream) -> Iterator[list[Received]]:
    upstream.received = []
    yield upstream.received


@pytest.fixture(scope="module")
def client(gateway: GatewayThread) -> Iterator[openai.OpenAI]:
    sdk = openai_client(gateway.url + "/v1", KEY)
    yield sdk
    sdk.close()


@pytest.fixture(scope="module")
def api(gateway: GatewayThread) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=gateway.url, trust_env=False, timeout=15, headers={"authorization": f"Bearer {KEY}"}
    ) as http:
        yield http


def test_create(client: openai.OpenAI, received: list[Received]) -> None:
    recorded = fixture_json("openai/chat_completion.json")
    answer = client.chat.completions.create(
        model="oa/gpt-3.5-turbo", messages=[{"role": "user", "content": "Tell me a joke"}], max_tokens=40, seed=3
    )
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    assert answer.model == "oa/gpt-3.5-turbo"
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == recorded["choices"][0]["message"]["content"]
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None and answer.usage.total_tokens == recorded["usage"]["total_tokens"]
    assert answer.system_fingerprint == recorded["system_fingerprint"]
    (sent,) = received
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-upstream"
    body = sent.json()
    # OpenAI's current name for the limit: its o-series models refuse `max_tokens`.
    assert body == {
        "model": "gpt-3.5-turbo",
        "messages": [{"role": "user", "content": "Tell me a joke"}],
        "max_completion_tokens": 40,
        "seed": 3,
    }


def test_tools(client: openai.OpenAI, received: list[Received]) -> None:
    recorded = fixture_json("openai/chat_tool_calls.json")["choices"][0]["message"]["tool_calls"][0]
    answer = client.chat.completions.create(
        model="oa/gpt-3.5-turbo", messages=MESSAGES, tools=TOOLS, tool_choice="auto", parallel_tool_calls=True
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id == recorded["id"]
    assert call.function.name == recorded["function"]["name"]
    assert call.function.arguments == recorded["function"]["arguments"]
    body = received[0].json()
    assert body["tools"] == TOOLS and body["tool_choice"] == "auto" and body["parallel_tool_calls"] is True


def test_stream_tool_call_deltas(client: openai.OpenAI, received: list[Received]) -> None:
    """The SDK reassembles the provider's arguments byte for byte from the relayed deltas."""
    recorded = _data(_sse("openai/chat_stream_tool_calls_parallel.sse.txt"))
    want: dict[int, dict[str, str]] = {}
    for event in recorded:
        for ch in event["choices"]:
            for tc in ch["delta"].get("tool_calls") or ():
                slot = want.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
                slot["id"] += tc.get("id") or ""
                slot["name"] += (tc.get("function") or {}).get("name") or ""
                slot["arguments"] += (tc.get("function") or {}).get("arguments") or ""
    assert len(want) == 2  # the recording holds two parallel calls

    got: dict[int, dict[str, str]] = {}
    chunks = list(client.chat.completions.create(model="oa/gpt-3.5-turbo", messages=MESSAGES, tools=TOOLS, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    for chunk in chunks:
        assert chunk.object == "chat.completion.chunk" and chunk.model == "oa/gpt-3.5-turbo"
        for sc in chunk.choices:
            for call in sc.delta.tool_calls or ():
                slot = got.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += call.id or ""
                slot["name"] += (call.function.name if call.function else None) or ""
                slot["arguments"] += (call.function.arguments if call.function else None) or ""
    assert got == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    # The gateway asked for the usage chunk (it settles limits on it) though the client did not.
    assert received[0].json()["stream_options"] == {"include_usage": True}


def test_stream_text_and_done(api: httpx.Client) -> None:
    recorded = _data(_sse("azure/chat_stream_usage.sse.txt"))
    text = "".join(ch["delta"].get("content") or "" for c in recorded for ch in c["choices"])
    body = {"model": "oa/gpt-4.1-mini", "messages": [{"role": "user", "content": "a joke"}], "stream": True}
    with api.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        events = [line for line in resp.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    # Azure's prompt-filter event carries nothing for the client: it is not relayed.
    assert all(c["choices"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == text
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_fake_provider(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model="demo/echo", messages=[{"role": "user", "content": "hi"}])
    assert plain.choices[0].message.content and plain.choices[0].finish_reason in ("stop", "length")
    chunks = list(
        client.chat.completions.create(
            model="demo/echo",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == plain.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage is not None


def test_every_route(api: httpx.Client, received: list[Received]) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    for path, model in (
        ("/v1/chat/completions", "oa/gpt-3.5-turbo"),
        ("/inference/v1/chat/completions", "oa/gpt-3.5-turbo"),
        ("/v4/beta/chat/completions", "oa/gpt-3.5-turbo"),
        ("/api/v1/compatibility/openai/v1/chat/completions", "oa/gpt-3.5-turbo"),
        ("/m/oa/gpt-3.5-turbo/v1/chat/completions", None),
    ):
        resp = api.post(path, json=body | ({"model": model} if model else {}))
        assert resp.status_code == 200, (path, resp.text)
        assert resp.json()["object"] == "chat.completion"
    assert len(received) == 5 and {r.json()["model"] for r in received} == {"gpt-3.5-turbo"}


def test_cache_hit_on_identical_chat(api: httpx.Client, received: list[Received]) -> None:
    body = {"model": "cached", "messages": [{"role": "user", "content": "cache me"}], "tools": TOOLS}
    first = api.post("/v1/chat/completions", json=body)
    second = api.post("/v1/chat/completions", json=body)
    assert first.headers["x-gateway-cache"] == "miss" and second.headers["x-gateway-cache"] == "hit"
    one, two = first.json(), second.json()
    assert two["object"] == "chat.completion" and two["id"] != one["id"]
    assert two["choices"] == one["choices"] and two["usage"] == one["usage"]
    # The key holds the messages, the tools and the response format: any change is another entry.
    for changed in (
        body | {"messages": [{"role": "user", "content": "cache me too"}]},
        {k: v for k, v in body.items() if k != "tools"},
        body | {"response_format": {"type": "json_object"}},
    ):
        assert api.post("/v1/chat/completions", json=changed).headers["x-gateway-cache"] == "miss"
    assert len(received) == 4


def test_fallback_serves_chat(api: httpx.Client, received: list[Received]) -> None:
    """The same failover loop: the alias's target refuses the connection, its fallback answers."""
    resp = api.post("/v1/chat/completions", json={"model": "resilient", "messages": MESSAGES})
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-gateway-provider"] == "oa" and resp.headers["x-gateway-attempts"] == "2"
    assert resp.json()["choices"][0]["message"]["content"]
    assert len(received) == 1


def test_ledger_row_records_the_endpoint(api: httpx.Client, db: Path) -> None:
    rid = f"chat-ledger-{time.monotonic_ns()}"
    body = {"model": "demo/echo", "messages": [{"role": "user", "content": "book me"}]}
    assert api.post("/v1/chat/completions", json=body, headers={"x-request-id": rid}).status_code == 200
    deadline = time.monotonic() + 10
    rows: list[tuple[Any, ...]] = []
    while not rows and time.monotonic() < deadline:
        with opened(db, timeout=10) as conn:
            rows = conn.execute(
                "SELECT endpoint, dialect, model, status, completion_tokens FROM requests WHERE request_id = ?", (rid,)
            ).fetchall()
        time.sleep(0.05)
    assert rows and rows[0][:4] == ("chat", "openai", "demo/echo", 200) and rows[0][4] > 0


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": "oa/m", "messages": MESSAGES, "prompt": "x"}, "prompt", "unknown_parameter"),
        ({"model": "oa/m", "messages": MESSAGES, "suffix": "x"}, "suffix", "unknown_parameter"),
        ({"model": "oa/m", "messages": MESSAGES, "echo": "yes"}, "echo", "invalid_value"),
        # Completion-only fields under the names chat's request holds them by (a leading space): unknown all the same.
        *(
            ({"model": "oa/m", "messages": MESSAGES, f" {name}": value}, f" {name}", "unknown_parameter")
            for name, value in (
                ("best_of", 2),
                ("echo", True),
                ("suffix", "x"),
                ("max_new_tokens", 3),
                ("stop_sequences", ["a"]),
                ("return_token_log_probs", True),
                ("images", ["aGk="]),
                ("context_length_exceeded_behavior", "truncate"),
            )
        ),
        ({"model": "oa/m", "messages": MESSAGES, "temprature": 1}, "temprature", "unknown_parameter"),
        ({"model": "oa/m"}, "messages", "missing_required_parameter"),
        ({"model": "oa/m", "messages": []}, "messages", "invalid_value"),
        ({"model": "oa/m", "messages": [{"role": "robot", "content": "x"}]}, "messages.role", "invalid_value"),
        (
            {"model": "oa/m", "messages": [{"role": "tool", "content": "x"}]},
            "messages.tool_call_id",
            "missing_required_parameter",
        ),
        ({"model": "oa/m", "messages": MESSAGES, "logprobs": 3}, "logprobs", "invalid_value"),
        ({"model": "oa/m", "messages": MESSAGES, "temperature": 9}, "temperature", "invalid_value"),
        ({"model": "oa/m", "messages": MESSAGES, "tool_choice": "auto"}, "tool_choice", "invalid_value"),
        (
            {"model": "oa/m", "messages": MESSAGES, "tools": [{"type": "function"}]},
            "tools.function",
            "missing_required_parameter",
        ),
        (
            {"model": "oa/m", "messages": MESSAGES, "response_format": {"type": "yaml"}},
            "response_format.type",
            "invalid_value",
        ),
        ({"model": "oa/m", "messages": MESSAGES, "top_k": 5}, "top_k", "unsupported_parameter"),
        (
            {"model": "oa/m", "messages": MESSAGES, "max_tokens": 5, "max_completion_tokens": 6},
            "max_completion_tokens",
            None,
        ),
        ({"model": "oa/m", "messages": MESSAGES, "n": 0}, "n", "invalid_value"),
        ({"model": "oa/m", "messages": MESSAGES, "top_p": 2}, "top_p", "invalid_value"),
        ({"model": "oa/m", "messages": MESSAGES, "seed": "x"}, "seed", "invalid_value"),
        ({"model": "oa/m", "messages": MESSAGES, "stop": 5}, "stop", "invalid_value"),
        ({"model": "oa/m", "messages": MESSAGES, "frequency_penalty": 3}, "frequency_penalty", "invalid_value"),
        ({"model": "oa/m", "messages": MESSAGES, "presence_penalty": -3}, "presence_penalty", "invalid_value"),
        ({"model": "oa/m", "messages": MESSAGES, "logit_bias": {"50256": 200}}, "logit_bias", None),
        ({"model": "oa/m", "messages": MESSAGES, "top_logprobs": 2}, "top_logprobs", None),
        ({"model": "oa/m", "messages": MESSAGES, "user": 5}, "user", "invalid_value"),
        ({"model": "oa/m", "messages": MESSAGES, "stream_options": {"include_usage": True}}, "stream_options", None),
        ({"model": "oa/m", "messages": MESSAGES, "stream": True, "stream_options": {"x": 1}}, "stream_options.x", None),
        ({"model": "oa/m", "messages": MESSAGES, "parallel_tool_calls": "yes"}, "parallel_tool_calls", None),
        (
            {"model": "oa/m", "messages": [{"role": "user", "content": [{"type": "input_audio", "x": 1}]}]},
            "messages.content.type",
            None,
        ),
        ({"model": "oa/m", "messages": [{"role": "user", "content": "x", "colour": 1}]}, "messages.colour", None),
        ({"model": "oa/m", "messages": [{"role": "user", "content": "x", "type": "image"}]}, "messages.type", None),
        # What the openai SDK sends back of its own message objects is taken null; an audio reply or a legacy
        # function call is not.
        ({"model": "oa/m", "messages": [{"role": "assistant", "audio": {"id": "a1"}}]}, "messages.audio", None),
        (
            {"model": "oa/m", "messages": [{"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}}]},
            "messages.function_call",
            None,
        ),
        (
            {"model": "oa/m", "messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "custom"}]}]},
            "messages.tool_calls.type",
            None,
        ),
        (
            {"model": "oa/m", "messages": [{"role": "assistant", "tool_calls": [{"id": "a", "type": "function"}]}]},
            "messages.tool_calls.function",
            None,
        ),
        ({"model": "oa/m", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", None),
        (
            {"model": "oa/m", "messages": MESSAGES, "response_format": {"type": "json_schema"}},
            "response_format.json_schema",
            None,
        ),
        # Names end where their characters do: a final newline is not one of them.
        ({"model": "oa/m", "messages": [{"role": "user", "content": "x", "name": "bob\n"}]}, "messages.name", None),
        (
            {"model": "oa/m", "messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "f\n"}}]},
            "tools.function.name",
            None,
        ),
        (
            {
                "model": "oa/m",
                "messages": MESSAGES,
                "response_format": {"type": "json_schema", "json_schema": {"name": "s\n"}},
            },
            "response_format.json_schema.name",
            None,
        ),
        # The in-process provider's bound on the work a request may make the gateway's loop do.
        ({"model": "demo/echo", "messages": MESSAGES, "max_tokens": 10**9}, "max_tokens", "invalid_value"),
    ],
)
def test_bad_requests_name_the_field(
    api: httpx.Client, received: list[Received], body: dict[str, Any], param: str, code: str | None
) -> None:
    resp = api.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    assert received == []


@pytest.mark.parametrize("model", ["oa/gpt-3.5-turbo", "claude/claude-3-5-sonnet-latest", "demo/echo"])
@pytest.mark.parametrize(
    ("messages", "at", "param"),
    [
        (
            [*MESSAGES, {"role": "assistant", "tool_calls": [{"id": "", "type": "function", "function": CALL}]}],
            "messages[1].tool_calls[0].id",
            "messages.tool_calls.id",
        ),
        (
            [
                *MESSAGES,
                {"role": "assistant", "tool_calls": [{"id": "call_1", "function": CALL}, {"id": "", "function": CALL}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "57F"},
            ],
            "messages[1].tool_calls[1].id",
            "messages.tool_calls.id",
        ),
        (
            [
                *MESSAGES,
                {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": CALL}]},
                {"role": "tool", "tool_call_id": "", "content": "57F"},
            ],
            "messages[2].tool_call_id",
            "messages.tool_call_id",
        ),
    ],
)
def test_an_empty_tool_call_id_is_a_400_naming_the_field(
    api: httpx.Client, received: list[Received], model: str, messages: list[Any], at: str, param: str
) -> None:
    # A tool message names the call it answers by its id: an empty one names no call, whichever kind serves it.
    resp = api.post("/v1/chat/completions", json={"model": model, "messages": messages, "tools": TOOLS})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error == {
        "message": f"Invalid value for '{at}': Expected `str` of length >= 1",
        "type": "invalid_request_error",
        "param": param,
        "code": "invalid_value",
    }
    assert received == []


def test_tool_calls_an_upstream_sent_without_ids_get_ids_the_conversation_can_send_back(
    client: openai.OpenAI, received: list[Received]
) -> None:
    answer = client.chat.completions.create(model="hosted/noids", messages=MESSAGES, tools=TOOLS)
    (call,) = answer.choices[0].message.tool_calls or []
    assert call.id and call.id.startswith("call_"), call
    # Streamed, each call's first piece carries one (the server sent null for one, "" for the other); the pieces
    # after it none, so the SDK's reassembly keeps it whole.
    ids: dict[int, str] = {}
    pieces: dict[int, int] = {}
    for chunk in client.chat.completions.create(model="hosted/noids", messages=MESSAGES, tools=TOOLS, stream=True):
        for sc in chunk.choices:
            for c in sc.delta.tool_calls or ():
                if c.id is not None:
                    pieces[c.index] = pieces.get(c.index, 0) + 1
                    ids[c.index] = c.id
    assert sorted(ids) == [0, 1] and pieces == {0: 1, 1: 1} and len({*ids.values(), call.id}) == 3, ids
    assert all(i.startswith("call_") for i in ids.values())
    # The conversation with the answer's call and its result goes back as it came: no 400.
    turn: Any = answer.choices[0].message.model_dump(exclude_none=True)
    result: Any = {"role": "tool", "tool_call_id": call.id, "content": "57F"}
    again = client.chat.completions.create(model="hosted/noids", messages=[*MESSAGES, turn, result], tools=TOOLS)
    assert again.choices[0].finish_reason == "tool_calls"
    assert received[-1].json()["messages"][-2]["tool_calls"][0]["id"] == call.id


def test_kind_without_chat_is_a_400_naming_the_provider(api: httpx.Client, received: list[Received]) -> None:
    resp = api.post("/v1/chat/completions", json={"model": "legacy/served", "messages": MESSAGES})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "unsupported_endpoint" and "'legacy'" in error["message"]
    assert received == []


@pytest.mark.parametrize("path", ["/v4/beta/chat/completions", "/api/v1/compatibility/openai/v1/chat/completions"])
def test_sgp_and_pais_routes_speak_fastapi(api: httpx.Client, received: list[Received], path: str) -> None:
    resp = api.post(path, json={"model": "oa/m", "messages": []})
    assert resp.status_code == 422
    assert resp.json()["detail"][0]["loc"] == ["body", "messages"]
    # A field of sgp-python's chat request the gateway does not take is refused by name, in the same shape.
    resp = api.post(path, json={"model": "oa/m", "messages": MESSAGES, "memory_strategy": {"name": "last_k"}})
    assert resp.status_code == 422
    refused = [(d["loc"], d["type"]) for d in resp.json()["detail"]]
    assert refused == [(["body", "memory_strategy"], "unknown_parameter")]
    assert received == []


def test_anthropic_tool_calls_through_the_sdk(client: openai.OpenAI, received: list[Received]) -> None:
    """Anthropic's Messages API behind the chat route: its tool_use blocks are the SDK's tool calls, and its
    streamed `input_json_delta` pieces reassemble into each call's arguments."""
    recorded = fixture_json("anthropic/messages_tool_use.json")
    answer = client.chat.completions.create(
        model="claude/claude-3-5-sonnet-20240620",
        messages=[{"role": "system", "content": "Be brief."}, *MESSAGES],
        tools=TOOLS,
        max_tokens=300,
    )
    calls = [
        c for c in answer.choices[0].message.tool_calls or () if isinstance(c, ChatCompletionMessageFunctionToolCall)
    ]
    uses = [b for b in recorded["content"] if b["type"] == "tool_use"]
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        (b["id"], b["name"], b["input"]) for b in uses
    ]
    assert answer.choices[0].finish_reason == "tool_calls"
    sent = received[0]
    assert sent.path == "/v1/messages" and sent.headers["x-api-key"] == "sk-ant"
    assert sent.json()["system"] == "Be brief." and sent.json()["max_tokens"] == 300

    chunks = list(
        client.chat.completions.create(
            model="claude/claude-3-5-sonnet-20240620",
            messages=MESSAGES,
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    args: dict[int, str] = {}
    for chunk in chunks:
        for sc in chunk.choices:
            for call in sc.delta.tool_calls or ():
                args[call.index] = args.get(call.index, "") + (
                    (call.function.arguments if call.function else None) or ""
                )
    assert [sorted(json.loads(a)) for _, a in sorted(args.items())] == [["location", "unit"], ["timezone"]]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 153
