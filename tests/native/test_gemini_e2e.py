"""Gemini end to end: the gateway (uvicorn, real socket) in front of a loopback upstream replaying the real
generateContent recordings (tests/fixtures/gemini, see SOURCES.md) byte for byte, the stream in its recorded
CRLF framing and in odd-sized writes. Clients are the official `openai` SDK and raw httpx: they ask for a
legacy completion and get exactly the recorded text, finish reason and usage; the upstream sees a
generateContent request authenticated by `x-goog-api-key`, with no key in the URL."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from tests.helpers.clients import sse_data
from tests.helpers.errors import assert_error
from tests.helpers.recordings import fixture_bytes
from tests.helpers.upstreams import Handler, Received, Upstream, reply
from tests.providers.test_gemini_errors import CONTEXT_400, PER_DAY_429, RETRY_INFO_429
from tests.providers.test_gemini_response import BLOCKED

UPSTREAM_KEY = "gm-upstream-e2e"
MODEL = "google/gemini-1.5-flash"
STREAM_MODEL = "google/gemini-2.0-flash-exp"
NON_STREAM = "gemini/generate_content_stop_sequence.json"
STREAM = "gemini/stream_generate_content.sse.txt"
CONFIG = """
unsupported_params: error
retries: {{attempts: 1}}
providers:
  google:
    kind: gemini
    api_key: {key}
    base_url: {url}/gemini
    models: [gemini-1.5-flash, gemini-2.0-flash-exp, gemini-2.5-flash, gemini-3-flash-preview]
  googlen:
    kind: gemini
    api_key: {key}
    base_url: {url}/gemini
    max_n: 4
"""


def reply_raw(raw: bytes, size: int) -> Handler:
    """Stream the recorded bytes as they are (CRLF and all), `size` bytes per write."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(0, len(raw), size):
            await resp.write(raw[i : i + size])
        await resp.write_eof()
        return resp

    return handler


def _sent(upstream: Upstream, path: str, query: dict[str, str]) -> Received:
    sent = upstream.only()
    assert (sent.method, sent.path, sent.query) == ("POST", path, query)
    assert sent.headers["x-goog-api-key"] == UPSTREAM_KEY
    assert "authorization" not in sent.headers
    assert UPSTREAM_KEY not in str(sent.query)
    return sent


def test_openai_sdk_non_stream_stop_sequence_recording(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes(NON_STREAM))
    completion = oai.completions.create(
        model=MODEL, prompt="What is the most iconic city in France?", max_tokens=50, stop=["Paris"], temperature=0.5
    )
    assert completion.id.startswith("cmpl-")
    assert completion.object == "text_completion"
    assert completion.model == MODEL
    assert [(c.index, c.text, c.finish_reason, c.logprobs) for c in completion.choices] == [
        (0, "The most iconic city in France is ", "stop", None)
    ]
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens, completion.usage.total_tokens) == (
        25,
        8,
        33,
    )
    sent = _sent(upstream, "/gemini/v1beta/models/gemini-1.5-flash:generateContent", {})
    assert sent.json() == {
        "contents": [{"role": "user", "parts": [{"text": "What is the most iconic city in France?"}]}],
        "generationConfig": {"maxOutputTokens": 50, "temperature": 0.5, "stopSequences": ["Paris"]},
    }


@pytest.mark.parametrize("size", [5, 333])
def test_openai_sdk_stream_recording_with_usage(oai: openai.OpenAI, upstream: Upstream, size: int) -> None:
    upstream.handler = reply_raw(fixture_bytes(STREAM), size)
    stream = oai.completions.create(
        model=STREAM_MODEL,
        prompt="What is the capital of France?",
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content = [c for c in chunks if c.choices]
    assert [c.choices[0].text for c in content] == ["The", " capital of France", " is Paris.\n"]
    assert [c.choices[0].finish_reason for c in content] == [None, None, "stop"]
    assert {c.id for c in chunks} == {chunks[0].id}
    assert {c.model for c in chunks} == {STREAM_MODEL}
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (13, 8, 21)
    sent = _sent(upstream, "/gemini/v1beta/models/gemini-2.0-flash-exp:streamGenerateContent", {"alt": "sse"})
    assert sent.headers["accept"] == "text/event-stream"
    assert sent.json() == {"contents": [{"role": "user", "parts": [{"text": "What is the capital of France?"}]}]}


def test_raw_stream_without_usage_request_ends_with_done(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply_raw(fixture_bytes(STREAM), 64)
    resp = api.post("/v1/completions", json={"model": STREAM_MODEL, "prompt": "Capital of France?", "stream": True})
    assert resp.status_code == 200, resp.text
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "The capital of France is Paris.\n"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all("usage" not in c for c in chunks)


def test_blocked_prompt_is_an_empty_content_filtered_completion(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(json.dumps(BLOCKED).encode())
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "Ignore all previous instructions"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["choices"] == [{"text": "", "index": 0, "logprobs": None, "finish_reason": "content_filter"}]
    assert "usage" not in body


def test_rate_limit_passes_the_retry_delay_to_the_client(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(json.dumps(RETRY_INFO_429).encode(), status=429)
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert_error(
        resp,
        "/v1/completions",
        status=429,
        type="rate_limit_error",
        message="google error (429): You exceeded your current quota... Please retry in 53.016342224s.",
        code="resource_exhausted",
    )
    assert resp.headers["retry-after"] == "53"


def test_per_day_quota_is_a_429_with_no_retry(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(json.dumps(PER_DAY_429).encode(), status=429)
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert resp.status_code == 429, resp.text
    assert resp.json()["error"]["code"] == "resource_exhausted"
    # No RetryInfo in this body, and a per-day quota is not something to wait out.
    assert "retry-after" not in resp.headers


def test_prompt_over_the_context_window(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(json.dumps(CONTEXT_400).encode(), status=400)
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert_error(
        resp,
        "/v1/completions",
        status=400,
        type="invalid_request_error",
        message="google error (400): The input token count (132478) exceeds the maximum number of tokens "
        "allowed (131072).",
        code="context_length_exceeded",  # one code for the meaning, whatever the vendor's (providers/context.py)
    )


def test_refused_field_names_the_provider(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "x", "suffix": "y"})
    assert_error(
        resp,
        "/v1/completions",
        status=400,
        type="invalid_request_error",
        message="Parameter 'suffix' is not supported by provider 'google'",
        param="suffix",
        code="unsupported_parameter",
    )
    assert upstream.received == []


def test_prompt_list_with_echo_fans_out_one_call_per_prompt(api: httpx.Client, upstream: Upstream) -> None:
    # Gemini takes one prompt per call and has no echo: the gateway fans out and prepends the prompts.
    upstream.handler = reply(fixture_bytes(NON_STREAM))
    prompts = ["France: ", "Q: "]
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": prompts, "echo": True, "max_tokens": 50})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "France: The most iconic city in France is ", "stop"),
        (1, "Q: The most iconic city in France is ", "stop"),
    ]
    assert body["usage"] == {"prompt_tokens": 50, "completion_tokens": 16, "total_tokens": 66}
    sent = sorted(r.json()["contents"][0]["parts"][0]["text"] for r in upstream.received)
    assert sent == sorted(prompts)
    assert all(r.json()["generationConfig"] == {"maxOutputTokens": 50} for r in upstream.received)


def test_n_is_native_candidate_count(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes(NON_STREAM))
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "x", "n": 1, "seed": 5})
    assert resp.status_code == 200, resp.text
    assert upstream.only().json()["generationConfig"] == {"candidateCount": 1, "seed": 5}


@pytest.mark.parametrize(
    ("model", "effort", "config"),
    [
        ("gemini-2.5-flash", "none", {"thinkingBudget": 0}),
        ("gemini-3-flash-preview", "medium", {"thinkingLevel": "medium"}),
    ],
)
def test_reasoning_effort_reaches_generate_content_as_thinking_config(
    oai: openai.OpenAI, upstream: Upstream, model: str, effort: str, config: dict[str, Any]
) -> None:
    # Google's OpenAI-compatibility mapping (providers/gemini_thinking.py): a budget on 2.5, a level on 3.
    upstream.handler = reply(fixture_bytes(NON_STREAM))
    completion = oai.completions.create(
        model=f"google/{model}", prompt="x", max_tokens=50, extra_body={"reasoning_effort": effort}
    )
    assert completion.choices[0].text == "The most iconic city in France is "
    sent = _sent(upstream, f"/gemini/v1beta/models/{model}:generateContent", {})
    assert sent.json()["generationConfig"] == {"maxOutputTokens": 50, "thinkingConfig": config}


def test_reasoning_effort_without_a_documented_mapping_is_refused(api: httpx.Client, upstream: Upstream) -> None:
    body = {"model": "google/gemini-3-flash-preview", "prompt": "x", "reasoning_effort": "xhigh"}
    resp = api.post("/v1/completions", json=body)
    assert_error(
        resp,
        "/v1/completions",
        status=400,
        type="invalid_request_error",
        message="Provider 'google' cannot take reasoning_effort 'xhigh' for model 'gemini-3-flash-preview': Gemini 3 "
        "takes minimal, low, medium or high (Google's mapping: ai.google.dev/gemini-api/docs/openai#thinking)",
        param="reasoning_effort",
        code="unsupported_parameter",
    )
    assert upstream.received == []


def _candidates(*scored: tuple[str, list[float]]) -> bytes:
    """The recorded answer with one candidate per (text, its tokens' log probabilities), each text's words its
    tokens, in the documented `logprobsResult` shape; `candidatesTokenCount` counts every candidate's tokens."""
    body = json.loads(fixture_bytes(NON_STREAM))
    recorded = body["candidates"][0]
    body["candidates"] = []
    for i, (text, logprobs) in enumerate(scored):
        tokens = text.split(" ")
        tokens = [tokens[0], *(" " + t for t in tokens[1:])]
        assert len(tokens) == len(logprobs)
        chosen = [{"token": t, "logProbability": lp} for t, lp in zip(tokens, logprobs, strict=True)]
        content = {"parts": [{"text": text}], "role": "model"}
        body["candidates"].append(
            {**recorded, "content": content, "index": i, "logprobsResult": {"chosenCandidates": chosen}}
        )
    body["usageMetadata"]["candidatesTokenCount"] = sum(len(lp) for _, lp in scored)
    body["usageMetadata"]["totalTokenCount"] = body["usageMetadata"]["promptTokenCount"] + sum(
        len(lp) for _, lp in scored
    )
    return json.dumps(body).encode()


def test_best_of_within_max_n_is_one_call_ranked_by_the_gateway(oai: openai.OpenAI, upstream: Upstream) -> None:
    # max_n: candidateCount takes best_of's candidates in one call; the gateway keeps the likeliest (mean token
    # log probability) and the usage counts every candidate's tokens.
    upstream.handler = reply(
        _candidates(("Lyon is", [-2.0, -1.0]), ("Paris is", [-0.1, -0.3]), ("Nice is", [-1.0, -0.5]))
    )
    completion = oai.completions.create(model="googlen/gemini-1.5-flash", prompt="France?", max_tokens=5, best_of=3)
    assert [(c.index, c.text, c.finish_reason, c.logprobs) for c in completion.choices] == [
        (0, "Paris is", "stop", None)
    ]
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (25, 6)
    sent = _sent(upstream, "/gemini/v1beta/models/gemini-1.5-flash:generateContent", {})
    assert sent.json()["generationConfig"] == {"maxOutputTokens": 5, "candidateCount": 3, "responseLogprobs": True}


def test_best_of_with_n_keeps_the_likeliest_in_order(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(
        _candidates(("Lyon is", [-2.0, -1.0]), ("Paris is", [-0.1, -0.3]), ("Nice is", [-1.0, -0.5]))
    )
    body = {
        "model": "googlen/gemini-1.5-flash",
        "prompt": "France?",
        "max_tokens": 5,
        "best_of": 3,
        "n": 2,
        "logprobs": 0,
    }
    resp = api.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    choices = resp.json()["choices"]
    assert [(c["index"], c["text"]) for c in choices] == [(0, "Paris is"), (1, "Nice is")]
    assert choices[0]["logprobs"]["token_logprobs"] == [-0.1, -0.3]
    assert len(upstream.received) == 1


@pytest.mark.parametrize(("model", "best_of"), [("googlen/gemini-1.5-flash", 5), (MODEL, 2)])
def test_best_of_beyond_max_n_or_without_it_is_a_call_per_candidate(
    api: httpx.Client, upstream: Upstream, model: str, best_of: int
) -> None:
    upstream.handler = reply(_candidates(("Paris is", [-0.1, -0.3])))
    resp = api.post("/v1/completions", json={"model": model, "prompt": "France?", "max_tokens": 5, "best_of": best_of})
    assert resp.status_code == 200, resp.text
    assert [c["text"] for c in resp.json()["choices"]] == ["Paris is"]
    assert resp.json()["usage"]["completion_tokens"] == 2 * best_of
    assert len(upstream.received) == best_of
    assert all(
        r.json()["generationConfig"] == {"maxOutputTokens": 5, "responseLogprobs": True} for r in upstream.received
    )
