"""`/v1/chat/completions` on the gemini, cohere and sgp kinds, with the official `openai` SDK, over real
sockets: a loopback upstream answers each kind's native wire from recordings (tests/fixtures/SOURCES.md),
and the SDK gets OpenAI's chat shapes (tool calls with the provider's arguments byte for byte, plain and
streamed), the upstream got the provider's request, and the provider's errors keep their status.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web
from openai.types.chat import ChatCompletionMessageFunctionToolCall
from pydantic import BaseModel

from tests.helpers.clients import client as keyed_client
from tests.helpers.clients import openai_client
from tests.helpers.recordings import fixture_bytes, fixture_json, sse_events
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream

KEY = "gk-chat-native-7c2e"
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "final_result",
            "description": "The final response which ends this conversation",
            "parameters": {
                "type": "object",
                "properties": {"response": {"type": "array", "items": {"type": "string"}}},
                "required": ["response"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
]
MESSAGES: list[Any] = [{"role": "system", "content": "Tell jokes."}, {"role": "user", "content": "Three, please."}]
GEMINI_429 = {"error": {"code": 429, "message": "Resource has been exhausted", "status": "RESOURCE_EXHAUSTED"}}
COHERE_400 = {"id": "e1", "message": "invalid request: message must be at least 1 token long"}

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
unsupported_params: error
timeouts: {{connect_ms: 2000, first_byte_ms: 10000, total_ms: 20000}}
retries: {{attempts: 1}}
keys:
  - {{name: chat, key: "${{CHAT_KEY}}"}}
providers:
  gem: {{kind: gemini, base_url: {u}/gemini, api_key: g-key}}
  co: {{kind: cohere, base_url: {u}/cohere, api_key: co-key}}
  scale: {{kind: sgp, base_url: {u}/sgp, api_key: sgp-key}}
"""


async def _sse(request: web.Request, events: list[bytes]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for event in events:
        await resp.write(event + b"\r\n\r\n")
    await resp.write_eof()
    return resp


async def _handler(request: web.Request, received: Received) -> web.StreamResponse:
    path = received.path
    if path.startswith("/gemini/"):
        if "broken" in path:
            return web.json_response(GEMINI_429, status=429)
        if path.endswith(":streamGenerateContent"):
            if received.json().get("tools"):
                return await _sse(request, sse_events(fixture_bytes("gemini/stream_function_call.sse.txt")))
            return await _sse(request, sse_events(fixture_bytes("gemini/stream_generate_content.sse.txt")))
        body = received.json()
        name = "gemini/generate_content_stop_sequence.json"
        if body.get("tools"):
            name = "gemini/generate_content_function_args.json"
        elif "responseJsonSchema" in body.get("generationConfig", {}):
            name = "gemini/generate_content_json_schema.json"
        elif body.get("generationConfig", {}).get("candidateCount") == 2:
            # No recording holds two candidates: the recorded one and a copy at `index` 1 (Candidate.index).
            answer = fixture_json(name)
            answer["candidates"].append({**answer["candidates"][0], "index": 1})
            return web.json_response(answer)
        return web.Response(body=fixture_bytes(name), content_type="application/json")
    if path == "/cohere/v2/chat":
        body = received.json()
        if body["model"] == "broken":
            return web.json_response(COHERE_400, status=400)
        if body["model"] == "elsewhere":  # a base URL that reaches an OpenAI-compatible server instead
            return web.Response(body=fixture_bytes("openai/chat_completion.json"), content_type="application/json")
        if body.get("stream"):
            name = (
                "cohere/v2_chat_stream_tool_calls.sse.txt"
                if body.get("tools")
                else "cohere/v2_chat_stream_text.sse.txt"
            )
            return await _sse(request, sse_events(fixture_bytes(name)))
        name = "cohere/v2_chat_tool_call.json" if body.get("tools") else "cohere/v2_chat_stop_sequence.json"
        return web.Response(body=fixture_bytes(name), content_type="application/json")
    if path == "/sgp/v4/beta/chat/completions":
        return web.Response(body=fixture_bytes("openai/chat_completion.json"), content_type="application/json")
    return web.json_response({"error": {"message": f"not found: {path}"}}, status=404)


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        server.handler = _handler
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("chat-native"), CONFIG.format(u=upstream.url), {"CHAT_KEY": KEY}) as gw:
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
    with keyed_client(gateway.url, KEY) as http:
        yield http


def _calls(answer: Any) -> list[ChatCompletionMessageFunctionToolCall]:
    return [
        c for c in answer.choices[0].message.tool_calls or () if isinstance(c, ChatCompletionMessageFunctionToolCall)
    ]


def _joined(chunks: list[Any]) -> dict[int, list[str]]:
    """What a client reassembles from the tool-call deltas: per index, the id, the name, the arguments."""
    got: dict[int, list[str]] = {}
    for chunk in chunks:
        for sc in chunk.choices:
            for call in sc.delta.tool_calls or ():
                slot = got.setdefault(call.index, ["", "", ""])
                slot[0] += call.id or ""
                slot[1] += (call.function.name if call.function else None) or ""
                slot[2] += (call.function.arguments if call.function else None) or ""
    return got


# --- gemini ---------------------------------------------------------------------------------------


def test_gemini_tool_call(client: openai.OpenAI, received: list[Received]) -> None:
    recorded = fixture_json("gemini/generate_content_function_args.json")["candidates"][0]["content"]["parts"][0]
    answer = client.chat.completions.create(
        model="gem/gemini-3-flash-preview", messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=200
    )
    (call,) = _calls(answer)
    assert call.function.name == "final_result"
    assert call.function.arguments == json.dumps(recorded["functionCall"]["args"], separators=(",", ":"))
    assert answer.choices[0].finish_reason == "tool_calls" and answer.choices[0].message.content is None
    assert answer.usage is not None and answer.usage.total_tokens == 895
    (sent,) = received
    assert sent.path == "/gemini/v1beta/models/gemini-3-flash-preview:generateContent"
    assert sent.headers["x-goog-api-key"] == "g-key"
    body = sent.json()
    assert body["systemInstruction"] == {"parts": [{"text": "Tell jokes."}]}
    assert body["contents"] == [{"role": "user", "parts": [{"text": "Three, please."}]}]
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}
    assert body["generationConfig"] == {"maxOutputTokens": 200}
    assert [d["name"] for d in body["tools"][0]["functionDeclarations"]] == ["final_result", "get_weather"]

    # The next turn: the call and its result, as Gemini wants them (the thought signature back on the call).
    client.chat.completions.create(
        model="gem/gemini-3-flash-preview",
        messages=[
            *MESSAGES,
            answer.choices[0].message.model_dump(exclude_none=True),  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": call.id, "content": "done"},
        ],
        tools=TOOLS,
    )
    contents = received[1].json()["contents"]
    assert contents[1]["role"] == "model"
    assert contents[1]["parts"][0]["functionCall"]["args"] == recorded["functionCall"]["args"]
    assert contents[1]["parts"][0]["thoughtSignature"] == recorded["thoughtSignature"]
    assert contents[2]["parts"][0]["functionResponse"]["name"] == "final_result"


def test_gemini_streamed_tool_call_and_text(client: openai.OpenAI, received: list[Received]) -> None:
    chunks = list(
        client.chat.completions.create(
            model="gem/gemini-3-pro-preview",
            messages=MESSAGES,
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    (call,) = _joined(chunks).values()
    assert call[1:] == ["get_country", "{}"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 120
    assert received[0].path.endswith(":streamGenerateContent") and received[0].query == {"alt": "sse"}

    text = list(client.chat.completions.create(model="gem/gemini-2.0-flash-exp", messages=MESSAGES, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in text if c.choices) == "The capital of France is Paris.\n"
    assert all(c.choices for c in text)  # no usage chunk: the client did not ask for one


class CityLocation(BaseModel):
    city: str
    country: str


def test_gemini_structured_output_through_parse(client: openai.OpenAI, received: list[Received]) -> None:
    """`chat.completions.parse` with a Pydantic model: its JSON schema goes to Gemini as
    `responseJsonSchema`, and Gemini's JSON text parses into the model."""
    answer = client.chat.completions.parse(
        model="gem/gemini-2.0-flash",
        messages=[{"role": "user", "content": "What is the largest city in Mexico?"}],
        response_format=CityLocation,
    )
    parsed = answer.choices[0].message.parsed
    assert parsed == CityLocation(city="Mexico City", country="Mexico")
    config = received[0].json()["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config["responseJsonSchema"]["properties"] == {
        "city": {"title": "City", "type": "string"},
        "country": {"title": "Country", "type": "string"},
    }


def test_gemini_error_keeps_its_status(api: httpx.Client) -> None:
    resp = api.post("/v1/chat/completions", json={"model": "gem/broken", "messages": MESSAGES})
    assert resp.status_code == 429, resp.text
    assert "Resource has been exhausted" in resp.json()["error"]["message"]


# --- cohere ---------------------------------------------------------------------------------------


def test_cohere_tool_call(client: openai.OpenAI, received: list[Received]) -> None:
    recorded = fixture_json("cohere/v2_chat_tool_call.json")["message"]["tool_calls"][0]
    answer = client.chat.completions.create(model="co/command-r7b-12-2024", messages=MESSAGES, tools=TOOLS)
    (call,) = _calls(answer)
    assert (call.id, call.function.name, call.function.arguments) == (
        recorded["id"],
        recorded["function"]["name"],
        recorded["function"]["arguments"],
    )
    assert answer.choices[0].finish_reason == "tool_calls"
    usage = answer.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 1024
    (sent,) = received
    assert sent.path == "/cohere/v2/chat" and sent.headers["authorization"] == "Bearer co-key"
    assert sent.json()["messages"] == [
        {"role": "system", "content": "Tell jokes."},
        {"role": "user", "content": "Three, please."},
    ]


def test_cohere_streamed_tool_calls(client: openai.OpenAI, received: list[Received]) -> None:
    events = [
        json.loads(e.split(b"data: ", 1)[1])
        for e in sse_events(fixture_bytes("cohere/v2_chat_stream_tool_calls.sse.txt"))
    ]
    want: dict[int, list[str]] = {}
    for e in events:
        call = e.get("delta", {}).get("message", {}).get("tool_calls")
        if e["type"] == "tool-call-start":
            want[e["index"]] = [call["id"], call["function"]["name"], ""]
        elif e["type"] == "tool-call-delta":
            want[e["index"]][2] += call["function"]["arguments"]
    chunks = list(
        client.chat.completions.create(
            model="co/command-r7b-12-2024",
            messages=MESSAGES,
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert _joined(chunks) == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 28
    assert received[0].json()["stream"] is True

    text = list(client.chat.completions.create(model="co/command-r7b-12-2024", messages=MESSAGES, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in text if c.choices) == "Coca-Cola"
    assert [c.choices[0].finish_reason for c in text if c.choices][-1] == "length"


def test_cohere_error_and_refusals(api: httpx.Client, received: list[Received]) -> None:
    resp = api.post("/v1/chat/completions", json={"model": "co/broken", "messages": MESSAGES})
    assert resp.status_code == 400, resp.text
    assert "message must be at least 1 token long" in resp.json()["error"]["message"]
    refused = api.post(
        "/v1/chat/completions",
        json={"model": "co/command-r", "messages": MESSAGES, "logprobs": True, "top_logprobs": 2},
    )
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "unsupported_parameter" and "'co'" in error["message"]
    assert len(received) == 1  # the refusal made no upstream call


def test_cohere_answer_without_a_finish_reason_is_no_answer(api: httpx.Client, received: list[Received]) -> None:
    # Every v2 chat answer says why it ended (Cohere's API definition requires `finish_reason`); a body without
    # one is not Cohere's, and a 200 with empty content and a null finish would be served, cached and billed.
    for route, body in (
        ("/v1/chat/completions", {"model": "co/elsewhere", "messages": MESSAGES}),
        ("/v1/completions", {"model": "co/elsewhere", "prompt": "Three, please."}),
    ):
        resp = api.post(route, json=body)
        assert resp.status_code == 502, (route, resp.text)
        assert resp.json()["error"]["code"] == "invalid_upstream_response", resp.text
    assert len(received) == 2


# --- sgp ------------------------------------------------------------------------------------------


def test_sgp_chat_route(client: openai.OpenAI, received: list[Received]) -> None:
    recorded = fixture_json("openai/chat_completion.json")
    answer = client.chat.completions.create(
        model="scale/gpt-4o", messages=MESSAGES, logprobs=True, top_logprobs=2, extra_body={"top_k": 5}
    )
    assert answer.choices[0].message.content == recorded["choices"][0]["message"]["content"]
    (sent,) = received
    assert sent.path == "/sgp/v4/beta/chat/completions" and sent.headers["x-api-key"] == "sgp-key"
    body = sent.json()
    assert body["model"] == "gpt-4o" and body["messages"] == MESSAGES
    assert (body["logprobs"], body["top_logprobs"], body["top_k"]) == (True, 2, 5)


# Emulation on these kinds' chat routes (docs/chat.md#emulation): Cohere's /v2/chat answers one message,
# so `n` is one call per choice; Gemini's `candidateCount` is its own. Both take 5 stop sequences: a sixth
# is the gateway's to cut.
STOPS_5 = ["s1", "s2", "s3", "s4", "s5"]


def _sse_chunks(resp: httpx.Response) -> list[dict[str, Any]]:
    lines = [line.removeprefix("data: ") for line in resp.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]", lines
    return [json.loads(line) for line in lines[:-1]]


def test_cohere_n_is_fanned_out(api: httpx.Client, received: list[Received]) -> None:
    recorded = fixture_json("cohere/v2_chat_stop_sequence.json")
    one = api.post("/v1/chat/completions", json={"model": "co/command-a", "messages": MESSAGES}).json()
    received.clear()
    resp = api.post("/v1/chat/completions", json={"model": "co/command-a", "messages": MESSAGES, "n": 2})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    text = recorded["message"]["content"][0]["text"]
    assert [(c["index"], c["message"]["content"]) for c in body["choices"]] == [(0, text), (1, text)]
    assert body["usage"]["prompt_tokens"] == 2 * one["usage"]["prompt_tokens"]
    assert body["usage"]["completion_tokens"] == 2 * one["usage"]["completion_tokens"]
    # Two plain /v2/chat calls: `n` never reaches Cohere.
    assert [r.path for r in received] == ["/cohere/v2/chat"] * 2
    assert all("n" not in r.json() and r.json()["messages"] == received[0].json()["messages"] for r in received)


def test_cohere_n_is_fanned_out_in_streams(api: httpx.Client, received: list[Received]) -> None:
    body = {"model": "co/command-a", "messages": MESSAGES, "n": 2, "stream": True}
    resp = api.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    per: dict[int, list[dict[str, Any]]] = {}
    for c in _sse_chunks(resp):
        for ch in c["choices"]:
            per.setdefault(ch["index"], []).append(ch)
    assert sorted(per) == [0, 1]
    for choices in per.values():  # the recording: "Coca-Cola", cut by max_tokens
        assert choices[0]["delta"].get("role") == "assistant"
        assert "".join(ch["delta"].get("content") or "" for ch in choices) == "Coca-Cola"
        assert choices[-1]["finish_reason"] == "length"
    assert len(received) == 2 and all("n" not in r.json() for r in received)


def test_cohere_stops_beyond_five_are_cut_by_the_gateway(api: httpx.Client, received: list[Received]) -> None:
    stops = [*STOPS_5, "France"]
    resp = api.post("/v1/chat/completions", json={"model": "co/command-a", "messages": MESSAGES, "stop": stops})
    assert resp.status_code == 200, resp.text
    (choice,) = resp.json()["choices"]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("The capital of ", "stop")
    assert received[0].json()["stop_sequences"] == STOPS_5
    # Streamed: the recording's "Coca-Cola" ends before the sixth stop.
    received.clear()
    body = {"model": "co/command-a", "messages": MESSAGES, "stop": [*STOPS_5, "-"], "stream": True}
    resp = api.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    choices = [ch for c in _sse_chunks(resp) for ch in c["choices"]]
    assert "".join(ch["delta"].get("content") or "" for ch in choices) == "Coca"
    assert choices[-1]["finish_reason"] == "stop"
    assert received[0].json()["stop_sequences"] == STOPS_5


def test_gemini_n_is_its_candidate_count(api: httpx.Client, received: list[Received]) -> None:
    resp = api.post("/v1/chat/completions", json={"model": "gem/gemini-2.0-flash", "messages": MESSAGES, "n": 2})
    assert resp.status_code == 200, resp.text
    text = fixture_json("gemini/generate_content_stop_sequence.json")["candidates"][0]["content"]["parts"][0]["text"]
    assert [(c["index"], c["message"]["content"]) for c in resp.json()["choices"]] == [(0, text), (1, text)]
    (sent,) = received  # one call: Gemini answers both
    assert sent.json()["generationConfig"]["candidateCount"] == 2


def test_gemini_stops_beyond_five_are_cut_by_the_gateway(api: httpx.Client, received: list[Received]) -> None:
    stops = [*STOPS_5, "iconic"]
    body: dict[str, Any] = {"model": "gem/gemini-2.0-flash", "messages": MESSAGES, "stop": stops}
    resp = api.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    (choice,) = resp.json()["choices"]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("The most ", "stop")
    assert received[0].json()["generationConfig"]["stopSequences"] == STOPS_5
    # Streamed: the recording's "The capital of France is Paris.\n" ends before the sixth stop.
    received.clear()
    body = {"model": "gem/gemini-2.0-flash", "messages": MESSAGES, "stop": [*STOPS_5, " is"], "stream": True}
    resp = api.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    choices = [ch for c in _sse_chunks(resp) for ch in c["choices"]]
    assert "".join(ch["delta"].get("content") or "" for ch in choices) == "The capital of France"
    assert choices[-1]["finish_reason"] == "stop"
    assert received[0].json()["generationConfig"]["stopSequences"] == STOPS_5
