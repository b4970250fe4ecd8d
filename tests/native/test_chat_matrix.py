"""Chat on every built-in kind, one matrix: {text, tool call} x {plain, streamed} and JSON output, each through
the gateway (uvicorn, real socket) in front of a loopback upstream that speaks the kind's own wire from a
recording (tests/fixtures/SOURCES.md, "Chat matrix").

What the client gets is compared with what the recording holds: OpenAI's `chat.completion` and
`chat.completion.chunk` shapes, the text, each tool call's id, name and arguments byte for byte, the
finish reason as OpenAI names it, and the usage.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.helpers.chat_answers import NATIVE_CASES, OPENAI_CASES, Want, joined
from tests.helpers.clients import sse_data
from tests.helpers.upstreams import Upstream
from tests.native import chat_matrix_setup
from tests.native.chat_matrix_setup import KINDS, MESSAGES, MODEL, OPENAI_FAMILY, kind_handler

# The gateway fixture (tests/native/conftest.py) reads these from the test module.
CONFIG, GATEWAY_ENV = chat_matrix_setup.CONFIG, chat_matrix_setup.GATEWAY_ENV


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


SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
    "additionalProperties": False,
}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "CityLocation", "schema": SCHEMA, "strict": True}}


# Kinds whose chat route takes no `response_format` of type json_schema (docs/chat.md): a 400 naming the
# provider, no call.
REFUSE_JSON = ("anthropic", "deepseek")


def _case(kind: str, case: str) -> tuple[Callable[[], Want], str] | None:
    if case == "json" and kind in REFUSE_JSON:
        return None
    if kind in OPENAI_FAMILY:
        return OPENAI_CASES[case]
    return NATIVE_CASES[kind].get(case)


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
    # Each call's `id` and `function.name` come once, in its first delta; its arguments may come in pieces.
    for index in {d[0] for d in deltas}:
        mine = [d for d in deltas if d[0] == index]
        assert mine[0][1] is not None and mine[0][2] is not None, mine
        assert all(d[1] is None and d[2] is None for d in mine[1:]), mine
    if last is None:
        return Want(text or None, joined(deltas), finishes[0], None)
    u = last["usage"]
    return Want(
        text or None, joined(deltas), finishes[0], (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"])
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
    upstream.handler = kind_handler(rel)
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
        if case == "json" and kind == "tgi":
            # TGI's Messages API takes the schema as its grammar.
            assert body["response_format"] == {"type": "json", "value": SCHEMA}
        elif case == "json":
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
