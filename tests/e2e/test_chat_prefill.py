"""Assistant prefill on /v1/chat/completions through the official openai client: a conversation ending with an
assistant message and `continue_final_message: true` is continued, not answered, on the routes that can
(vLLM's, SGLang's and llama-server's `continue_final_message`, Anthropic's prefill), refused by name
elsewhere, and a broken stream of such a request is resumed by extending the same message.

The gateway runs under uvicorn; the upstreams are one loopback server whose paths play each provider. The
vLLM answer follows vLLM's `ChatCompletionResponse`, the streams those of tests/resilience/test_chat_resume.py,
the Anthropic answer its recording (tests/fixtures/anthropic/messages_end_turn.json)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from tests.helpers.chat_scripts import Script, anthropic_stream, scripted, vllm_stream
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream

FIXTURES = Path(__file__).parents[1] / "fixtures" / "anthropic"
CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
unsupported_params: error
retries: {{attempts: 3, same_target: 0}}
timeouts: {{connect_ms: 2000, first_byte_ms: 5000, total_ms: 20000}}
providers:
  alpha: {{kind: vllm, base_url: {u}/alpha/v1}}
  beta: {{kind: vllm, base_url: {u}/beta/v1}}
  gamma: {{kind: sglang, base_url: {u}/gamma/v1}}
  delta: {{kind: llamacpp, base_url: {u}/delta}}
  claude: {{kind: anthropic, base_url: {u}/claude, api_key: sk-ant, default_max_tokens: 64}}
  oa: {{kind: openai, base_url: {u}/oa/v1, api_key: sk-oa}}
models:
  - name: smart
    strategy: ordered
    targets: [{{model: alpha/m}}, {{model: beta/m}}]
    resume_streams: true
"""
PREFILL: list[Any] = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is "},
]


def _vllm_answer(content: str) -> Any:
    async def behave(request: web.Request, received: Received) -> web.StreamResponse:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": content, "reasoning": None, "tool_calls": []},
            "logprobs": None,
            "finish_reason": "stop",
            "stop_reason": None,
            "token_ids": None,
        }
        usage = {"prompt_tokens": 20, "completion_tokens": 2, "total_tokens": 22}
        body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "m"}
        body.update(choices=[choice], usage=usage, prompt_logprobs=None, prompt_token_ids=None)
        return web.json_response(body)

    return behave


def _anthropic_answer(text: str) -> Any:
    async def behave(request: web.Request, received: Received) -> web.StreamResponse:
        body = json.loads((FIXTURES / "messages_end_turn.json").read_text())
        body["content"][0]["text"] = text
        return web.json_response(body)

    return behave


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("chat-prefill"), CONFIG.format(u=upstream.url), {}) as gw:
        yield gw


@pytest.fixture
def script(upstream: Upstream, gateway: GatewayThread) -> Script:
    return scripted(upstream, gateway)


@pytest.fixture
def client(gateway: GatewayThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0)


def _prefilled_stream(client: openai.OpenAI, model: str, extra_body: Any = None, **more: Any) -> list[Any]:
    extra = extra_body or {"continue_final_message": True}
    return list(client.chat.completions.create(model=model, messages=PREFILL, stream=True, extra_body=extra, **more))


def _text(chunks: list[Any]) -> str:
    return "".join(ch.delta.content or "" for c in chunks for ch in c.choices)


def test_vllm_sglang_and_llama_server_continue_the_final_message(client: openai.OpenAI, script: Script) -> None:
    # As vLLM's docs write it: both fields, which the gateway takes as the one choice they make. llama-server
    # reads the same pair (tests/realservers/test_llama_chat.py holds it to the real server).
    extra = {"continue_final_message": True, "add_generation_prompt": False}
    for name, model in (("alpha", "alpha/m"), ("delta", "delta/m")):
        script.behaviours[name] = _vllm_answer("Paris.")
        answer = client.chat.completions.create(model=model, messages=PREFILL, extra_body=extra)
        assert answer.choices[0].message.content == "Paris."
        sent = script.received[name][-1].json()
        assert sent["messages"] == PREFILL
        assert (sent["continue_final_message"], sent["add_generation_prompt"]) == (True, False)
    # llama-server's buffered answer repeats the message it continued: the content is the continuation alone.
    script.behaviours["delta"] = _vllm_answer(PREFILL[1]["content"] + "Paris.")
    answer = client.chat.completions.create(model="delta/m", messages=PREFILL, extra_body=extra)
    assert answer.choices[0].message.content == "Paris."

    # SGLang's chat route takes `continue_final_message` alone; streamed, the continuation is relayed as it comes.
    script.behaviours["gamma"] = vllm_stream(["Par", "is."], usage=None)
    chunks = _prefilled_stream(client, "gamma/m")
    assert _text(chunks) == "Paris." and chunks[0].choices[0].delta.role == "assistant"
    sent = script.received["gamma"][-1].json()
    assert sent["messages"] == PREFILL and sent["continue_final_message"] is True
    assert "add_generation_prompt" not in sent


def test_anthropic_continues_the_prefill_without_its_trailing_white_space(
    client: openai.OpenAI, script: Script
) -> None:
    # Anthropic refuses a prefill that ends in white space: it is sent without it, and the continuation's own
    # leading white space that repeats it is not relayed, buffered or streamed.
    script.behaviours["claude"] = _anthropic_answer(" Paris.")
    ask: dict[str, Any] = {"model": "claude/claude-sonnet", "messages": PREFILL}
    ask["extra_body"] = {"continue_final_message": True}
    assert client.chat.completions.create(**ask).choices[0].message.content == "Paris."
    script.behaviours["claude"] = anthropic_stream([" Pa", "ris", "."])
    assert _text(list(client.chat.completions.create(stream=True, **ask))) == "Paris."
    for sent in script.received["claude"]:
        assert sent.json()["messages"][-1] == {
            "role": "assistant",
            "content": [{"type": "text", "text": "The capital of France is"}],
        }
        assert "continue_final_message" not in sent.json()


def test_routes_that_cannot_continue_refuse_it_by_name(client: openai.OpenAI, script: Script) -> None:
    thinking = {"thinking": {"type": "enabled", "budget_tokens": 1024}}
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("oa/gpt-4o-mini", {"continue_final_message": True}, "continue_final_message"),
        # Anthropic takes no prefill while the model thinks.
        (
            "claude/claude-sonnet",
            {"continue_final_message": True, "inference_extra_params": thinking},
            "continue_final_message",
        ),
        # The gateway could only check the continuation, not the message it continues.
        (
            "claude/claude-sonnet",
            {"continue_final_message": True, "guided_json": {"type": "object"}},
            "continue_final_message",
        ),
        # `add_generation_prompt: false` on its own is vLLM's field alone.
        ("oa/gpt-4o-mini", {"add_generation_prompt": False}, "add_generation_prompt"),
    ]
    for model, extra, param in cases:
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=model, messages=PREFILL, extra_body=extra)
        body = refused.value.body
        assert isinstance(body, dict) and body["param"] == param, (model, extra, body)
        assert body["code"] == "unsupported_parameter"
    assert script.received == {}  # each refused before any upstream call


def test_the_choice_not_to_continue_is_taken_everywhere(client: openai.OpenAI, script: Script) -> None:
    script.behaviours["oa"] = _vllm_answer("Paris.")
    extra = {"continue_final_message": False, "add_generation_prompt": True}
    messages = PREFILL[:1]
    answer = client.chat.completions.create(model="oa/gpt-4o-mini", messages=messages, extra_body=extra)
    assert answer.choices[0].message.content == "Paris."
    sent = script.received["oa"][-1].json()
    assert "continue_final_message" not in sent and "add_generation_prompt" not in sent
    # vLLM takes `add_generation_prompt: false` alone: the template's assistant turn is not opened.
    script.behaviours["alpha"] = _vllm_answer("x")
    client.chat.completions.create(model="alpha/m", messages=messages, extra_body={"add_generation_prompt": False})
    sent = script.received["alpha"][-1].json()
    assert sent["add_generation_prompt"] is False and "continue_final_message" not in sent


def test_bad_prefills_are_400s_naming_the_field(gateway: GatewayThread, script: Script) -> None:
    cases: list[tuple[list[dict[str, Any]], dict[str, Any], str]] = [
        (PREFILL[:1], {"continue_final_message": True}, "messages"),  # nothing to continue
        (
            [*PREFILL[:1], {"role": "assistant", "tool_calls": [_CALL]}],
            {"continue_final_message": True},
            "messages",
        ),
        (PREFILL, {"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message"),
        (PREFILL, {"continue_final_message": "yes"}, "continue_final_message"),
    ]
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as http:
        for messages, extra, param in cases:
            resp = http.post("/v1/chat/completions", json={"model": "alpha/m", "messages": messages, **extra})
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["param"] == param, (extra, resp.text)
        # Not a completion's field.
        resp = http.post("/v1/completions", json={"model": "alpha/m", "prompt": "x", "continue_final_message": True})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "continue_final_message"
    assert script.received == {}


_CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def test_a_broken_prefilled_stream_extends_the_same_message(client: openai.OpenAI, script: Script) -> None:
    script.behaviours["alpha"] = vllm_stream(["Pa", "ri"], usage=None, cut=True)
    script.behaviours["beta"] = vllm_stream(["s", "."], usage=None)
    chunks = _prefilled_stream(client, "smart", max_tokens=20)
    assert _text(chunks) == "Paris."
    (sent,) = script.received["beta"]
    body = sent.json()
    # The continuation continues the client's message with what was streamed, not a second assistant turn.
    assert body["messages"] == [PREFILL[0], {"role": "assistant", "content": "The capital of France is Pari"}]
    assert (body["continue_final_message"], body["add_generation_prompt"], body["max_tokens"]) == (True, False, 18)


# vLLM's `echo` on chat, done by the gateway on every route: the answer's content led by the last message's
# when the answer's role is that message's.
ECHO = {"continue_final_message": True, "echo": True}


def test_echo_returns_the_continued_message_whole(client: openai.OpenAI, script: Script) -> None:
    script.behaviours["alpha"] = _vllm_answer("Paris.")
    answer = client.chat.completions.create(model="alpha/m", messages=PREFILL, extra_body=ECHO)
    assert answer.choices[0].message.content == "The capital of France is Paris."
    assert answer.usage is not None and answer.usage.completion_tokens == 2  # the generated tokens alone
    sent = script.received["alpha"][-1].json()
    assert "echo" not in sent and sent["messages"] == PREFILL  # the gateway's own: no upstream sees it
    # Streamed: the first delta carries it, with the role.
    script.behaviours["gamma"] = vllm_stream(["Par", "is."], usage=None)
    chunks = _prefilled_stream(client, "gamma/m", extra_body=ECHO)
    assert _text(chunks) == "The capital of France is Paris."
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == "The capital of France is "
    # Anthropic's prefill goes without its trailing white space; the echo is the client's message as sent.
    script.behaviours["claude"] = _anthropic_answer(" Paris.")
    ask: dict[str, Any] = {"model": "claude/claude-sonnet", "messages": PREFILL, "extra_body": ECHO}
    assert client.chat.completions.create(**ask).choices[0].message.content == "The capital of France is Paris."
    script.behaviours["claude"] = anthropic_stream([" Pa", "ris", "."])
    streamed = list(client.chat.completions.create(stream=True, **ask))
    assert _text(streamed) == "The capital of France is Paris."


def test_echo_follows_the_answers_role(client: openai.OpenAI, script: Script) -> None:
    script.behaviours["oa"] = _vllm_answer("Paris.")
    question = PREFILL[:1]
    # A new assistant turn after a user message: nothing to echo, on any route.
    answer = client.chat.completions.create(model="oa/gpt-4o-mini", messages=question, extra_body={"echo": True})
    assert answer.choices[0].message.content == "Paris."
    assert "echo" not in script.received["oa"][-1].json()
    # A new assistant turn after an assistant message (not continued): that message leads the answer.
    answer = client.chat.completions.create(model="oa/gpt-4o-mini", messages=PREFILL, extra_body={"echo": True})
    assert answer.choices[0].message.content == "The capital of France is Paris."
    # vLLM's template left unopened: the answer continues the user's turn, which leads it.
    script.behaviours["alpha"] = _vllm_answer(" Paris?")
    extra = {"echo": True, "add_generation_prompt": False}
    answer = client.chat.completions.create(model="alpha/m", messages=question, extra_body=extra)
    assert answer.choices[0].message.content == "What is the capital of France? Paris?"
    # `echo: false` is the default.
    answer = client.chat.completions.create(model="alpha/m", messages=PREFILL, extra_body={**ECHO, "echo": False})
    assert answer.choices[0].message.content == " Paris?"


def test_a_broken_echoed_stream_is_resumed_from_what_was_generated(client: openai.OpenAI, script: Script) -> None:
    script.behaviours["alpha"] = vllm_stream(["Pa", "ri"], usage=None, cut=True)
    script.behaviours["beta"] = vllm_stream(["s", "."], usage=None)
    chunks = _prefilled_stream(client, "smart", max_tokens=20, extra_body=ECHO)
    assert _text(chunks) == "The capital of France is Paris."  # the echo once, then every generated piece
    (sent,) = script.received["beta"]
    body = sent.json()
    assert body["messages"] == [PREFILL[0], {"role": "assistant", "content": "The capital of France is Pari"}]
    # The role chunk that carried the echo is no token: the limit is reduced by the two generated pieces alone.
    assert "echo" not in body and body["max_tokens"] == 18
