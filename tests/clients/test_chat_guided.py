"""Guided output on `/v1/chat/completions` where the provider has no guided decoding, over real sockets:
the gateway checks each answer's `message.content` against `guided_json` / `guided_regex` /
`guided_choice` and asks again, as on completions (docs/emulation.md), streamed or not; a grammar it
cannot check, and a guided field on a kind whose completion route refuses it too, are a 400 naming it.

The upstreams answer in their own wire from the recordings (tests/fixtures/anthropic, cohere; SOURCES.md)
with only the text replaced: each call takes the next text of the test's script.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.helpers.clients import sse_data
from tests.helpers.recordings import fixture_json
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
unsupported_params: error
retries: {{attempts: 1}}
guided_retries: 2
timeouts: {{connect_ms: 2000, first_byte_ms: 10000, total_ms: 20000}}
providers:
  claude: {{kind: anthropic, base_url: {u}/claude, api_key: sk-ant, default_max_tokens: 64}}
  co: {{kind: cohere, base_url: {u}/co, api_key: sk-co}}
  oa: {{kind: openai, base_url: {u}/oa/v1, api_key: sk-oa}}
"""
MESSAGES = [{"role": "user", "content": "Where is the Eiffel tower? Answer in JSON."}]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
    "additionalProperties": False,
}
VALID = '{"city": "Paris", "country": "France"}'


class Script:
    """The texts the upstream answers, one per call, in order (the last one repeats)."""

    def __init__(self) -> None:
        self.texts: list[str] = ["The capital of France is Paris."]

    def next(self) -> str:
        return self.texts.pop(0) if len(self.texts) > 1 else self.texts[0]


def _anthropic(text: str) -> dict[str, Any]:
    body: dict[str, Any] = fixture_json("anthropic/messages_end_turn.json")
    body["content"] = [{"type": "text", "text": text}]
    return body


def _cohere(text: str) -> dict[str, Any]:
    body: dict[str, Any] = fixture_json("cohere/v2_chat_stop_sequence.json")
    body["message"]["content"] = [{"type": "text", "text": text}]
    body["finish_reason"] = "COMPLETE"
    return body


@pytest.fixture(scope="module")
def script() -> Script:
    return Script()


def _handler(script: Script) -> Any:
    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        text = script.next()
        if received.path == "/claude/v1/messages":
            return web.json_response(_anthropic(text))
        if received.path == "/co/v2/chat":
            return web.json_response(_cohere(text))
        return web.json_response({"error": {"message": "not found"}}, status=404)

    return handler


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as up:
        yield up


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("chat-guided"), CONFIG.format(u=upstream.url)) as gw:
        yield gw


@pytest.fixture
def api(gateway: GatewayThread, upstream: Upstream, script: Script) -> Iterator[httpx.Client]:
    upstream.reset()
    upstream.handler = _handler(script)
    script.texts = ["The capital of France is Paris."]
    with httpx.Client(base_url=gateway.url, timeout=20, trust_env=False) as client:
        yield client


def _sent(upstream: Upstream) -> list[dict[str, Any]]:
    return [r.json() for r in upstream.received]


def test_an_answer_that_fails_the_schema_is_asked_again(api: httpx.Client, upstream: Upstream, script: Script) -> None:
    script.texts = ["The Eiffel tower is in Paris.", '{"city": "Paris"}', VALID]
    body = {"model": "claude/claude-3-opus-20240229", "messages": MESSAGES, "guided_json": SCHEMA}
    resp = api.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    (choice,) = resp.json()["choices"]
    assert choice["message"]["content"] == VALID and choice["finish_reason"] == "stop"
    sent = _sent(upstream)
    assert len(sent) == 3  # not JSON, then JSON without `country`, then the answer
    assert all("guided_json" not in s and s["messages"][-1]["role"] == "user" for s in sent)


def test_no_valid_answer_after_the_retries_is_a_502_naming_the_field(
    api: httpx.Client, upstream: Upstream, script: Script
) -> None:
    script.texts = ["Paris."]
    body = {"model": "claude/claude-3-opus-20240229", "messages": MESSAGES, "guided_json": SCHEMA}
    resp = api.post("/v1/chat/completions", json=body)
    assert resp.status_code == 502, resp.text
    error = resp.json()["error"]
    assert (error["code"], error["param"]) == ("guided_output_invalid", "guided_json")
    assert error["message"].startswith("The model's output is not valid JSON, after 3 attempts")
    assert len(upstream.received) == 3  # the call and `guided_retries: 2` more


def test_a_guided_stream_is_made_from_the_checked_answer(api: httpx.Client, upstream: Upstream, script: Script) -> None:
    script.texts = ["not json", VALID]
    body = {
        "model": "claude/claude-3-opus-20240229",
        "messages": MESSAGES,
        "guided_json": SCHEMA,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    resp = api.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
    assert content == VALID
    assert [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]] == ["stop"]
    recorded = fixture_json("anthropic/messages_end_turn.json")["usage"]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == recorded["output_tokens"]  # the answer's, as on completions
    # The upstream was asked for whole answers: bytes sent cannot be taken back.
    assert [s.get("stream", False) for s in _sent(upstream)] == [False, False]


def test_each_fanned_out_choice_is_checked(api: httpx.Client, upstream: Upstream, script: Script) -> None:
    """Cohere's chat has no `n` and no guided decoding: two calls, each checked against the choices."""
    script.texts = ["yes", "maybe", "no"]
    body = {"model": "co/command-r", "messages": MESSAGES, "n": 2, "guided_choice": ["yes", "no"]}
    resp = api.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    got = sorted(c["message"]["content"] for c in resp.json()["choices"])
    assert got == ["no", "yes"] and [c["index"] for c in resp.json()["choices"]] == [0, 1]
    assert len(upstream.received) == 3  # one of the two calls answered `maybe` and was asked again


def test_a_regex_is_matched_in_full(api: httpx.Client, upstream: Upstream, script: Script) -> None:
    script.texts = ["Answer: 42 ", "42"]
    body = {"model": "co/command-r", "messages": MESSAGES, "guided_regex": r"\d+"}
    resp = api.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == "42"
    assert len(upstream.received) == 2


@pytest.mark.parametrize(
    ("model", "extra", "param", "code"),
    [
        # A grammar cannot be checked by the gateway: refused, as on completions.
        ("claude/claude-3-opus-20240229", {"guided_grammar": "root ::= [a-z]+"}, "guided_grammar", None),
        # A regex RE2 cannot compile (a backreference): refused before any call.
        ("co/command-r", {"guided_regex": r"(a)\1"}, "guided_regex", None),
        # OpenAI's completion route takes no guided field either: the same 400 naming it and the provider.
        ("oa/gpt-4o-mini", {"guided_json": SCHEMA}, "guided_json", "unsupported_parameter"),
    ],
    ids=["grammar", "bad-regex", "openai"],
)
def test_what_cannot_be_checked_is_a_400(
    api: httpx.Client, upstream: Upstream, model: str, extra: dict[str, Any], param: str, code: str | None
) -> None:
    resp = api.post("/v1/chat/completions", json={"model": model, "messages": MESSAGES, **extra})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code and "'oa'" in error["message"], error
    assert upstream.received == []
