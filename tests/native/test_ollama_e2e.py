"""Ollama native end to end: the gateway (uvicorn, real socket) in front of a loopback upstream replaying the
real openllmetry Ollama recordings (tests/fixtures/ollama, see SOURCES.md: one JSON body, and an NDJSON
stream served byte for byte as application/x-ndjson); clients are the official `openai` SDK and raw httpx.
The client gets exactly the recorded text, finish reason and usage; the upstream sees `/api/generate` with a
raw prompt and an explicit `stream`."""

from __future__ import annotations

import json

import httpx
import openai

from tests.helpers.clients import sse_data
from tests.helpers.errors import assert_error
from tests.helpers.recordings import fixture_bytes, fixture_json
from tests.helpers.upstreams import Upstream, reply

MODEL = "local/llama3"
PROMPT = "Tell me a joke about OpenTelemetry"
NDJSON = {"content-type": "application/x-ndjson"}
CONFIG = """
unsupported_params: error
retries: {{attempts: 1}}
providers:
  local:
    kind: ollama
    base_url: {url}/ollama
"""


def _recorded_stream_text() -> str:
    return "".join(json.loads(line)["response"] for line in fixture_bytes("ollama/generate_stream.ndjson").splitlines())


def test_openai_sdk_non_stream_recording(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes("ollama/generate_nonstream.json"))
    completion = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=100, temperature=0.7, stop=["\n\n\n"])
    assert completion.id.startswith("cmpl-")
    assert (completion.object, completion.model) == ("text_completion", MODEL)
    recorded = fixture_json("ollama/generate_nonstream.json")["response"]
    assert [(c.index, c.text, c.finish_reason, c.logprobs) for c in completion.choices] == [(0, recorded, "stop", None)]
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens, completion.usage.total_tokens) == (
        17,
        63,
        80,
    )
    sent = upstream.only()
    assert (sent.method, sent.path) == ("POST", "/ollama/api/generate")
    assert "authorization" not in sent.headers
    assert sent.json() == {
        "model": "llama3",
        "prompt": PROMPT,
        "raw": True,
        "stream": False,
        "options": {"num_predict": 100, "temperature": 0.7, "stop": ["\n\n\n"]},
    }


def test_openai_sdk_stream_recording_with_usage(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes("ollama/generate_stream.ndjson"), headers=NDJSON)
    stream = oai.completions.create(model=MODEL, prompt=PROMPT, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    content = [c for c in chunks if c.choices]
    assert len(content) == 71
    assert "".join(c.choices[0].text for c in content) == _recorded_stream_text()
    assert [c.choices[0].finish_reason for c in content] == [None] * 70 + ["stop"]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (17, 71, 88)
    assert upstream.only().json() == {"model": "llama3", "prompt": PROMPT, "raw": True, "stream": True}


def test_raw_stream_without_usage_request(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes("ollama/generate_stream.ndjson"), headers=NDJSON)
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "stream": True})
    assert resp.status_code == 200, resp.text
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == _recorded_stream_text()
    assert all("usage" not in c for c in chunks)


def test_unknown_model_error_reaches_the_client(api: httpx.Client, upstream: Upstream) -> None:
    # Ollama's 404 body as server/routes.go writes it ({"error": "model '<name>' not found"}); not recorded.
    upstream.handler = reply(b'{"error":"model \'llama3\' not found"}', status=404)
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT})
    assert_error(
        resp,
        "/v1/completions",
        status=404,
        type="invalid_request_error",
        message="local error (404): model 'llama3' not found",
        param="model",
        code="model_not_found",
    )


def test_logit_bias_is_refused_before_any_upstream_call(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "x", "logit_bias": {"1": 2}})
    assert_error(
        resp,
        "/v1/completions",
        status=400,
        type="invalid_request_error",
        message="Parameter 'logit_bias' is not supported by provider 'local'",
        param="logit_bias",
        code="unsupported_parameter",
    )
    assert upstream.received == []


def test_logprobs_of_a_character_split_over_tokens(api: httpx.Client, upstream: Upstream) -> None:
    """api/types.go's `TokenLogprob.bytes` hold a token whose `token` JSON cannot (Go writes a piece of a
    character as U+FFFD): the client gets each piece named by its bytes, every alternative kept, and offsets
    that count the character once. The recorded answer, its text and `logprobs` in that documented shape (no
    recording has logprobs)."""
    answer = fixture_json("ollama/generate_nonstream.json")
    answer["response"] = "café!"

    def entry(token: str, raw: bytes, value: float) -> dict[str, object]:
        return {"token": token, "logprob": value, "bytes": list(raw)}

    answer["logprobs"] = [
        {**entry("caf", b"caf", -0.5), "top_logprobs": [entry("caf", b"caf", -0.5)]},
        {
            **entry("\ufffd", b"\xc3", -0.25),
            "top_logprobs": [entry("\ufffd", b"\xc3", -0.25), entry("\ufffd", b"\xc4", -2.0)],
        },
        {**entry("\ufffd", b"\xa9", -0.125), "top_logprobs": [entry("\ufffd", b"\xa9", -0.125)]},
        {**entry("!", b"!", -1.0), "top_logprobs": [entry("!", b"!", -1.0), entry(".", b".", -1.5)]},
    ]
    upstream.handler = reply(json.dumps(answer).encode())
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "logprobs": 2})
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["text"] == "café!"
    assert choice["logprobs"] == {
        "tokens": ["caf", "bytes:\\xc3", "bytes:\\xa9", "!"],
        "token_logprobs": [-0.5, -0.25, -0.125, -1.0],
        "top_logprobs": [
            {"caf": -0.5},
            {"bytes:\\xc3": -0.25, "bytes:\\xc4": -2.0},
            {"bytes:\\xa9": -0.125},
            {"!": -1.0, ".": -1.5},
        ],
        "text_offset": [len(PROMPT), len(PROMPT) + 3, len(PROMPT) + 3, len(PROMPT) + 4],
    }
    assert upstream.only().json()["top_logprobs"] == 2
