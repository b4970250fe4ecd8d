"""llama.cpp native end to end: the gateway (uvicorn, real socket) in front of a loopback upstream; clients are
the official `openai` SDK and raw httpx.

No llama.cpp response has been recorded anywhere public (fixtures INDEX), so the upstream answers with bodies
built only from the fields ggml-org/llama.cpp `tools/server/README.md` documents for `POST /completion`
(content, stop, stop_type, stopping_word, tokens_evaluated, tokens_predicted; streaming: content and stop until
the last event), and its 503 "Loading model" body, which the README prints verbatim."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai

from tests.helpers.clients import sse_data
from tests.helpers.errors import assert_error
from tests.helpers.upstreams import Upstream, reply, reply_sse

MODEL = "llama/qwen2.5-7b-instruct"
PROMPT = "Building a website can be done in 10 simple steps:"
CONFIG = """
unsupported_params: error
retries: {{attempts: 1}}
providers:
  llama:
    kind: llamacpp
    base_url: {url}/llama
"""
FINAL: dict[str, Any] = {
    "content": "\n1. Choose a domain name",
    "stop": True,
    "stop_type": "word",
    "stopping_word": "\n2.",
    "tokens_evaluated": 13,
    "tokens_predicted": 9,
}
STREAM: list[dict[str, Any]] = [
    {"content": "\n1.", "stop": False},
    {"content": " Choose a domain name", "stop": False},
    {
        "content": "",
        "stop": True,
        "stop_type": "word",
        "stopping_word": "\n2.",
        "tokens_evaluated": 13,
        "tokens_predicted": 9,
    },
]
LOADING = b'{"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}'


def test_openai_sdk_non_stream(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.handler = reply(json.dumps(FINAL).encode())
    completion = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=64, stop=["\n2."], seed=1)
    assert (completion.object, completion.model) == ("text_completion", MODEL)
    assert [(c.index, c.text, c.finish_reason, c.logprobs) for c in completion.choices] == [
        (0, "\n1. Choose a domain name", "stop", None)
    ]
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens, completion.usage.total_tokens) == (
        13,
        9,
        22,
    )
    sent = upstream.only()
    assert (sent.method, sent.path) == ("POST", "/llama/completion")
    assert sent.json() == {
        "model": "qwen2.5-7b-instruct",
        "prompt": PROMPT,
        "n_predict": 64,
        "stop": ["\n2."],
        "seed": 1,
        "stream": False,
        "cache_prompt": True,
    }


def test_openai_sdk_stream_with_usage(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.handler = reply_sse([b"data: " + json.dumps(e).encode() for e in STREAM])
    stream = oai.completions.create(model=MODEL, prompt=PROMPT, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    content = [c for c in chunks if c.choices]
    assert [(c.choices[0].text, c.choices[0].finish_reason) for c in content] == [
        ("\n1.", None),
        (" Choose a domain name", None),
        ("", "stop"),
    ]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (13, 9, 22)
    assert upstream.only().json() == {
        "model": "qwen2.5-7b-instruct",
        "prompt": PROMPT,
        "stream": True,
        "cache_prompt": True,
    }


def test_raw_stream_without_usage_request(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply_sse([b"data: " + json.dumps(e).encode() for e in STREAM])
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "stream": True})
    assert resp.status_code == 200, resp.text
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "\n1. Choose a domain name"
    assert all("usage" not in c for c in chunks)


def test_model_loading_503_reaches_the_client_as_an_upstream_error(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(LOADING, status=503)
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT})
    assert_error(
        resp,
        "/v1/completions",
        status=502,
        type="upstream_error",
        message="llama error (503): Loading model",
        code="unavailable_error",
    )


def test_suffix_is_refused_before_any_upstream_call(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "def f(", "suffix": "):"})
    assert_error(
        resp,
        "/v1/completions",
        status=400,
        type="invalid_request_error",
        message="Parameter 'suffix' is not supported by provider 'llama'",
        param="suffix",
        code="unsupported_parameter",
    )
    assert upstream.received == []
