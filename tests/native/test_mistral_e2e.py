"""Mistral end to end: the gateway (uvicorn, real socket) in front of a loopback upstream replaying the real
chat recordings (tests/fixtures/mistral with its recorded rate-limit headers, and the recorded stream quoted in
tests/providers/test_mistral_response.py). Clients are the official `openai` SDK and raw httpx: they ask for a legacy
completion and get exactly the recorded text, finish reason and usage; the upstream sees a chat (or, with
`suffix`, a FIM) request with a Bearer key."""

from __future__ import annotations

import json

import httpx
import openai

from tests.helpers.clients import sse_data
from tests.helpers.errors import assert_error
from tests.helpers.recordings import fixture_bytes, fixture_headers, fixture_json
from tests.helpers.upstreams import Received, Upstream, reply, reply_sse
from tests.providers.test_mistral_errors import RATE_LIMITED
from tests.providers.test_mistral_response import STREAM_EVENTS, STREAM_TEXTS, with_choice

UPSTREAM_KEY = "ms-upstream-e2e"
MODEL = "mistral/mistral-tiny"
CHAT = "mistral/chat_with_ratelimit_headers.json"
HEADERS = "mistral/chat_with_ratelimit_headers.headers.json"
PROMPT = "Tell me a joke about OpenTelemetry"
CONFIG = """
unsupported_params: error
retries: {{attempts: 1}}
providers:
  mistral:
    kind: mistral
    api_key: {key}
    base_url: {url}/mistral
    models: [mistral-tiny, codestral-latest]
"""


def _sent(upstream: Upstream, path: str) -> Received:
    sent = upstream.only()
    assert (sent.method, sent.path, sent.query) == ("POST", path, {})
    assert sent.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    return sent


def test_openai_sdk_non_stream_recording(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes(CHAT), headers=fixture_headers(HEADERS))
    completion = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=200, seed=11, temperature=0.2)
    recorded = fixture_json(CHAT)
    assert completion.id.startswith("cmpl-")
    assert completion.object == "text_completion"
    assert completion.model == MODEL
    assert completion.created == recorded["created"]
    assert [(c.index, c.text, c.finish_reason, c.logprobs) for c in completion.choices] == [
        (0, recorded["choices"][0]["message"]["content"], "stop", None)
    ]
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens, completion.usage.total_tokens) == (
        11,
        96,
        107,
    )
    assert _sent(upstream, "/mistral/v1/chat/completions").json() == {
        "model": "mistral-tiny",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 200,
        "temperature": 0.2,
        "random_seed": 11,
    }


def test_openai_sdk_stream_recording_with_usage(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.handler = reply_sse(STREAM_EVENTS)
    stream = oai.completions.create(model=MODEL, prompt=PROMPT, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    content = [c for c in chunks if c.choices]
    # The role-only opening chunk is not relayed; the "p" padding never reaches the client.
    assert [c.choices[0].text for c in content] == [*STREAM_TEXTS, ""]
    assert [c.choices[0].finish_reason for c in content] == [None] * len(STREAM_TEXTS) + ["stop"]
    assert {c.id for c in chunks} == {chunks[0].id}
    assert {c.created for c in chunks} == {1757759492}
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (11, 80, 91)
    sent = _sent(upstream, "/mistral/v1/chat/completions")
    assert sent.json() == {"model": "mistral-tiny", "messages": [{"role": "user", "content": PROMPT}], "stream": True}


def test_raw_stream_without_usage_request(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply_sse(STREAM_EVENTS)
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "stream": True})
    assert resp.status_code == 200, resp.text
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "".join(STREAM_TEXTS)
    assert all("usage" not in c and "p" not in c for c in chunks)


def test_suffix_goes_to_fim(api: httpx.Client, upstream: Upstream) -> None:
    # No FIM response was ever recorded: the upstream answers the recorded chat body, the shape the SDK
    # types FIMCompletionResponse with (see providers/mistral.py).
    upstream.handler = reply(fixture_bytes(CHAT))
    resp = api.post(
        "/v1/completions",
        json={
            "model": "mistral/codestral-latest",
            "prompt": "def f(x):\n",
            "suffix": "\nprint(f(1))",
            "max_tokens": 30,
        },
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["text"] == fixture_json(CHAT)["choices"][0]["message"]["content"]
    assert _sent(upstream, "/mistral/v1/fim/completions").json() == {
        "model": "codestral-latest",
        "prompt": "def f(x):\n",
        "suffix": "\nprint(f(1))",
        "max_tokens": 30,
    }


def test_chat_only_field_with_suffix_is_refused(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "a", "suffix": "b", "presence_penalty": 1})
    assert_error(
        resp,
        "/v1/completions",
        status=400,
        type="invalid_request_error",
        message="Parameter 'presence_penalty' is not supported by provider 'mistral' together with 'suffix' "
        "(Mistral FIM completions)",
        param="presence_penalty",
        code="unsupported_parameter",
    )
    assert upstream.received == []


def test_rate_limit_with_an_exhausted_request_window(api: httpx.Client, upstream: Upstream) -> None:
    # The recorded rate-limit headers with the 10-second request bucket at zero, and no Retry-After.
    headers = {**fixture_headers(HEADERS), "x-ratelimit-remaining-req-10-second": "0"}
    upstream.handler = reply(json.dumps(RATE_LIMITED).encode(), status=429, headers=headers)
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert_error(
        resp,
        "/v1/completions",
        status=429,
        type="rate_limit_error",
        message="mistral error (429): Rate limit exceeded (upstream code 1300)",
        code="upstream_http_429",
    )
    assert resp.headers["retry-after"] == "10"


def test_monthly_budget_spent_is_a_quota(api: httpx.Client, upstream: Upstream) -> None:
    headers = {**fixture_headers(HEADERS), "x-ratelimit-remaining-tokens-month": "0"}
    upstream.handler = reply(json.dumps(RATE_LIMITED).encode(), status=429, headers=headers)
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert resp.status_code == 429, resp.text
    assert "retry-after" not in resp.headers


def test_logprobs_are_refused(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "x", "logprobs": 1})
    assert_error(
        resp,
        "/v1/completions",
        status=400,
        type="invalid_request_error",
        message="Parameter 'logprobs' is not supported by provider 'mistral'",
        param="logprobs",
        code="unsupported_parameter",
    )
    assert upstream.received == []


def test_chat_choice_ended_by_error_is_a_failed_generation(api: httpx.Client, upstream: Upstream) -> None:
    """Mistral's `error` finish reason (client-python `ChatCompletionChoice`) says the generation broke off: a
    chat client gets the 502 a completion client gets, never the partial text as a finished answer."""
    messages = [{"role": "user", "content": PROMPT}]
    upstream.handler = reply(with_choice(finish_reason="error"))
    resp = api.post("/v1/chat/completions", json={"model": MODEL, "messages": messages})
    assert resp.status_code == 502, resp.text
    assert resp.json()["error"]["code"] == "generation_error"
    completion = api.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT})
    assert completion.status_code == 502, completion.text
    assert completion.json()["error"]["code"] == "generation_error"

    # The recorded stream, its finishing chunk ending the choice with `error` instead of `stop`.
    last = json.loads(STREAM_EVENTS[-2][len(b"data: ") :])
    last["choices"][0]["finish_reason"] = "error"
    upstream.handler = reply_sse([*STREAM_EVENTS[:-2], b"data: " + json.dumps(last).encode(), STREAM_EVENTS[-1]])
    resp = api.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "stream": True})
    assert resp.status_code == 200, resp.text
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    events = [json.loads(d) for d in data[:-1]]
    assert events[-1]["error"]["code"] == "generation_error"
    assert all(ch["finish_reason"] is None for e in events[:-1] for ch in e["choices"])
