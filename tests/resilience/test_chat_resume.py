"""`resume_streams` on chat, over real sockets: a chat stream that breaks mid-way continues on a target whose
chat route can continue the assistant message (vLLM's and SGLang's `continue_final_message`, Anthropic's
prefill), and the client sees one stream; where no target can (or the stream was making tool calls or
streaming the model's thinking), it ends with the break's error event and `[DONE]`.

The gateway runs under uvicorn (tests/helpers/servers.py); the upstreams are one loopback server whose
paths play each provider. The vLLM-shaped chunks follow vLLM's chat stream (a role chunk with empty
content, one content chunk per token, the finish chunk, the usage chunk), Anthropic's events its
recordings (tests/fixtures/anthropic/messages_stream.sse.txt).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.e2e.test_observability import metric
from tests.helpers.chat_scripts import (
    Behave,
    Script,
    anthropic_stream,
    delta_event,
    scripted,
    vllm_stream,
)
from tests.helpers.clients import sse_data
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
unsupported_params: error
retries: {{attempts: 3, same_target: 0}}
timeouts: {{connect_ms: 2000, first_byte_ms: 5000, total_ms: 20000}}
caps: {{emulated_answer_bytes: 1024}}
providers:
  alpha: {{kind: vllm, base_url: {u}/alpha/v1}}
  beta: {{kind: vllm, base_url: {u}/beta/v1}}
  claude: {{kind: anthropic, base_url: {u}/claude, api_key: sk-ant, default_max_tokens: 64}}
  oa: {{kind: openai, base_url: {u}/oa/v1, api_key: sk-oa}}
  gamma: {{kind: sglang, base_url: {u}/gamma/v1}}
models:
  - name: smart
    strategy: ordered
    targets: [{{model: alpha/m}}, {{model: beta/m}}]
    resume_streams: true
  - name: to-claude
    strategy: ordered
    targets: [{{model: alpha/m}}, {{model: claude/claude-sonnet}}]
    resume_streams: true
  - name: to-openai
    strategy: ordered
    targets: [{{model: alpha/m}}, {{model: oa/gpt-4o-mini}}]
    resume_streams: true
  - name: from-openai
    strategy: ordered
    targets: [{{model: oa/gpt-4o-mini}}, {{model: beta/m}}]
    resume_streams: true
  - name: from-claude
    strategy: ordered
    targets: [{{model: claude/claude-sonnet}}, {{model: beta/m}}]
    resume_streams: true
  - name: past-openai
    strategy: ordered
    targets: [{{model: alpha/m}}, {{model: oa/gpt-4o-mini}}, {{model: gamma/m}}]
    resume_streams: true
"""
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
PIECES = ["The", " capital", " of", " France", " is", " Paris", "."]


def _vllm_error(pieces: list[str], error: dict[str, Any]) -> Behave:
    """A vLLM chat stream of `pieces`, then an error event in vLLM's `ErrorResponse` shape, then [DONE]."""

    async def behave(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        events = [delta_event({"role": "assistant", "content": ""})] + [delta_event({"content": p}) for p in pieces]
        events += [b"data: " + json.dumps(error).encode(), b"data: [DONE]"]
        for e in events:
            await resp.write(e + b"\n\n")
        await resp.write_eof()
        return resp

    return behave


def _tool_call_then_cut() -> Behave:
    async def behave(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"ci'}}
        for e in (delta_event({"role": "assistant", "content": ""}), delta_event({"tool_calls": [call]})):
            await resp.write(e + b"\n\n")
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()
        await asyncio.sleep(5)
        return resp

    return behave


def _cut(events: list[bytes]) -> Behave:
    """A stream of `events`, then its connection reset (no finish)."""

    async def behave(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for e in events:
            await resp.write(e + b"\n\n")
        await asyncio.sleep(0.05)  # the events reach the gateway before the reset
        assert request.transport is not None
        request.transport.abort()
        await asyncio.sleep(5)
        return resp

    return behave


def _anthropic_event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}".encode()


def _anthropic_start() -> list[bytes]:
    start: dict[str, Any] = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    start |= {"model": "claude-sonnet", "usage": {"input_tokens": 30, "output_tokens": 1}}
    return [_anthropic_event("message_start", {"type": "message_start", "message": start})]


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("chat-resume"), CONFIG.format(u=upstream.url), {}) as gw:
        yield gw


@pytest.fixture
def script(upstream: Upstream, gateway: GatewayThread) -> Script:
    return scripted(upstream, gateway)


def _stream(gateway: GatewayThread, model: str, **extra: Any) -> list[str]:
    body = {"model": model, "messages": MESSAGES, "stream": True, **extra}
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as http:
        resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    return sse_data(resp.text)


def _content(chunks: list[dict[str, Any]]) -> str:
    return "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])


def test_a_broken_chat_stream_continues_the_assistant_message(gateway: GatewayThread, script: Script) -> None:
    script.behaviours["alpha"] = vllm_stream(PIECES[:3], usage=None, cut=True)
    script.behaviours["beta"] = vllm_stream(PIECES[3:], usage=(23, 4))
    before = _cooldowns(gateway)
    data = _stream(gateway, "smart", max_tokens=20, stream_options={"include_usage": True})
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all("error" not in c for c in chunks)
    # One stream: one id, one role chunk, the whole text, one finish, then the usage.
    assert len({c["id"] for c in chunks}) == 1
    roles = [ch for c in chunks for ch in c["choices"] if ch["delta"].get("role")]
    assert len(roles) == 1 and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert _content(chunks) == "".join(PIECES)
    assert [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]] == ["stop"]
    # The continuation's prompt held the three tokens streamed before the break: counted as output.
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27}
    # beta was asked to continue the assistant message, with what is left of the limit.
    (sent,) = script.received["beta"]
    first = script.received["alpha"][0].json()
    assert sent.json() == {
        **first,
        "messages": [*MESSAGES, {"role": "assistant", "content": "".join(PIECES[:3])}],
        "max_tokens": 17,
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
    assert "continue_final_message" not in first
    # The broken target failed once: cooled once, and beta, which served, not at all.
    after = _cooldowns(gateway)
    assert (after[0] - before[0], after[1] - before[1]) == (1, 0)


TOO_LONG_MESSAGE = "This model's maximum context length is 4096 tokens. However, you requested 4100 tokens."
TOO_LONG = {
    "object": "error",
    "message": TOO_LONG_MESSAGE,
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}
OVERLOADED = {"object": "error", "message": "The engine is overloaded", "type": "ServiceUnavailableError", "code": 503}


def test_an_error_event_that_refuses_the_request_ends_the_stream(gateway: GatewayThread, script: Script) -> None:
    """Its continuation would be refused too: the error is relayed and counted once, as the 400 it is."""
    script.behaviours["alpha"] = _vllm_error(PIECES[:3], TOO_LONG)
    script.behaviours["beta"] = vllm_stream(PIECES[3:], usage=None)
    before = _failures(gateway)
    data = _stream(gateway, "smart", max_tokens=20)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert _content(chunks[:-1]) == "".join(PIECES[:3])
    assert chunks[-1]["error"] == {
        "message": "upstream error (400): " + TOO_LONG_MESSAGE,
        "type": "invalid_request_error",
        "param": None,
        "code": "context_length_exceeded",
    }
    assert "beta" not in script.received
    assert _failures(gateway) - before == 1


def test_an_error_event_of_an_overloaded_upstream_is_resumed(gateway: GatewayThread, script: Script) -> None:
    script.behaviours["alpha"] = _vllm_error(PIECES[:3], OVERLOADED)
    script.behaviours["beta"] = vllm_stream(PIECES[3:], usage=None)
    data = _stream(gateway, "smart", max_tokens=20)
    chunks = [json.loads(d) for d in data[:-1]]
    assert all("error" not in c for c in chunks), chunks
    assert _content(chunks) == "".join(PIECES)
    assert script.received["beta"][0].json()["max_tokens"] == 17


def _failures(gateway: GatewayThread) -> float:
    """`gateway_upstream_failures_total` of alpha's refusals, once the request's record is written."""
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as http:
        text = http.get("/metrics").text
    return metric(text, "gateway_upstream_failures_total", target="alpha/m", cause="http_400")


def _cooldowns(gateway: GatewayThread) -> tuple[float, float]:
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as http:
        text = http.get("/metrics").text
    return tuple(metric(text, "gateway_cooldowns_total", target=t, cause="error") for t in ("alpha/m", "beta/m"))  # type: ignore[return-value]


def test_anthropic_continues_as_a_prefill_without_trailing_white_space(gateway: GatewayThread, script: Script) -> None:
    script.behaviours["alpha"] = vllm_stream(["The capital of France", " is "], usage=None, cut=True)
    script.behaviours["claude"] = anthropic_stream([" Paris", "."])
    data = _stream(gateway, "to-claude")
    chunks = [json.loads(d) for d in data[:-1]]
    assert all("error" not in c for c in chunks), chunks
    # The white space Anthropic would refuse at the end of the prefill is not sent, nor repeated.
    assert _content(chunks) == "The capital of France is Paris."
    (sent,) = script.received["claude"]
    body = sent.json()
    assert sent.path == "/claude/v1/messages"
    assert body["messages"][-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "The capital of France is"}],
    }
    assert body["max_tokens"] == 64  # the request set no limit: the provider's own


@pytest.mark.parametrize("kind", ["enabled", "adaptive"])
def test_anthropic_thinking_takes_no_prefill_so_it_is_not_asked_to_continue(
    gateway: GatewayThread, script: Script, kind: str
) -> None:
    script.behaviours["alpha"] = vllm_stream(PIECES[:2], usage=None, cut=True)
    script.behaviours["claude"] = anthropic_stream([" Paris", "."])
    thinking = {"type": kind, "budget_tokens": 1024} if kind == "enabled" else {"type": kind}
    data = _stream(gateway, "to-claude", inference_extra_params={"thinking": thinking})
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert _content(chunks[:-1]) == "".join(PIECES[:2])
    assert chunks[-1]["error"]["code"] == "upstream_truncated_response"
    assert "claude" not in script.received  # Anthropic refuses a prefill while thinking: never asked
    # Thinking switched off is no obstacle: the same stream continues there.
    script.received.clear()
    gateway.pipeline.health.reset()  # alpha's dropped connection cooled it
    data = _stream(gateway, "to-claude", inference_extra_params={"thinking": {"type": "disabled"}})
    assert _content([json.loads(d) for d in data[:-1]]) == "The capital Paris."
    assert len(script.received["claude"]) == 1


def test_no_target_that_can_continue_is_a_clean_error(gateway: GatewayThread, script: Script) -> None:
    script.behaviours["alpha"] = vllm_stream(PIECES[:2], usage=None, cut=True)
    data = _stream(gateway, "to-openai")
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert _content(chunks[:-1]) == "".join(PIECES[:2])
    assert chunks[-1]["error"]["code"] == "upstream_truncated_response"
    assert "oa" not in script.received  # OpenAI cannot continue a message: never asked


def test_a_broken_tool_call_stream_is_not_resumed(gateway: GatewayThread, script: Script) -> None:
    script.behaviours["alpha"] = _tool_call_then_cut()
    script.behaviours["beta"] = vllm_stream(PIECES, usage=None)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    data = _stream(gateway, "smart", tools=tools)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[-1]["error"]["code"] == "upstream_truncated_response"
    assert chunks[-2]["choices"][0]["delta"]["tool_calls"][0]["id"] == "call_1"
    assert "beta" not in script.received


def test_a_stream_asking_for_token_ids_is_not_resumed(gateway: GatewayThread, script: Script) -> None:
    """Its ids after the break would be sampled given the text re-tokenized, not the tokens the client holds."""
    script.behaviours["alpha"] = vllm_stream(PIECES[:3], usage=None, cut=True)
    script.behaviours["beta"] = vllm_stream(PIECES[3:], usage=None)
    data = _stream(gateway, "smart", max_tokens=20, return_token_ids=True)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert _content(chunks[:-1]) == "".join(PIECES[:3])
    assert chunks[-1]["error"]["code"] == "upstream_truncated_response"
    assert script.received["alpha"][0].json()["return_token_ids"] is True
    assert "beta" not in script.received
    # Without it, the same break is resumed (alpha's cooldown from the first break lifted).
    gateway.pipeline.health.reset()
    script.behaviours["alpha"] = vllm_stream(PIECES[:3], usage=None, cut=True)
    assert _content([json.loads(d) for d in _stream(gateway, "smart", max_tokens=20)[:-1]]) == "".join(PIECES)


def test_the_continuation_skips_targets_that_cannot_continue(gateway: GatewayThread, script: Script) -> None:
    """OpenAI is next in the alias's order, but cannot continue a message: SGLang, after it, does."""
    script.behaviours["alpha"] = vllm_stream(PIECES[:4], usage=None, cut=True)
    script.behaviours["gamma"] = vllm_stream(PIECES[4:], usage=None)
    data = _stream(gateway, "past-openai", max_tokens=10)
    chunks = [json.loads(d) for d in data[:-1]]
    assert all("error" not in c for c in chunks), chunks
    assert _content(chunks) == "".join(PIECES)
    assert "oa" not in script.received
    (sent,) = script.received["gamma"]
    body = sent.json()
    assert body["messages"][-1] == {"role": "assistant", "content": "".join(PIECES[:4])}
    assert body["continue_final_message"] is True and "add_generation_prompt" not in body
    assert body["max_tokens"] == 6


def test_the_tokens_a_stop_held_back_count_in_the_continuations_limit(gateway: GatewayThread, script: Script) -> None:
    """OpenAI takes four stops: the gateway enforces the fifth, holding " Paris" back (it may begin " Paris,
    Texas") until "." shows it does not, and sends both in one chunk. Seven tokens, six content chunks."""
    stops = ["Q:", "A:", "###", "END", " Paris, Texas"]
    script.behaviours["oa"] = vllm_stream(PIECES, usage=None, cut=True)
    script.behaviours["beta"] = vllm_stream([" It", " is", " big", "."], usage=None)
    data = _stream(gateway, "from-openai", max_tokens=20, stop=stops)
    chunks = [json.loads(d) for d in data[:-1]]
    assert all("error" not in c for c in chunks), chunks
    assert _content(chunks) == "The capital of France is Paris. It is big."
    (sent,) = script.received["oa"]
    assert sent.json()["stop"] == stops[:4]
    (cont,) = script.received["beta"]
    body = cont.json()
    assert body["messages"][-1] == {"role": "assistant", "content": "".join(PIECES)}
    assert body["max_tokens"] == 20 - len(PIECES)


def test_a_stream_longer_than_a_continuation_may_carry_is_not_resumed(gateway: GatewayThread, script: Script) -> None:
    """The text a continuation would carry back upstream is bounded (`caps.emulated_answer_bytes`, 1024 here)."""
    long = ["x" * 40] * 30
    script.behaviours["alpha"] = vllm_stream(long, usage=None, cut=True)
    script.behaviours["beta"] = vllm_stream(PIECES, usage=None)
    data = _stream(gateway, "smart")
    chunks = [json.loads(d) for d in data[:-1]]
    assert _content(chunks[:-1]) == "".join(long)
    assert chunks[-1]["error"]["code"] == "upstream_truncated_response"
    assert "beta" not in script.received


THOUGHT = ["Let", " me", " think", ":", " France", "'s", " capital", " is", " Paris"]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_a_broken_reasoning_stream_is_not_resumed(gateway: GatewayThread, script: Script, field: str) -> None:
    """The thinking the client has cannot be carried back exactly (a continuation would continue an answer
    without it, with the whole limit): the stream ends at its break, the thinking relayed once."""
    role = delta_event({"role": "assistant", "content": ""})
    script.behaviours["alpha"] = _cut([role] + [delta_event({field: p}) for p in THOUGHT])
    script.behaviours["beta"] = vllm_stream(PIECES, usage=None)
    data = _stream(gateway, "smart", max_tokens=12)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert "".join(ch["delta"].get("reasoning_content") or "" for c in chunks[:-1] for ch in c["choices"]) == "".join(
        THOUGHT
    )
    assert _content(chunks[:-1]) == ""
    assert chunks[-1]["error"]["code"] == "upstream_truncated_response"
    assert "beta" not in script.received
    # A stream that thinks nothing is resumed as before, its field empty or null beside the content as some
    # servers send it (alpha's cooldown from the break lifted).
    gateway.pipeline.health.reset()
    role = delta_event({"role": "assistant", "content": "", field: ""})
    script.behaviours["alpha"] = _cut([role] + [delta_event({"content": p, field: None}) for p in PIECES[:3]])
    script.behaviours["beta"] = vllm_stream(PIECES[3:], usage=None)
    assert _content([json.loads(d) for d in _stream(gateway, "smart", max_tokens=12)[:-1]]) == "".join(PIECES)
    assert script.received["beta"][0].json()["max_tokens"] == 9


@pytest.mark.parametrize("block", ["thinking", "redacted_thinking"])
def test_a_broken_anthropic_thinking_stream_is_not_resumed(gateway: GatewayThread, script: Script, block: str) -> None:
    """Anthropic's thinking reaches the client as `reasoning_content` deltas (a redacted block as its
    `thinking_blocks`): a stream cut in it ends there, not continued on vLLM from an empty message."""
    events = _anthropic_start()
    if block == "thinking":
        start = {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}
        events.append(_anthropic_event("content_block_start", start))
        for p in THOUGHT:
            delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": p}}
            events.append(_anthropic_event("content_block_delta", delta))
    else:
        start = {"type": "content_block_start", "index": 0, "content_block": {"type": block, "data": "EqQBCgIYAhIM"}}
        events.append(_anthropic_event("content_block_start", start))
    script.behaviours["claude"] = _cut(events)
    script.behaviours["beta"] = vllm_stream(PIECES, usage=None)
    thinking = {"type": "enabled", "budget_tokens": 1024}
    data = _stream(gateway, "from-claude", max_tokens=2048, inference_extra_params={"thinking": thinking})
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    deltas = [ch["delta"] for c in chunks[:-1] for ch in c["choices"]]
    if block == "thinking":
        assert "".join(d.get("reasoning_content") or "" for d in deltas) == "".join(THOUGHT)
    else:
        assert [b for d in deltas for b in d.get("thinking_blocks") or ()] == [
            {"type": "redacted_thinking", "data": "EqQBCgIYAhIM"}
        ]
    assert _content(chunks[:-1]) == ""
    assert chunks[-1]["error"]["code"] == "upstream_truncated_response"
    assert "beta" not in script.received


def test_a_stream_is_resumed_at_most_retries_attempts_times(gateway: GatewayThread, script: Script) -> None:
    """Targets that each stream a token and then fail are not bounced between until the deadline: a chat
    stream without `max_tokens` has no token count to run out, so it is continued at most `retries.attempts`
    times (3 here), and then ends with the last break's error event, every call counted in its attempts."""
    script.behaviours["alpha"] = _vllm_error(["The"], OVERLOADED)
    script.behaviours["beta"] = _vllm_error([" capital"], OVERLOADED)
    data = _stream(gateway, "smart")
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert _content(chunks[:-1]) == "The capitalThe capital"
    assert chunks[-1]["error"]["code"] == "upstream_http_503", chunks[-1]
    calls = len(script.received.get("alpha", [])) + len(script.received.get("beta", []))
    assert calls == 4, calls  # the request's call and three continuations
