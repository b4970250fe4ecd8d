"""A model's thinking sent back in the next turn, with the official `openai` SDK over real sockets.

The usual agent loop appends the answer's message object to the conversation (`messages.append(
answer.choices[0].message)`), and the SDK sends every field the answer had, `reasoning_content` and
`thinking_blocks` included. The gateway takes them, gives DeepSeek, SGLang and llama.cpp `reasoning_content`
and vLLM `reasoning` (DeepSeek refuses a turn that called tools without it), gives Anthropic its signed
thinking blocks back at the head of their turn, and leaves both out for a strict server (OpenAI's). The
upstreams replay recordings (tests/fixtures/SOURCES.md).
"""

from __future__ import annotations

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

KEY = "gk-think-back-7d1e"
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
CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
unsupported_params: error
timeouts: {{connect_ms: 2000, first_byte_ms: 10000, total_ms: 20000}}
retries: {{attempts: 1}}
keys:
  - {{name: thinker, key: "${{THINK_KEY}}"}}
providers:
  ds: {{kind: deepseek, base_url: {u}/ds, api_key: sk-ds}}
  oa: {{kind: openai, base_url: {u}/oa, api_key: sk-oa}}
  hosted: {{kind: vllm, base_url: {u}/vllm}}
  claude: {{kind: anthropic, base_url: {u}/claude, api_key: sk-ant}}
models:
  - name: cached-claude
    targets: [{{model: claude/claude-sonnet-4-5}}]
    cache: {{mode: always}}
"""


def _events(raw: bytes) -> list[bytes]:
    return [e.strip() for e in raw.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]


async def _handler(request: web.Request, received: Received) -> web.StreamResponse:
    if received.path == "/claude/v1/messages":
        if not received.json().get("stream"):
            body = fixture_bytes("anthropic/messages_thinking.json")
            return web.Response(body=body, content_type="application/json")
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for event in _events(fixture_bytes("anthropic/messages_stream_thinking.sse.txt")):
            await resp.write(event + b"\n\n")
        await resp.write_eof()
        return resp
    body = fixture_bytes("deepseek/chat_thinking_tool_calls.json")
    return web.Response(body=body, content_type="application/json")


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        server.handler = _handler
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    folder: Path = tmp_path_factory.mktemp("think-back")
    with serve_config(folder, CONFIG.format(u=upstream.url), {"THINK_KEY": KEY}) as gw:
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


def test_vllm_gets_it_as_reasoning_and_a_strict_server_not_at_all(
    client: openai.OpenAI, received: list[Received]
) -> None:
    recorded = fixture_json("deepseek/chat_thinking_tool_calls.json")["choices"][0]["message"]
    _loop(client, "hosted/qwen3")
    turn = received[1].json()["messages"][1]
    assert turn["reasoning"] == recorded["reasoning_content"] and "reasoning_content" not in turn
    received.clear()
    _loop(client, "oa/o4-mini")
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
