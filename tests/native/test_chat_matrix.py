"""Chat on every built-in kind, one matrix: {text, tool call} x {plain, streamed}, JSON output, and the
upstream's errors, each through the gateway (uvicorn, real socket) in front of a loopback upstream that
speaks the kind's own wire from a recording (tests/fixtures/SOURCES.md, "Chat matrix").

What the client gets is compared with what the recording holds: OpenAI's `chat.completion` and
`chat.completion.chunk` shapes, the text, each tool call's id, name and arguments byte for byte, the
finish reason as OpenAI names it, and the usage. An upstream error reaches a chat client with the status
and body a completions client gets for the same upstream answer.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.helpers.clients import sse_data
from tests.helpers.eventstream import split_frames
from tests.helpers.recordings import fixture_bytes, fixture_json, sse_events
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Handler, Upstream, reply, reply_sse
from tests.native.test_bedrock_e2e import AKID, SECRET, reply_eventstream

OPENAI_FAMILY = (
    "openai",
    "azure",
    "fireworks",
    "together",
    "deepseek",
    "mistral",
    "vllm",
    "sglang",
    "llamacpp",
    "tgi",
    "ollama",
    "pais",
    "sgp",
)
NATIVE = ("anthropic", "gemini", "cohere", "bedrock")
KINDS = (*OPENAI_FAMILY, *NATIVE)

CONFIG = """
unsupported_params: error
retries: {{attempts: 1}}
providers:
  openai: {{kind: openai, api_key: k, base_url: {url}/openai/v1}}
  azure: {{kind: azure, api_key: k, base_url: {url}/azure, api_version: "2024-06-01"}}
  fireworks: {{kind: fireworks, api_key: k, base_url: {url}/fireworks/inference/v1}}
  together: {{kind: together, api_key: k, base_url: {url}/together/v1}}
  deepseek: {{kind: deepseek, api_key: k, base_url: {url}/deepseek}}
  mistral: {{kind: mistral, api_key: k, base_url: {url}/mistral}}
  vllm: {{kind: vllm, base_url: {url}/vllm/v1, discover: false}}
  sglang: {{kind: sglang, base_url: {url}/sglang/v1, discover: false}}
  llamacpp: {{kind: llamacpp, base_url: {url}/llamacpp, discover: false}}
  tgi: {{kind: tgi, base_url: {url}/tgi, discover: false}}
  ollama: {{kind: ollama, base_url: {url}/ollama, discover: false}}
  pais: {{kind: pais, base_url: {url}/pais/api/v1/compatibility/openai/v1}}
  sgp: {{kind: sgp, api_key: k, base_url: {url}/sgp}}
  anthropic: {{kind: anthropic, api_key: k, base_url: {url}/anthropic}}
  gemini: {{kind: gemini, api_key: k, base_url: {url}/gemini}}
  cohere: {{kind: cohere, api_key: k, base_url: {url}/cohere}}
  bedrock:
    kind: bedrock
    region: us-east-1
    api_key: ${{AWS_ACCESS_KEY_ID}}:${{AWS_SECRET_ACCESS_KEY}}
    base_url: {url}/bedrock
"""
GATEWAY_ENV = {"AWS_ACCESS_KEY_ID": AKID, "AWS_SECRET_ACCESS_KEY": SECRET}

MODEL = {kind: f"{kind}/m" for kind in KINDS} | {"bedrock": "bedrock/amazon.nova-micro-v1:0"}
CHAT_PATH = {
    "openai": "/openai/v1/chat/completions",
    "azure": "/azure/openai/deployments/m/chat/completions",
    "fireworks": "/fireworks/inference/v1/chat/completions",
    "together": "/together/v1/chat/completions",
    "deepseek": "/deepseek/chat/completions",
    "mistral": "/mistral/v1/chat/completions",
    "vllm": "/vllm/v1/chat/completions",
    "sglang": "/sglang/v1/chat/completions",
    "llamacpp": "/llamacpp/v1/chat/completions",
    "tgi": "/tgi/v1/chat/completions",
    "ollama": "/ollama/v1/chat/completions",
    "pais": "/pais/api/v1/compatibility/openai/v1/chat/completions",
    "sgp": "/sgp/v4/beta/chat/completions",
    "anthropic": "/anthropic/v1/messages",
    "gemini": "/gemini/v1beta/models/m:generateContent",
    "cohere": "/cohere/v2/chat",
    "bedrock": "/bedrock/model/amazon.nova-micro-v1:0/converse",
}
STREAM_PATH = CHAT_PATH | {
    "gemini": "/gemini/v1beta/models/m:streamGenerateContent",
    "bedrock": "/bedrock/model/amazon.nova-micro-v1:0/converse-stream",
}

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather",
            "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]},
        },
    }
]
MESSAGES: list[Any] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
    "additionalProperties": False,
}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "CityLocation", "schema": SCHEMA, "strict": True}}


# --- what each recording says the client should get -------------------------------------------------


@dataclass(frozen=True)
class Want:
    """The answer as a client reads it: text, tool calls (id or None when the provider gives none, name,
    arguments), OpenAI's finish reason, usage (prompt, completion, total)."""

    content: str | None
    calls: list[tuple[str | None, str, str]]
    finish: str
    usage: tuple[int, int, int] | None


def _openai_plain(rel: str) -> Want:
    body = fixture_json(rel)
    choice, usage = body["choices"][0], body["usage"]
    calls = [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in choice["message"].get("tool_calls") or ()
    ]
    return Want(
        choice["message"]["content"],
        calls,
        choice["finish_reason"],
        (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]),
    )


def _joined(deltas: list[tuple[int, str | None, str | None, str]]) -> list[tuple[str | None, str, str]]:
    slots: dict[int, list[Any]] = {}
    for index, call_id, name, piece in deltas:
        slot = slots.setdefault(index, [None, "", ""])
        slot[0] = slot[0] or call_id
        slot[1] += name or ""
        slot[2] += piece
    return [(s[0], s[1], s[2]) for _, s in sorted(slots.items())]


def _openai_stream(rel: str, usage: tuple[int, int, int] | None) -> Want:
    text, finish, deltas = "", "", []
    for event in sse_events(fixture_bytes(rel)):
        data = event.split(b"data:", 1)[1].strip()
        if data == b"[DONE]":
            continue
        for choice in json.loads(data)["choices"]:
            text += choice["delta"].get("content") or ""
            finish = choice.get("finish_reason") or finish
            for tc in choice["delta"].get("tool_calls") or ():
                fn = tc.get("function") or {}
                deltas.append((tc["index"], tc.get("id"), fn.get("name"), fn.get("arguments") or ""))
    return Want(text or None, _joined(deltas), finish, usage)


def _named_events(rel: str) -> list[dict[str, Any]]:
    return [json.loads(e.split(b"data:", 1)[1]) for e in sse_events(fixture_bytes(rel)) if b"data:" in e]


def _anthropic_plain(rel: str, finish: str) -> Want:
    body = fixture_json(rel)
    text = "".join(b["text"] for b in body["content"] if b["type"] == "text")
    calls = [
        (b["id"], b["name"], json.dumps(b["input"], separators=(",", ":")))
        for b in body["content"]
        if b["type"] == "tool_use"
    ]
    u = body["usage"]
    return Want(text, calls, finish, (u["input_tokens"], u["output_tokens"], u["input_tokens"] + u["output_tokens"]))


def _anthropic_stream(rel: str, finish: str) -> Want:
    text, deltas, usage = "", [], [0, 0]
    for e in _named_events(rel):
        if e["type"] == "message_start":
            usage[0] = e["message"]["usage"]["input_tokens"]
        elif e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use":
            deltas.append((e["index"], e["content_block"]["id"], e["content_block"]["name"], ""))
        elif e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta":
            text += e["delta"]["text"]
        elif e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta":
            deltas.append((e["index"], None, None, e["delta"]["partial_json"]))
        elif e["type"] == "message_delta":
            usage[1] = e["usage"]["output_tokens"]
    return Want(text, _joined(deltas), finish, (usage[0], usage[1], usage[0] + usage[1]))


def _gemini_parts(candidate: dict[str, Any]) -> tuple[str, list[tuple[str | None, str, str]]]:
    parts = candidate.get("content", {}).get("parts", [])
    text = "".join(p.get("text", "") for p in parts if not p.get("thought"))
    calls: list[tuple[str | None, str, str]] = [
        (None, p["functionCall"]["name"], json.dumps(p["functionCall"]["args"], separators=(",", ":")))
        for p in parts
        if "functionCall" in p
    ]
    return text, calls


def _gemini_plain(rel: str, finish: str, usage: tuple[int, int, int]) -> Want:
    text, calls = _gemini_parts(fixture_json(rel)["candidates"][0])
    return Want(text or None, calls, finish, usage)


def _gemini_stream(rel: str, finish: str, usage: tuple[int, int, int]) -> Want:
    text, calls = "", list[tuple[str | None, str, str]]()
    for e in _named_events(rel):
        more, more_calls = _gemini_parts(e["candidates"][0])
        text, calls = text + more, calls + more_calls
    return Want(text or None, calls, finish, usage)


def _cohere_plain(rel: str, finish: str, usage: tuple[int, int, int]) -> Want:
    message = fixture_json(rel)["message"]
    text = "".join(c["text"] for c in message.get("content") or () if c["type"] == "text")
    calls = [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or ()]
    return Want(text or None, calls, finish, usage)


def _cohere_stream(rel: str, finish: str, usage: tuple[int, int, int]) -> Want:
    text, deltas = "", []
    for e in _named_events(rel):
        message = e.get("delta", {}).get("message", {})
        if e["type"] == "content-delta":
            text += message["content"]["text"]
        elif e["type"] == "tool-call-start":
            call = message["tool_calls"]
            deltas.append((e["index"], call["id"], call["function"]["name"], call["function"].get("arguments", "")))
        elif e["type"] == "tool-call-delta":
            deltas.append((e["index"], None, None, message["tool_calls"]["function"]["arguments"]))
    return Want(text or None, _joined(deltas), finish, usage)


def _bedrock_plain(rel: str, finish: str) -> Want:
    body = fixture_json(rel)
    blocks = body["output"]["message"]["content"]
    text = "".join(b.get("text", "") for b in blocks)
    calls = [
        (b["toolUse"]["toolUseId"], b["toolUse"]["name"], json.dumps(b["toolUse"]["input"], separators=(",", ":")))
        for b in blocks
        if "toolUse" in b
    ]
    u = body["usage"]
    return Want(text or None, calls, finish, (u["inputTokens"], u["outputTokens"], u["totalTokens"]))


def _frame_event(raw: bytes) -> tuple[str, dict[str, Any]]:
    """An event-stream frame's `:event-type` and JSON payload (layout: tests/helpers/eventstream.py)."""
    total, headers_len = struct.unpack_from(">II", raw)
    headers, i, event_type = raw[12 : 12 + headers_len], 0, ""
    while i < len(headers):
        name_len = headers[i]
        name = headers[i + 1 : i + 1 + name_len].decode()
        (value_len,) = struct.unpack_from(">H", headers, i + 2 + name_len)
        value = headers[i + 4 + name_len : i + 4 + name_len + value_len].decode()
        event_type = value if name == ":event-type" else event_type
        i += 4 + name_len + value_len
    return event_type, json.loads(raw[12 + headers_len : total - 4])


def _bedrock_stream(rel: str, finish: str) -> Want:
    text, deltas, usage = "", [], (0, 0, 0)
    for event_type, payload in (_frame_event(f) for f in split_frames(fixture_bytes(rel))):
        if event_type == "contentBlockStart" and "toolUse" in payload["start"]:
            start = payload["start"]["toolUse"]
            deltas.append((payload["contentBlockIndex"], start["toolUseId"], start["name"], ""))
        elif event_type == "contentBlockDelta" and "text" in payload["delta"]:
            text += payload["delta"]["text"]
        elif event_type == "contentBlockDelta" and "toolUse" in payload["delta"]:
            deltas.append((payload["contentBlockIndex"], None, None, payload["delta"]["toolUse"]["input"]))
        elif event_type == "metadata":
            u = payload["usage"]
            usage = (u["inputTokens"], u["outputTokens"], u["totalTokens"])
    return Want(text or None, _joined(deltas), finish, usage)


# Usage where the provider's own fields need a rule: Gemini's completion count holds its thoughts
# (candidates + thoughts, so the three add up to totalTokenCount); Cohere's are `usage.billed_units`, as
# on completions (providers/cohere.py). A stream whose recording reports no usage gets no usage chunk.
OPENAI_CASES: dict[str, tuple[Callable[[], Want], str]] = {
    "text": (lambda: _openai_plain("openai/chat_completion.json"), "openai/chat_completion.json"),
    "text_stream": (
        lambda: _openai_stream("fireworks/chat_stream_via_hf_router.sse.txt", (46, 20, 66)),
        "fireworks/chat_stream_via_hf_router.sse.txt",
    ),
    "tool": (lambda: _openai_plain("openai/chat_tool_calls.json"), "openai/chat_tool_calls.json"),
    "tool_stream": (
        lambda: _openai_stream("openai/chat_stream_tool_calls_parallel.sse.txt", None),
        "openai/chat_stream_tool_calls_parallel.sse.txt",
    ),
    "json": (lambda: _openai_plain("openai/chat_json_schema.json"), "openai/chat_json_schema.json"),
}
NATIVE_CASES: dict[str, dict[str, tuple[Callable[[], Want], str]]] = {
    "anthropic": {
        "text": (
            lambda: _anthropic_plain("anthropic/messages_end_turn.json", "stop"),
            "anthropic/messages_end_turn.json",
        ),
        "text_stream": (
            lambda: _anthropic_stream("anthropic/messages_stream.sse.txt", "stop"),
            "anthropic/messages_stream.sse.txt",
        ),
        "tool": (
            lambda: _anthropic_plain("anthropic/messages_tool_use.json", "tool_calls"),
            "anthropic/messages_tool_use.json",
        ),
        "tool_stream": (
            lambda: _anthropic_stream("anthropic/messages_stream_tool_use.sse.txt", "tool_calls"),
            "anthropic/messages_stream_tool_use.sse.txt",
        ),
    },
    "gemini": {
        "text": (
            lambda: _gemini_plain("gemini/generate_content_stop_sequence.json", "stop", (25, 8, 33)),
            "gemini/generate_content_stop_sequence.json",
        ),
        "text_stream": (
            lambda: _gemini_stream("gemini/stream_generate_content.sse.txt", "stop", (13, 8, 21)),
            "gemini/stream_generate_content.sse.txt",
        ),
        "tool": (
            lambda: _gemini_plain("gemini/generate_content_function_args.json", "tool_calls", (723, 172, 895)),
            "gemini/generate_content_function_args.json",
        ),
        "tool_stream": (
            lambda: _gemini_stream("gemini/stream_function_call.sse.txt", "tool_calls", (29, 120, 149)),
            "gemini/stream_function_call.sse.txt",
        ),
        "json": (
            lambda: _gemini_plain("gemini/generate_content_json_schema.json", "stop", (8, 20, 28)),
            "gemini/generate_content_json_schema.json",
        ),
    },
    "cohere": {
        "text": (
            lambda: _cohere_plain("cohere/v2_chat_stop_sequence.json", "stop", (25, 9, 34)),
            "cohere/v2_chat_stop_sequence.json",
        ),
        "text_stream": (
            lambda: _cohere_stream("cohere/v2_chat_stream_text.sse.txt", "length", (20, 4, 24)),
            "cohere/v2_chat_stream_text.sse.txt",
        ),
        "tool": (
            lambda: _cohere_plain("cohere/v2_chat_tool_call.json", "tool_calls", (35, 22, 57)),
            "cohere/v2_chat_tool_call.json",
        ),
        "tool_stream": (
            lambda: _cohere_stream("cohere/v2_chat_stream_tool_calls.sse.txt", "tool_calls", (37, 28, 65)),
            "cohere/v2_chat_stream_tool_calls.sse.txt",
        ),
        # No Cohere answer to a JSON request was ever published: the recorded text answer stands in for
        # it, and the JSON cell checks the request's translation and that the text is relayed as it is.
        "json": (
            lambda: _cohere_plain("cohere/v2_chat_stop_sequence.json", "stop", (25, 9, 34)),
            "cohere/v2_chat_stop_sequence.json",
        ),
    },
    "bedrock": {
        "text": (lambda: _bedrock_plain("bedrock/converse_end_turn.json", "stop"), "bedrock/converse_end_turn.json"),
        "text_stream": (
            lambda: _bedrock_stream("bedrock/converse_stream.eventstream", "stop"),
            "bedrock/converse_stream.eventstream",
        ),
        "tool": (
            lambda: _bedrock_plain("bedrock/converse_tool_use.json", "tool_calls"),
            "bedrock/converse_tool_use.json",
        ),
        "tool_stream": (
            lambda: _bedrock_stream("bedrock/converse_stream_tool_use.eventstream", "tool_calls"),
            "bedrock/converse_stream_tool_use.eventstream",
        ),
        "json": (
            lambda: _bedrock_plain("bedrock/converse_json_schema.json", "stop"),
            "bedrock/converse_json_schema.json",
        ),
    },
}


# Kinds whose chat route takes no `response_format` (docs/chat.md): a 400 naming the provider, no call.
REFUSE_JSON = ("anthropic", "tgi")


def _case(kind: str, case: str) -> tuple[Callable[[], Want], str] | None:
    if case == "json" and kind in REFUSE_JSON:
        return None
    if kind in OPENAI_FAMILY:
        return OPENAI_CASES[case]
    return NATIVE_CASES[kind].get(case)


def _handler(rel: str) -> Handler:
    raw = fixture_bytes(rel)
    if rel.endswith(".eventstream"):
        return reply_eventstream(raw, 97)
    if rel.endswith(".sse.txt"):
        return reply_sse(sse_events(raw))
    return reply(raw)


def _request(case: str) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": MESSAGES, "max_tokens": 300}
    if case.startswith("tool"):
        body["tools"] = TOOLS
    if case == "json":
        body["response_format"] = JSON_FORMAT
    if case.endswith("_stream"):
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


def _read_plain(resp: httpx.Response, model: str) -> Want:
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-") and body["model"] == model
    (choice,) = body["choices"]
    message = choice["message"]
    assert choice["index"] == 0 and message["role"] == "assistant"
    calls = []
    for call in message.get("tool_calls") or ():
        assert call["type"] == "function"
        calls.append((call["id"], call["function"]["name"], call["function"]["arguments"]))
    u = body["usage"]
    return Want(
        message["content"],
        calls,
        choice["finish_reason"],
        (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]),
    )


def _read_stream(resp: httpx.Response, model: str) -> Want:
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == model for c in chunks), chunks
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    # The usage chunk, asked for, when the upstream reported usage (the gateway does not send its estimate).
    body, last = (chunks[:-1], chunks[-1]) if chunks[-1]["choices"] == [] else (chunks, None)
    finishes = [ch["finish_reason"] for c in body for ch in c["choices"] if ch.get("finish_reason")]
    assert len(finishes) == 1, finishes
    text, deltas = "", []
    for c in body:
        assert c.get("usage") is None
        for ch in c["choices"]:
            text += ch["delta"].get("content") or ""
            for tc in ch["delta"].get("tool_calls") or ():
                fn = tc.get("function") or {}
                deltas.append((tc["index"], tc.get("id"), fn.get("name"), fn.get("arguments") or ""))
    if last is None:
        return Want(text or None, _joined(deltas), finishes[0], None)
    u = last["usage"]
    return Want(
        text or None, _joined(deltas), finishes[0], (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"])
    )


def _same(got: Want, want: Want) -> None:
    assert got.content == want.content
    assert got.finish == want.finish
    assert len(got.calls) == len(want.calls)
    for (got_id, name, args), (want_id, want_name, want_args) in zip(got.calls, want.calls, strict=True):
        assert (name, args) == (want_name, want_args)  # the provider's arguments, byte for byte
        assert got_id if want_id is None else got_id == want_id
    assert got.usage == want.usage


CASES = ("text", "text_stream", "tool", "tool_stream", "json")
CELLS = [
    pytest.param(kind, case, id=f"{kind}-{case}") for kind in KINDS for case in CASES if _case(kind, case) is not None
]


@pytest.mark.parametrize(("kind", "case"), CELLS)
def test_answer(api: httpx.Client, upstream: Upstream, kind: str, case: str) -> None:
    found = _case(kind, case)
    assert found is not None
    want, rel = found
    upstream.handler = _handler(rel)
    resp = api.post("/v1/chat/completions", json={"model": MODEL[kind], **_request(case)})
    got = _read_stream(resp, MODEL[kind]) if case.endswith("_stream") else _read_plain(resp, MODEL[kind])
    _same(got, want())
    sent = upstream.only()
    assert sent.path == (STREAM_PATH if case.endswith("_stream") else CHAT_PATH)[kind]
    _check_sent(kind, case, sent.json())


def _check_sent(kind: str, case: str, body: dict[str, Any]) -> None:
    """The request's translation into the kind's wire: tools and response format where each goes."""
    if kind in OPENAI_FAMILY:
        assert body["messages"] == MESSAGES
        if case.startswith("tool"):
            assert body["tools"] == TOOLS
        if case == "json":
            assert body["response_format"] == JSON_FORMAT
        return
    if kind == "anthropic":
        assert body["system"] == "Be brief."
        assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}]
        if case.startswith("tool"):
            fn = TOOLS[0]["function"]
            assert body["tools"] == [
                {"name": fn["name"], "description": fn["description"], "input_schema": fn["parameters"]}
            ]
    elif kind == "gemini":
        assert body["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
        if case == "json":
            config = body["generationConfig"]
            assert (config["responseMimeType"], config["responseJsonSchema"]) == ("application/json", SCHEMA)
    elif kind == "cohere":
        assert body["messages"] == MESSAGES
        if case == "json":
            assert body["response_format"] == {"type": "json_object", "json_schema": SCHEMA}
    elif kind == "bedrock" and case == "json":
        text_format = body["outputConfig"]["textFormat"]
        assert text_format["type"] == "json_schema"
        assert json.loads(text_format["structure"]["jsonSchema"]["schema"]) == SCHEMA


@pytest.mark.parametrize("kind", REFUSE_JSON)
def test_json_output_refused(api: httpx.Client, upstream: Upstream, kind: str) -> None:
    resp = api.post("/v1/chat/completions", json={"model": MODEL[kind], **_request("json")})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["param"], error["code"]) == ("response_format", "unsupported_parameter")
    assert f"'{kind}'" in error["message"]
    assert upstream.received == []


# --- upstream errors ---------------------------------------------------------------------------------


def _openai_error(status: int, type_: str, code: str | None, message: str) -> bytes:
    """OpenAI's envelope as recorded (openai/error_400_model_not_found.json), with another status's values."""
    body: dict[str, Any] = fixture_json("openai/error_400_model_not_found.json")
    body["error"].update(message=message, type=type_, code=code, param=None)
    return json.dumps(body).encode()


Error = tuple[int, bytes, bytes, dict[str, str]]  # status, chat route's body, completion route's body, headers


def _same_body(status: int, body: bytes, headers: dict[str, str] | None = None) -> Error:
    return (status, body, body, headers or {})


def _errors(kind: str) -> list[Error]:
    """Errors in the kind's own shape: recorded where a recording exists, else the shape its documentation
    or source gives (SOURCES.md, "Chat matrix"). Ollama's OpenAI route (chat) and its native API
    (completions) answer in different shapes."""
    if kind == "anthropic":
        return [
            _same_body(400, fixture_bytes("anthropic/error_400_invalid_request.json")),
            _same_body(429, b'{"type":"error","error":{"type":"rate_limit_error","message":"Rate limited"}}'),
            _same_body(529, b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'),
        ]
    if kind == "gemini":
        return [
            _same_body(400, b'{"error":{"code":400,"message":"Invalid value","status":"INVALID_ARGUMENT"}}'),
            _same_body(
                429, b'{"error":{"code":429,"message":"Resource has been exhausted","status":"RESOURCE_EXHAUSTED"}}'
            ),
            _same_body(500, b'{"error":{"code":500,"message":"An internal error has occurred","status":"INTERNAL"}}'),
        ]
    if kind == "cohere":
        return [
            _same_body(400, b'{"id":"e1","message":"invalid request: message must be at least 1 token long"}'),
            _same_body(
                429, b'{"id":"e2","message":"You are using a Trial key, which is limited to 20 API calls / minute."}'
            ),
            _same_body(500, b'{"id":"e3","message":"internal server error, this has been reported to our developers"}'),
        ]
    if kind == "bedrock":
        return [
            _same_body(400, fixture_bytes("bedrock/error_400_invalid_model.json")),
            _same_body(
                429,
                fixture_bytes("bedrock/error_429_throttling.json"),
                {"x-amzn-ErrorType": "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"},
            ),
            _same_body(500, b'{"message":"Internal server error"}', {"x-amzn-ErrorType": "InternalServerException"}),
        ]
    if kind == "mistral":
        return [
            _same_body(
                400,
                b'{"object":"error","message":"Invalid model: m","type":"invalid_model","param":null,"code":"1500"}',
            ),
            _same_body(
                429,
                b'{"object":"error","message":"Rate limit exceeded","type":"rate_limited","param":null,"code":"1300"}',
                {"retry-after": "7"},
            ),
            _same_body(
                500, b'{"object":"error","message":"Internal error","type":"internal_error","param":null,"code":null}'
            ),
        ]
    if kind == "llamacpp":
        return [
            _same_body(400, b'{"error":{"code":400,"message":"\\"prompt\\" is empty","type":"invalid_request_error"}}'),
            _same_body(503, b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'),
            _same_body(500, b'{"error":{"code":500,"message":"Failed to tokenize","type":"server_error"}}'),
        ]
    if kind == "tgi":
        return [
            _same_body(422, fixture_bytes("tgi/error_422_validation.json")),
            _same_body(429, b'{"error":"Model is overloaded","error_type":"overloaded"}'),
            _same_body(
                424, b'{"error":"Request failed during generation: CUDA out of memory","error_type":"generation"}'
            ),
        ]
    if kind == "ollama":
        return [
            (
                404,
                b'{"error":{"message":"model \\"m\\" not found, try pulling it first","type":"not_found_error",'
                b'"param":null,"code":null}}',
                b'{"error":"model \\"m\\" not found, try pulling it first"}',
                {},
            ),
            (
                400,
                b'{"error":{"message":"invalid message format","type":"invalid_request_error",'
                b'"param":null,"code":null}}',
                b'{"error":"invalid message format"}',
                {},
            ),
            (
                500,
                b'{"error":{"message":"llama runner process has terminated","type":"api_error",'
                b'"param":null,"code":null}}',
                b'{"error":"llama runner process has terminated"}',
                {},
            ),
        ]
    first = _same_body(400, fixture_bytes("openai/error_400_model_not_found.json"))
    if kind == "vllm":
        first = _same_body(404, fixture_bytes("vllm/error_404_model_not_found.json"))
    return [
        first,
        _same_body(
            429, _openai_error(429, "requests", "rate_limit_exceeded", "Rate limit reached"), {"retry-after": "7"}
        ),
        _same_body(500, _openai_error(500, "server_error", None, "The server had an error")),
    ]


ERROR_CELLS = [pytest.param(kind, i, id=f"{kind}-{i}") for kind in KINDS for i in range(3)]


@pytest.mark.parametrize(("kind", "which"), ERROR_CELLS)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_upstream_error_as_on_completions(
    api: httpx.Client, gateway: GatewayThread, upstream: Upstream, kind: str, which: int, stream: bool
) -> None:
    status, chat_body, completion_body, headers = _errors(kind)[which]
    extra = {"stream": True} if stream else {}
    upstream.handler = reply(completion_body, status=status, headers=headers)
    completion = api.post("/v1/completions", json={"model": MODEL[kind], "prompt": "Weather in Paris?", **extra})
    upstream.handler = reply(chat_body, status=status, headers=headers)
    gateway.pipeline.health.reset()  # the first failure must not cool the target down for the second call
    chat = api.post("/v1/chat/completions", json={"model": MODEL[kind], "messages": MESSAGES, **extra})
    assert chat.status_code == completion.status_code, (chat.text, completion.text)
    assert chat.json() == completion.json()
    assert chat.headers["content-type"].startswith("application/json")
    assert chat.headers.get("retry-after") == completion.headers.get("retry-after")
    if status in (400, 404, 422, 429):
        assert chat.status_code == status
    else:  # the upstream's own failure (TGI's 424 is a failed generation): a gateway error
        assert chat.status_code >= 500
    # The provider's own words reach the client, never its raw body.
    message = chat.json()["error"]["message"]
    assert message.startswith(f"{kind} error ({status}): ") and "{" not in message, message
    assert len(upstream.received) == 2
