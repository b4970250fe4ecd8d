"""Reasoning models on `/v1/chat/completions`, with the official `openai` SDK, over real sockets.

`reasoning_effort` reaches the kinds whose chat route takes it under OpenAI's name, Anthropic as its
`output_config.effort`, Gemini as its `thinkingConfig`, and is refused by name elsewhere (and on OpenAI's
completions); a model's thinking comes back as `reasoning_content`, plain and streamed, from Anthropic's
thinking blocks and Gemini's thought summaries as from an OpenAI-wire server. That thinking goes back in
the next turn as the agent loop sends it (the answer's message object appended): `reasoning_content` to
DeepSeek and Fireworks, as `reasoning` to vLLM and Ollama, as a `thinking` content chunk to Mistral,
Anthropic's signed `thinking_blocks` at the head of their turn, neither to a strict server. The upstreams
replay recordings (tests/fixtures/SOURCES.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from tests.helpers.clients import openai_client
from tests.helpers.recordings import fixture_bytes, fixture_json
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream

KEY = "gk-reason-51c2"
MESSAGES: list[Any] = [{"role": "user", "content": "How do I cross the street?"}]
CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
unsupported_params: error
timeouts: {{connect_ms: 2000, first_byte_ms: 10000, total_ms: 20000}}
retries: {{attempts: 1}}
keys:
  - {{name: reasoner, key: "${{REASON_KEY}}"}}
providers:
  oa: {{kind: openai, base_url: {u}/v1, api_key: sk-upstream}}
  hosted: {{kind: vllm, base_url: {u}/v1}}
  claude: {{kind: anthropic, base_url: {u}, api_key: sk-ant}}
  gem: {{kind: gemini, base_url: {u}/gemini, api_key: k}}
  mis: {{kind: mistral, base_url: {u}/mistral, api_key: k}}
  ds: {{kind: deepseek, base_url: {u}/ds, api_key: sk-ds}}
  local: {{kind: ollama, base_url: {u}}}
  fw: {{kind: fireworks, base_url: {u}/fw/v1, api_key: fw-k}}
models:
  - name: cached
    targets: [{{model: hosted/served}}]
    cache: {{mode: always}}
  - name: cached-claude
    targets: [{{model: claude/claude-sonnet-4-5}}]
    cache: {{mode: always}}
"""
# The model an OpenAI-wire upstream answers as DeepSeek's recorded thinking turn with a tool call.
TOOL_THINKER = "tool-thinker"
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "load_capability",
            "parameters": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
        },
    }
]
QUESTION: list[Any] = [{"role": "user", "content": "My guess is 4"}]
THINKING = {"thinking": {"type": "enabled", "budget_tokens": 1024}}


def _events(raw: bytes) -> list[bytes]:
    return [e.strip() for e in raw.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]


async def _stream(request: web.Request, events: list[bytes]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for event in events:
        await resp.write(event + b"\n\n")
    await resp.write_eof()
    return resp


async def _handler(request: web.Request, received: Received) -> web.StreamResponse:
    if received.path == "/v1/messages":
        if received.json().get("stream"):
            return await _stream(request, _events(fixture_bytes("anthropic/messages_stream_thinking.sse.txt")))
        return web.Response(body=fixture_bytes("anthropic/messages_thinking.json"), content_type="application/json")
    if received.path.startswith("/gemini/"):
        if received.path.endswith(":streamGenerateContent"):
            return await _stream(request, _events(fixture_bytes("gemini/stream_generate_content_thoughts.sse.txt")))
        body = fixture_bytes("gemini/generate_content_thoughts.json")
        return web.Response(body=body, content_type="application/json")
    if received.path.startswith("/mistral/"):
        if received.json().get("stream"):
            return await _stream(request, _events(fixture_bytes("mistral/chat_stream_magistral_thinking.sse.txt")))
        body = fixture_bytes("mistral/chat_magistral_thinking.json")
        return web.Response(body=body, content_type="application/json")
    if received.path.startswith("/ds/") or received.json().get("model") == TOOL_THINKER:
        body = fixture_bytes("deepseek/chat_thinking_tool_calls.json")
        return web.Response(body=body, content_type="application/json")
    return web.Response(body=fixture_bytes("openai/chat_completion.json"), content_type="application/json")


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        server.handler = _handler
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    folder: Path = tmp_path_factory.mktemp("reasoning")
    with serve_config(folder, CONFIG.format(u=upstream.url), {"REASON_KEY": KEY}) as gw:
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


@pytest.mark.parametrize(
    ("model", "effort"), [("oa/o4-mini", "high"), ("oa/gpt-5", "minimal"), ("hosted/gpt-oss", "low")]
)
def test_reasoning_effort_reaches_the_kinds_that_take_it(
    client: openai.OpenAI, received: list[Received], model: str, effort: Any
) -> None:
    answer = client.chat.completions.create(model=model, messages=MESSAGES, reasoning_effort=effort, max_tokens=64)
    assert answer.choices[0].message.content
    (sent,) = received
    assert sent.json()["reasoning_effort"] == effort


def test_verbosity_reaches_openai_and_is_refused_elsewhere(
    client: openai.OpenAI, api: httpx.Client, received: list[Received]
) -> None:
    client.chat.completions.create(model="oa/gpt-5", messages=MESSAGES, verbosity="low")
    assert received[0].json()["verbosity"] == "low"
    r = api.post("/v1/chat/completions", json={"model": "hosted/x", "messages": MESSAGES, "verbosity": "low"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "verbosity", r.text
    assert len(received) == 1


def test_reasoning_effort_refused_by_name_where_it_has_no_place(api: httpx.Client, received: list[Received]) -> None:
    for path, body in (
        ("/v1/chat/completions", {"model": "mis/magistral-medium-latest", "messages": MESSAGES}),
        ("/v1/completions", {"model": "oa/gpt-3.5-turbo-instruct", "prompt": "hi"}),
    ):
        r = api.post(path, json={**body, "reasoning_effort": "low"})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "reasoning_effort" and error["code"] == "unsupported_parameter", error
    bad = api.post("/v1/chat/completions", json={"model": "oa/o4-mini", "messages": MESSAGES, "reasoning_effort": 3})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort", bad.text
    assert received == []


def test_reasoning_effort_is_anthropics_effort(
    client: openai.OpenAI, api: httpx.Client, received: list[Received]
) -> None:
    """Anthropic names the same levels `output_config.effort`; OpenAI's `none` and `minimal` have none there."""
    client.chat.completions.create(model="claude/claude-opus-4-5", messages=MESSAGES, reasoning_effort="medium")
    client.completions.create(model="claude/claude-opus-4-5", prompt="hi", extra_body={"reasoning_effort": "high"})
    assert [r.json()["output_config"] for r in received] == [{"effort": "medium"}, {"effort": "high"}]
    assert all("reasoning_effort" not in r.json() for r in received)
    for effort in ("none", "minimal"):
        body = {"model": "claude/claude-opus-4-5", "messages": MESSAGES, "reasoning_effort": effort}
        r = api.post("/v1/chat/completions", json=body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (error["param"], error["code"]) == ("reasoning_effort", "unsupported_parameter"), error
        assert effort in error["message"]
    assert len(received) == 2


def test_anthropics_effort_sits_beside_what_extras_put_in_output_config(
    client: openai.OpenAI, api: httpx.Client, received: list[Received]
) -> None:
    """The extras extend `output_config` rather than replace it; both setting the effort is a 400."""
    fmt = {"type": "json_schema", "schema": {"type": "object"}}
    client.chat.completions.create(
        model="claude/claude-opus-4-5",
        messages=MESSAGES,
        reasoning_effort="low",
        extra_body={"inference_extra_params": {"output_config": {"format": fmt}}},
    )
    assert received[0].json()["output_config"] == {"effort": "low", "format": fmt}
    both = {
        "model": "claude/claude-opus-4-5",
        "messages": MESSAGES,
        "reasoning_effort": "low",
        "inference_extra_params": {"output_config": {"effort": "max"}},
    }
    r = api.post("/v1/chat/completions", json=both)
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == ("reasoning_effort", "invalid_value")
    alone = {k: v for k, v in both.items() if k != "reasoning_effort"}
    assert api.post("/v1/chat/completions", json=alone).status_code == 200
    assert [r.json()["output_config"] for r in received] == [{"effort": "low", "format": fmt}, {"effort": "max"}]


@pytest.mark.parametrize(
    ("model", "effort", "config"),
    [
        ("gem/gemini-2.5-pro", "high", {"thinkingBudget": 24576}),
        ("gem/gemini-3-pro-preview", "low", {"thinkingLevel": "low"}),
    ],
)
def test_reasoning_effort_reaches_gemini_as_its_thinking_config(
    client: openai.OpenAI, received: list[Received], model: str, effort: Any, config: dict[str, Any]
) -> None:
    answer = client.chat.completions.create(model=model, messages=MESSAGES, reasoning_effort=effort)
    assert answer.choices[0].message.content
    (sent,) = received
    assert sent.json()["generationConfig"] == {"thinkingConfig": config}
    assert "reasoning_effort" not in sent.json()


def test_gemini_refuses_an_effort_google_documents_no_mapping_for(api: httpx.Client, received: list[Received]) -> None:
    body = {"model": "gem/gemini-2.5-pro", "messages": MESSAGES, "reasoning_effort": "none"}
    r = api.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json() == {
        "error": {
            "message": "Provider 'gem' cannot take reasoning_effort 'none' for model 'gemini-2.5-pro': Gemini 2.5 "
            "Pro cannot turn thinking off (Google's mapping: ai.google.dev/gemini-api/docs/openai#thinking)",
            "type": "invalid_request_error",
            "param": "reasoning_effort",
            "code": "unsupported_parameter",
        }
    }
    assert received == []


def test_each_effort_is_its_own_cache_entry(client: openai.OpenAI, received: list[Received]) -> None:
    for effort in ("low", "high", "low", "high"):
        client.chat.completions.create(model="cached", messages=MESSAGES, reasoning_effort=effort)
    assert [r.json()["reasoning_effort"] for r in received] == ["low", "high"]


def test_a_chat_templates_variables_reach_the_servers_that_render_one(
    client: openai.OpenAI, api: httpx.Client, received: list[Received]
) -> None:
    # Qwen3's switch, as vLLM's and llama-server's docs send it; each value its own cache entry.
    for value in (False, True, False):
        extra = {"chat_template_kwargs": {"enable_thinking": value}}
        client.chat.completions.create(model="cached", messages=MESSAGES, extra_body=extra)
    assert [r.json()["chat_template_kwargs"] for r in received] == [
        {"enable_thinking": False},
        {"enable_thinking": True},
    ]
    received.clear()
    for model in ("local/qwen3", "oa/gpt-4o-mini"):  # Ollama and OpenAI render no template of the client's
        r = api.post(
            "/v1/chat/completions",
            json={"model": model, "messages": MESSAGES, "chat_template_kwargs": {"enable_thinking": False}},
        )
        assert r.status_code == 400, r.text
        assert (r.json()["error"]["param"], r.json()["error"]["code"]) == (
            "chat_template_kwargs",
            "unsupported_parameter",
        )
    assert received == []


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("chat_template_kwargs", {"chat_template": "{{ x }}"}, "chat_template_kwargs.chat_template"),
        ("inference_extra_params", {"chat_template": "{{ x }}"}, "inference_extra_params"),
        ("inference_extra_params", {"template": '{{ printf "%0999999999d" 0 }}'}, "inference_extra_params"),
        (
            "inference_extra_params",
            {"chat_template_kwargs": {"enable_thinking": False, "chat_template": "{{ x }}"}},
            "inference_extra_params.chat_template_kwargs.chat_template",
        ),
    ],
)
def test_no_client_sends_a_chat_template(
    api: httpx.Client, received: list[Received], field: str, value: Any, param: str
) -> None:
    # A Jinja template from a request can keep a shared server's CPU busy as long as it likes (CVE-2025-61620):
    # neither as the field nor inside the template's variables, on chat or on completions.
    for path, body in (
        ("/v1/chat/completions", {"model": "hosted/qwen3", "messages": MESSAGES}),
        ("/v1/completions", {"model": "hosted/qwen3", "prompt": "hi"}),
    ):
        r = api.post(path, json={**body, field: value})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (error["param"], error["type"]) == (param, "invalid_request_error"), error
        assert "template" in error["message"]
    assert received == []


def test_anthropic_thinking_as_reasoning_content(client: openai.OpenAI, received: list[Received]) -> None:
    thinking = {"thinking": {"type": "enabled", "budget_tokens": 1024}}
    recorded = fixture_json("anthropic/messages_thinking.json")["content"]
    answer = client.chat.completions.create(
        model="claude/claude-sonnet-4-5",
        messages=MESSAGES,
        max_tokens=4096,
        extra_body={"inference_extra_params": thinking},
    )
    message = answer.choices[0].message
    assert message.content == recorded[1]["text"]
    assert message.model_extra is not None and message.model_extra["reasoning_content"] == recorded[0]["thinking"]
    assert received[0].json()["thinking"] == thinking["thinking"]
    stream = client.chat.completions.create(
        model="claude/claude-sonnet-4-5",
        messages=MESSAGES,
        max_tokens=4096,
        stream=True,
        extra_body={"inference_extra_params": thinking},
    )
    reasoning, content = "", ""
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            content += delta.content or ""
    assert reasoning.startswith("This is a straightforward question about pedestrian safety.")
    assert content.startswith("Here are the basic steps for safely crossing the street")


def test_mistral_thinking_chunks_as_reasoning_content(client: openai.OpenAI) -> None:
    # Magistral's content is chunks, not a string: the answer still decodes, thinking apart from text.
    answer = client.chat.completions.create(model="mis/magistral-medium-latest", messages=MESSAGES)
    message = answer.choices[0].message
    assert message.content is not None and message.content.startswith("Crossing a river is quite different")
    assert (message.model_extra or {})["reasoning_content"].startswith("**Analogizing crossing a river**")
    stream = client.chat.completions.create(model="mis/magistral-medium-latest", messages=MESSAGES, stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert reasoning.startswith("Okay, the user is asking how to cross the street.")
    assert "".join(d.content or "" for d in deltas).startswith("To cross the street safely")


def test_gemini_thought_summaries_as_reasoning_content(api: httpx.Client, received: list[Received]) -> None:
    extra = {"generationConfig": {"thinkingConfig": {"includeThoughts": True}}}
    body = {"model": "gem/gemini-2.5-pro", "messages": MESSAGES, "inference_extra_params": extra}
    with api.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(line) for line in lines if line != "[DONE]"]
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in chunks if c["choices"])
    assert reasoning.startswith("**Clarifying User Goals**")
    assert received[0].json()["generationConfig"]["thinkingConfig"] == {"includeThoughts": True}


def _loop(client: openai.OpenAI, model: str) -> None:
    """Two turns of the agent loop: the answer's message object appended as it came, then the tool's result."""
    answer = client.chat.completions.create(model=model, messages=QUESTION, tools=TOOLS)
    message = answer.choices[0].message
    assert message.tool_calls and (message.model_extra or {}).get("reasoning_content")
    call = message.tool_calls[0]
    client.chat.completions.create(
        model=model,
        messages=[*QUESTION, message, {"role": "tool", "tool_call_id": call.id, "content": "{}"}],  # type: ignore[list-item]
        tools=TOOLS,
    )


def test_deepseek_gets_the_reasoning_of_a_turn_that_called_tools_back(
    client: openai.OpenAI, received: list[Received]
) -> None:
    recorded = fixture_json("deepseek/chat_thinking_tool_calls.json")["choices"][0]["message"]
    _loop(client, "ds/deepseek-reasoner")
    sent = received[1].json()["messages"][1]
    # As pydantic-ai's recorded second request sends it: the turn whole, its reasoning_content included.
    assert sent == {
        "role": "assistant",
        "content": recorded["content"],
        "reasoning_content": recorded["reasoning_content"],
        "tool_calls": [{"id": c["id"], "type": "function", "function": c["function"]} for c in recorded["tool_calls"]],
    }


def test_fireworks_gets_it_as_reasoning_content(client: openai.OpenAI, received: list[Received]) -> None:
    recorded = fixture_json("deepseek/chat_thinking_tool_calls.json")["choices"][0]["message"]
    _loop(client, f"fw/{TOOL_THINKER}")
    assert received[1].path == "/fw/v1/chat/completions"
    turn = received[1].json()["messages"][1]
    assert turn["reasoning_content"] == recorded["reasoning_content"] and "reasoning" not in turn


def test_mistral_gets_it_as_a_thinking_chunk_at_the_head_of_the_turn(
    client: openai.OpenAI, received: list[Received]
) -> None:
    # The two turns of pydantic-ai's recording: Mistral answered its second request, whose assistant turn carries
    # the first answer's thinking as a `thinking` chunk of text chunks before a `text` chunk.
    recorded = fixture_json("mistral/chat_magistral_thinking_request.json")["messages"]
    model = "mis/magistral-medium-latest"
    message = client.chat.completions.create(model=model, messages=recorded[:1]).choices[0].message
    reasoning = (message.model_extra or {})["reasoning_content"]
    client.chat.completions.create(model=model, messages=[recorded[0], message, recorded[2]])  # type: ignore[list-item]
    assert received[1].path == "/mistral/v1/chat/completions"
    sent = received[1].json()["messages"]
    assert sent[0] == recorded[0] and sent[2] == recorded[2]
    assert sent[1] == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": [{"type": "text", "text": reasoning}]},
            {"type": "text", "text": message.content},
        ],
    }

    def shape(chunk: dict[str, Any]) -> tuple[object, ...]:
        return chunk["type"], sorted(chunk), {tuple(sorted(t)) for t in chunk.get("thinking", ())}

    assert [shape(c) for c in sent[1]["content"]] == [shape(c) for c in recorded[1]["content"]]


@pytest.mark.parametrize("provider", ["hosted", "local"])
def test_vllm_and_ollama_get_it_as_reasoning_and_a_strict_server_not_at_all(
    client: openai.OpenAI, received: list[Received], provider: str
) -> None:
    recorded = fixture_json("deepseek/chat_thinking_tool_calls.json")["choices"][0]["message"]
    _loop(client, f"{provider}/{TOOL_THINKER}")
    turn = received[1].json()["messages"][1]
    assert received[1].path == "/v1/chat/completions"
    assert turn["reasoning"] == recorded["reasoning_content"] and "reasoning_content" not in turn
    received.clear()
    _loop(client, f"oa/{TOOL_THINKER}")
    turn = received[1].json()["messages"][1]
    assert turn["role"] == "assistant" and turn["tool_calls"]
    assert "reasoning_content" not in turn and "reasoning" not in turn and "thinking_blocks" not in turn


def test_anthropics_signed_thinking_comes_back_first_in_its_turn(
    client: openai.OpenAI, received: list[Received]
) -> None:
    recorded = fixture_json("anthropic/messages_thinking.json")["content"]
    answer = client.chat.completions.create(
        model="claude/claude-sonnet-4-5",
        messages=QUESTION,
        max_tokens=4096,
        extra_body={"inference_extra_params": THINKING},
    )
    message = answer.choices[0].message
    assert (message.model_extra or {})["thinking_blocks"] == [recorded[0]]
    client.chat.completions.create(
        model="claude/claude-sonnet-4-5",
        messages=[*QUESTION, message, {"role": "user", "content": "And 5?"}],  # type: ignore[list-item]
        max_tokens=4096,
        extra_body={"inference_extra_params": THINKING},
    )
    turn = received[1].json()["messages"][1]
    assert turn == {"role": "assistant", "content": [recorded[0], {"type": "text", "text": recorded[1]["text"]}]}


def test_a_stream_gives_each_signed_block_whole_and_a_replay_gives_it_again(
    client: openai.OpenAI, received: list[Received]
) -> None:
    def streamed() -> tuple[str, list[Any]]:
        reasoning = ""
        blocks: list[Any] = []
        stream = client.chat.completions.create(
            model="cached-claude",
            messages=QUESTION,
            max_tokens=4096,
            stream=True,
            extra_body={"inference_extra_params": THINKING},
        )
        for chunk in stream:
            extra = chunk.choices[0].delta.model_extra or {} if chunk.choices else {}
            reasoning += extra.get("reasoning_content") or ""
            blocks += extra.get("thinking_blocks") or []
        return reasoning, blocks

    reasoning, blocks = streamed()
    assert len(blocks) == 1 and blocks[0]["type"] == "thinking" and blocks[0]["thinking"] == reasoning
    assert blocks[0]["signature"].startswith("EvMCCkYICxgC") and reasoning.startswith("This is a straightforward")
    assert streamed() == (reasoning, blocks)  # the cache's replay of the stored answer
    assert len(received) == 1


def test_thinking_blocks_are_checked_like_every_other_field(api: httpx.Client, received: list[Received]) -> None:
    for bad, param in (
        ({"type": "thinking", "signature": "s"}, "messages.thinking_blocks.thinking"),
        ({"type": "summary", "text": "x"}, "messages.thinking_blocks.type"),
        ({"type": "redacted_thinking", "data": 3}, "messages.thinking_blocks.data"),
    ):
        turn = {"role": "assistant", "content": "4", "thinking_blocks": [bad]}
        body = {"model": "claude/claude-sonnet-4-5", "messages": [*QUESTION, turn, *QUESTION]}
        r = api.post("/v1/chat/completions", json=body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param, r.json()
    reasoning = {"role": "assistant", "content": "4", "reasoning_content": ["not", "text"]}
    r = api.post("/v1/chat/completions", json={"model": "ds/x", "messages": [*QUESTION, reasoning, *QUESTION]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.reasoning_content", r.text
    assert received == []
