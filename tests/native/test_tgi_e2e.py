"""TGI native end to end: the gateway (uvicorn, real socket) in front of a loopback upstream replaying the
real huggingface_hub TGI recordings (tests/fixtures/tgi, see SOURCES.md); clients are the official `openai`
SDK and raw httpx. The client asks for a legacy completion and gets exactly the recorded text, finish reason
and usage; the upstream sees `/generate` (or `/generate_stream`) with TGI's `{"inputs", "parameters"}`."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai

from tests.helpers.clients import sse_data
from tests.helpers.errors import assert_error
from tests.helpers.recordings import fixture_bytes, sse_events
from tests.helpers.upstreams import Upstream, reply, reply_sse

UPSTREAM_KEY = "hf_upstream_e2e"
MODEL = "hf/google/flan-t5-xxl"
CONFIG = """
unsupported_params: error
retries: {{attempts: 1}}
providers:
  hf:
    kind: tgi
    api_key: {key}
    base_url: {url}/tgi
"""


def _assert_call(upstream: Upstream, path: str, body: dict[str, Any]) -> None:
    sent = upstream.only()
    assert (sent.method, sent.path, sent.query) == ("POST", path, {})
    assert sent.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert sent.json() == body


def test_openai_sdk_non_stream_recording(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes("tgi/generate_details_length.json"))
    completion = oai.completions.create(model=MODEL, prompt="test", max_tokens=1, temperature=0)
    assert completion.id.startswith("cmpl-")
    assert (completion.object, completion.model) == ("text_completion", MODEL)
    assert [(c.index, c.text, c.finish_reason, c.logprobs) for c in completion.choices] == [(0, "", "length", None)]
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens, completion.usage.total_tokens) == (
        1,
        1,
        2,
    )
    _assert_call(
        upstream,
        "/tgi/generate",
        {
            "inputs": "test",
            "parameters": {
                "max_new_tokens": 1,
                "do_sample": False,
                "details": True,
                "return_full_text": False,
                "decoder_input_details": True,
            },
        },
    )


def test_openai_sdk_stream_recording_with_usage(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.handler = reply_sse(sse_events(fixture_bytes("tgi/generate_stream_details.sse.txt")))
    stream = oai.completions.create(
        model=MODEL, prompt="test", max_tokens=1, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    content = [c for c in chunks if c.choices]
    assert [(c.choices[0].text, c.choices[0].finish_reason) for c in content] == [(" ", "length")]
    assert {c.id for c in chunks} == {chunks[0].id}
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (0, 1, 1)
    _assert_call(
        upstream,
        "/tgi/generate_stream",
        {
            "inputs": "test",
            "parameters": {"max_new_tokens": 1, "do_sample": True, "details": True, "return_full_text": False},
        },
    )


def test_raw_stream_without_usage_request(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply_sse(sse_events(fixture_bytes("tgi/generate_stream_details.sse.txt")))
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "test", "stream": True, "stop": ["\n"]})
    assert resp.status_code == 200, resp.text
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert [(c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in chunks] == [(" ", "length")]
    assert all("usage" not in c for c in chunks)
    assert upstream.only().json()["parameters"]["stop"] == ["\n"]


def test_recorded_422_reaches_the_client(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes("tgi/error_422_validation.json"), status=422)
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "test", "max_tokens": 10000})
    assert_error(
        resp,
        "/v1/completions",
        status=422,
        type="invalid_request_error",
        message="hf error (422): Input validation error: `inputs` tokens + `max_new_tokens` must be <= 1512. "
        "Given: 2 `inputs` tokens and 10000 `max_new_tokens`",
        code="context_length_exceeded",
    )


def test_presence_penalty_is_refused_before_any_upstream_call(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "x", "presence_penalty": 0.5})
    assert_error(
        resp,
        "/v1/completions",
        status=400,
        type="invalid_request_error",
        message="Parameter 'presence_penalty' is not supported by provider 'hf'",
        param="presence_penalty",
        code="unsupported_parameter",
    )
    assert upstream.received == []
