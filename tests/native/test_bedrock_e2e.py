"""AWS Bedrock end to end: the gateway (uvicorn, real socket) in front of a loopback upstream replaying the real
Converse recordings (tests/fixtures/bedrock, see SOURCES.md) byte for byte, the ConverseStream body as its
recorded binary event-stream frames in odd-sized writes. Clients are the official `openai` SDK and raw httpx:
they ask for a legacy completion and get exactly the recorded text, finish reason and usage.

The loopback upstream checks every request's SigV4 signature the way AWS does: it rebuilds the canonical
request from the method, the raw path, the query, the signed headers and the body *as received*, derives the
key from the configured secret for region us-east-1 and service `bedrock`, and compares signatures. So what
the gateway signed is exactly what went on the wire (Host with its port, `:` in the model id, `%2F` in an
ARN)."""

from __future__ import annotations

import hashlib
import hmac
import json
import re

import httpx
import openai
import pytest
from aiohttp import web

from providers import sigv4
from tests.helpers.clients import sse_data
from tests.helpers.errors import assert_error
from tests.helpers.eventstream import exception, split_frames
from tests.helpers.recordings import fixture_bytes
from tests.helpers.upstreams import Handler, Received, Upstream, reply
from tests.providers.test_bedrock_response import RECORDED_TEXT

AKID = "AKIDEXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
API_KEY = "ABSKQmVkcm9ja0FQSUtleS1leGFtcGxl"
NOVA = "amazon.nova-micro-v1:0"
MODEL = "aws/" + NOVA
STREAM = "bedrock/converse_stream.eventstream"
CONFIG = """
unsupported_params: error
retries: {{attempts: 1}}
providers:
  aws:
    kind: bedrock
    region: us-east-1
    api_key: ${{AWS_ACCESS_KEY_ID}}:${{AWS_SECRET_ACCESS_KEY}}
    base_url: {url}
    models: [amazon.nova-micro-v1:0]
  awskey:
    kind: bedrock
    region: us-east-1
    api_key: ${{AWS_BEARER_TOKEN_BEDROCK}}
    base_url: {url}
"""
AUTH = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<akid>[A-Z0-9]+)/(?P<date>\d{8})/(?P<region>[a-z0-9-]+)/(?P<service>[a-z-]+)"
    r"/aws4_request, SignedHeaders=(?P<signed>[a-z0-9;-]+), Signature=(?P<signature>[0-9a-f]{64})$"
)


def check_sigv4(request: web.Request, body: bytes) -> str | None:
    """None when the request carries a valid SigV4 signature for AKID/SECRET in us-east-1 for `bedrock`."""
    m = AUTH.match(request.headers.get("authorization", ""))
    if m is None:
        return f"malformed authorization {request.headers.get('authorization')!r}"
    if (m["akid"], m["region"], m["service"]) != (AKID, "us-east-1", "bedrock"):
        return f"wrong credential scope {m.group(0)!r}"
    stamp = request.headers.get("x-amz-date", "")
    if stamp[:8] != m["date"]:
        return "x-amz-date does not match the credential date"
    signed = m["signed"].split(";")
    if not {"host", "x-amz-date", "content-type"} <= set(signed):
        return f"required headers unsigned: {signed}"
    headers = {name: request.headers.get(name, "") for name in signed}
    creq, _ = sigv4.canonical_request(
        request.method, request.raw_path.split("?")[0], request.query_string, headers, hashlib.sha256(body).hexdigest()
    )
    sts = sigv4.string_to_sign(stamp, sigv4.scope(m["date"], "us-east-1", "bedrock"), creq)
    key = sigv4.signing_key(SECRET, m["date"], "us-east-1", "bedrock")
    expected = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
    return None if hmac.compare_digest(expected, m["signature"]) else f"signature mismatch over:\n{creq}"


class Checked:
    """Wraps a handler: every request's signature verdict and raw path are kept for the test to assert."""

    def __init__(self) -> None:
        self.verdicts: list[str | None] = []
        self.raw_paths: list[str] = []

    def wrap(self, handler: Handler) -> Handler:
        async def checked(request: web.Request, received: Received) -> web.StreamResponse:
            self.verdicts.append(check_sigv4(request, received.body))
            self.raw_paths.append(request.raw_path)
            return await handler(request, received)

        return checked


def reply_eventstream(raw: bytes, size: int) -> Handler:
    """Stream the recorded event-stream bytes, `size` bytes per write (frames split anywhere)."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "application/vnd.amazon.eventstream"})
        await resp.prepare(request)
        for i in range(0, len(raw), size):
            await resp.write(raw[i : i + size])
        await resp.write_eof()
        return resp

    return handler


# The gateway's environment: the ${VAR}s CONFIG references.
GATEWAY_ENV = {"AWS_ACCESS_KEY_ID": AKID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_BEARER_TOKEN_BEDROCK": API_KEY}


def _assert_converse_call(upstream: Upstream, checked: Checked, operation: str, body: dict[str, object]) -> None:
    sent = upstream.only()
    assert (sent.method, sent.path, sent.query) == ("POST", f"/model/{NOVA}/{operation}", {})
    assert checked.verdicts == [None]
    assert checked.raw_paths == [f"/model/{NOVA}/{operation}"]
    assert sent.headers["content-type"] == "application/json"
    assert sent.json() == body


def test_openai_sdk_non_stream_recording_signed(oai: openai.OpenAI, upstream: Upstream) -> None:
    checked = Checked()
    upstream.handler = checked.wrap(reply(fixture_bytes("bedrock/converse_end_turn.json")))
    completion = oai.completions.create(model=MODEL, prompt="Hello!", temperature=0.2, stop=["\n\n"])
    assert completion.id.startswith("cmpl-")
    assert completion.object == "text_completion"
    assert completion.model == MODEL
    assert [(c.index, c.text, c.finish_reason, c.logprobs) for c in completion.choices] == [
        (
            0,
            "Hello there! How can I assist you today? Whether you have questions, need information, or just want "
            "to chat, I'm here to help. What's on your mind?",
            "stop",
            None,
        )
    ]
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens, completion.usage.total_tokens) == (
        7,
        39,
        46,
    )
    _assert_converse_call(
        upstream,
        checked,
        "converse",
        {
            "messages": [{"role": "user", "content": [{"text": "Hello!"}]}],
            "inferenceConfig": {"temperature": 0.2, "stopSequences": ["\n\n"]},
        },
    )


@pytest.mark.parametrize("size", [1, 7, 256, 100_000])
def test_openai_sdk_stream_recording_with_usage(oai: openai.OpenAI, upstream: Upstream, size: int) -> None:
    checked = Checked()
    upstream.handler = checked.wrap(reply_eventstream(fixture_bytes(STREAM), size))
    stream = oai.completions.create(
        model=MODEL,
        prompt="What is the capital of France?",
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in content) == RECORDED_TEXT
    assert [c.choices[0].finish_reason for c in content] == [None] * 29 + ["stop"]
    assert {c.id for c in chunks} == {chunks[0].id}
    assert {c.model for c in chunks} == {MODEL}
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (13, 82, 95)
    _assert_converse_call(
        upstream,
        checked,
        "converse-stream",
        {
            "messages": [{"role": "user", "content": [{"text": "What is the capital of France?"}]}],
            "inferenceConfig": {"temperature": 0},
        },
    )


def test_raw_stream_without_usage_request_ends_with_done(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply_eventstream(fixture_bytes(STREAM), 33)
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "Capital of France?", "stream": True})
    assert resp.status_code == 200, resp.text
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == RECORDED_TEXT
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    # The client did not ask for usage: the gateway strips it.
    assert all("usage" not in c for c in chunks)


def test_raw_non_stream_max_tokens_and_cache_recordings(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes("bedrock/converse_max_tokens.json"))
    resp = api.post(
        "/v1/completions", json={"model": MODEL, "prompt": "What is the capital of France?", "max_tokens": 5}
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body == {
        "object": "text_completion",
        "id": body["id"],
        "created": body["created"],
        "model": MODEL,
        "choices": [{"text": "The capital of France is", "index": 0, "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 13, "completion_tokens": 5, "total_tokens": 18},
    }
    assert resp.headers["x-gateway-provider"] == "aws"
    assert upstream.only().json()["inferenceConfig"] == {"maxTokens": 5}

    upstream.reset()
    upstream.handler = reply(fixture_bytes("bedrock/converse_cache_read.json"))
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "What is 2 + 3?"})
    assert resp.json()["usage"] == {
        "prompt_tokens": 1517,
        "completion_tokens": 5,
        "total_tokens": 1522,
        "prompt_tokens_details": {"cached_tokens": 1504},
    }


def test_bedrock_api_key_goes_as_bearer(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes("bedrock/converse_end_turn.json"))
    resp = api.post("/v1/completions", json={"model": "awskey/" + NOVA, "prompt": "Hello!"})
    assert resp.status_code == 200, resp.text
    sent = upstream.only()
    assert sent.headers["authorization"] == f"Bearer {API_KEY}"
    assert not [h for h in sent.headers if h.startswith("x-amz-")]


def test_arn_model_id_travels_as_one_segment_and_the_signature_holds(api: httpx.Client, upstream: Upstream) -> None:
    checked = Checked()
    upstream.handler = checked.wrap(reply(fixture_bytes("bedrock/converse_end_turn.json")))
    arn = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-micro-v1:0"
    resp = api.post("/v1/completions", json={"model": "aws/" + arn, "prompt": "Hello!"})
    assert resp.status_code == 200, resp.text
    assert checked.raw_paths == [
        "/model/arn:aws:bedrock:us-east-1:123456789012:inference-profile%2Fus.amazon.nova-micro-v1:0/converse"
    ]
    assert checked.verdicts == [None]


def test_recorded_throttling_reaches_the_client_as_429(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(
        fixture_bytes("bedrock/error_429_throttling.json"),
        status=429,
        headers={"x-amzn-ErrorType": "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"},
    )
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "hello"})
    assert_error(
        resp,
        "/v1/completions",
        status=429,
        type="rate_limit_error",
        message="aws error (429): Rate exceeded",
        code="throttling_exception",
    )


def test_recorded_invalid_model_error_reaches_the_client(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes("bedrock/error_400_invalid_model.json"), status=400)
    resp = api.post("/v1/completions", json={"model": "aws/us.does-not-exist-model-v1:0", "prompt": "hello"})
    assert_error(
        resp,
        "/v1/completions",
        status=400,
        type="invalid_request_error",
        message="aws error (400): The provided model identifier is invalid.",
        code="upstream_http_400",
    )


def test_exception_frame_mid_stream_becomes_an_error_event(api: httpx.Client, upstream: Upstream) -> None:
    frames = split_frames(fixture_bytes(STREAM))
    raw = frames[0] + frames[1] + exception("modelStreamErrorException", "Model stream error")
    upstream.handler = reply_eventstream(raw, 5)
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "Capital of France?", "stream": True})
    assert resp.status_code == 200
    data = sse_data(resp.text)
    assert json.loads(data[0])["choices"][0]["text"] == "The"
    assert json.loads(data[1]) == {
        "error": {
            "message": "bedrock error (424): Model stream error",
            "type": "upstream_error",
            "param": None,
            "code": "model_stream_error_exception",
        }
    }
    assert data[2:] == ["[DONE]"]


def test_temperature_above_one_and_logprobs_are_refused_before_any_call(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "x", "temperature": 1.5})
    assert_error(
        resp,
        "/v1/completions",
        status=400,
        type="invalid_request_error",
        message="Provider 'aws' accepts 'temperature' from 0 to 1, got 1.5",
        param="temperature",
        code="invalid_value",
    )
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "x", "logprobs": 2})
    assert_error(
        resp,
        "/v1/completions",
        status=400,
        type="invalid_request_error",
        message="Parameter 'logprobs' is not supported by provider 'aws'",
        param="logprobs",
        code="unsupported_parameter",
    )
    assert upstream.received == []


def test_n_and_echo_are_emulated_by_fanning_out(api: httpx.Client, upstream: Upstream) -> None:
    checked = Checked()
    upstream.handler = checked.wrap(reply(fixture_bytes("bedrock/converse_max_tokens.json")))
    prompt = "What is the capital of France? "
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "n": 2, "echo": True, "max_tokens": 5})
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"] == [
        {"text": prompt + "The capital of France is", "index": i, "logprobs": None, "finish_reason": "length"}
        for i in range(2)
    ]
    assert resp.json()["usage"] == {"prompt_tokens": 26, "completion_tokens": 10, "total_tokens": 36}
    # Two plain, separately signed Converse calls: neither n nor echo reaches Bedrock.
    assert checked.verdicts == [None, None]
    assert [r.json() for r in upstream.received] == [
        {"messages": [{"role": "user", "content": [{"text": prompt}]}], "inferenceConfig": {"maxTokens": 5}}
    ] * 2


def test_a_stop_string_the_model_kept_is_cut_by_the_gateway(oai: openai.OpenAI, upstream: Upstream) -> None:
    # Recorded: Nova micro answered exactly "Paris" to stopSequences ["Paris"], with stopReason end_turn.
    upstream.handler = reply(fixture_bytes("bedrock/converse_stop_nova_keeps_stop_text.json"))
    prompt = (
        'What is the capital of France? Give me an answer that contains the word "Paris", but is not the first word.'
    )
    completion = oai.completions.create(model=MODEL, prompt=prompt, stop=["Paris"])
    assert [(c.text, c.finish_reason) for c in completion.choices] == [("", "stop")]
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (25, 1)
    assert upstream.only().json()["inferenceConfig"] == {"stopSequences": ["Paris"]}
