"""Together `/v1/completions`: OpenAI's fields minus best_of/suffix/seed/user plus top_k; no stream_options.
Responses from the real Mixtral recording (`object: "text.completion"`, extra `prompt: []`)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from gateway.path.chat_request import normalize_chat
from providers.base import CallContext, Endpoint, map_params
from providers.retry_after import retry_after
from providers.together import TogetherAdapter
from tests.helpers.adapters import as_json, build, context, request
from tests.helpers.recordings import fixture_bytes, fixture_headers, fixture_json
from wire.chat import decode_chat
from wire.errors import InvalidRequestError, UnsupportedParamError

ADAPTER = TogetherAdapter()
MODEL = "mistralai/Mixtral-8x7B-Instruct-v0.1"
ENDPOINT = Endpoint(provider="together", model=MODEL, base_url=TogetherAdapter.default_base_url or "", api_key="tg")


def test_request_translation() -> None:
    req = request(
        f"together/{MODEL}",
        "Tell me a joke about opentelemetry",
        max_tokens=512,
        temperature=0.7,
        top_p=0.7,
        top_k=50,
        n=1,
        stop=["</s>"],
        logprobs=1,
        echo=True,
        logit_bias={"2": 1.5},
        frequency_penalty=0.1,
        presence_penalty=0.2,
    )
    up, body, _ = build(ADAPTER, req, ENDPOINT)
    assert up.url == "https://api.together.xyz/v1/completions"
    assert up.headers == {
        "content-type": "application/json",
        "accept": "application/json",
        "authorization": "Bearer tg",
    }
    assert body == {
        "model": MODEL,
        "prompt": "Tell me a joke about opentelemetry",
        "max_tokens": 512,
        "temperature": 0.7,
        "top_p": 0.7,
        "top_k": 50,
        "n": 1,
        "stop": ["</s>"],
        "logprobs": 1,
        # `echo` is the gateway's: Together would put the prompt beside the choices, not in their text.
        "logit_bias": {"2": 1.5},
        "frequency_penalty": 0.1,
        "presence_penalty": 0.2,
    }


@pytest.mark.parametrize("field,value", [("seed", 7), ("best_of", 2), ("suffix", "x"), ("user", "u")])
def test_refused_fields(field: str, value: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(**{field: value}), ENDPOINT)
    assert info.value.param == field
    assert info.value.message == f"Parameter '{field}' is not supported by provider 'together'"


def test_drop_policy() -> None:
    _, dropped = map_params(request(seed=1, best_of=2, suffix="s", user="u"), ADAPTER.params, "together", True)
    assert dropped == ["best_of", "suffix", "seed", "user"]


def test_stream_has_no_stream_options() -> None:
    up, body, _ = build(ADAPTER, request(stream=True, stream_options={"include_usage": True}), ENDPOINT)
    assert up.stream is True
    assert body == {"model": MODEL, "prompt": "Say this is a test", "stream": True}


def test_recording_normalizes_to_our_completion() -> None:
    recorded = fixture_json("together/completion_mixtral_length.json")
    out = ADAPTER.parse_response(fixture_bytes("together/completion_mixtral_length.json"), context())
    assert as_json(out) == {
        "object": "text_completion",
        "id": "cmpl-gateway-test-id",
        "created": 1717697868,
        "model": "client/model-string",
        "choices": [
            {"text": recorded["choices"][0]["text"], "index": 0, "logprobs": None, "finish_reason": "length"},
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 512, "total_tokens": 522},
    }
    assert out.choices[0].text.startswith(" User: Why did the OpenTelemetry developer go broke?")
    assert out.choices[0].text.endswith("ctx := context.Background()")
    assert len(out.choices[0].text) == 1566


def test_recorded_rate_limit_headers_carry_no_retry_hint() -> None:
    # x-ratelimit-reset: 1 with remaining 0 is a bucket reset time, not a retry-after the code reads.
    headers = fixture_headers("together/completion_mixtral_length.headers.json")
    assert headers["x-ratelimit-remaining"] == "0"
    assert retry_after(headers) is None
    err = ADAPTER.map_error(429, headers, b'{"error": {"message": "rate limited"}}', "together")
    assert err.status == 429 and err.retry_after is None


def test_up_to_twenty_logprobs() -> None:
    # Together's OpenAPI spec: `logprobs` is an integer from 0 to 20.
    TogetherAdapter().check(request(prompt="x", logprobs=20), "together")
    with pytest.raises(InvalidRequestError) as caught:
        TogetherAdapter().check(request(prompt="x", logprobs=21), "together")
    assert caught.value.param == "logprobs"


def _chat(body: dict[str, Any]) -> Any:
    return normalize_chat(
        decode_chat(msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}))
    )


@pytest.mark.parametrize(("asked", "sent"), [({"logprobs": True}, 1), ({"logprobs": True, "top_logprobs": 3}, 3)])
def test_chat_logprobs_are_sent_as_its_count(asked: dict[str, Any], sent: int) -> None:
    """Together's chat `logprobs` is the number of alternatives (together-python `ChatCompletionRequest`), not
    OpenAI's boolean and `top_logprobs`."""
    req = _chat(asked)
    assert ADAPTER.chat_params is not None
    params, _ = map_params(req, ADAPTER.chat_params, "together", False)
    up = ADAPTER.build_chat_request(req, Endpoint(provider="together", model="m", base_url="https://t/v1"), params)
    body = json.loads(up.body)
    assert body["logprobs"] == sent and "top_logprobs" not in body


@pytest.mark.parametrize("top", [0, 1])
def test_recorded_chat_logprobs_become_openais_chat_shape(top: int) -> None:
    recorded = fixture_json("together/chat_logprobs.json")["choices"][0]["logprobs"]
    ctx = CallContext(id="chatcmpl-t", created=1, model="m", logprobs=True, top_logprobs=top, chat=True)
    answer = ADAPTER.parse_chat_response(fixture_bytes("together/chat_logprobs.json"), ctx)
    (choice,) = answer.choices
    assert choice.message.content == "New York City is a vibrant and diverse destination with"
    assert choice.logprobs is not None and choice.logprobs.content is not None
    got = as_json(choice.logprobs)["content"]
    assert [t["token"] for t in got] == recorded["tokens"]
    assert [t["logprob"] for t in got] == recorded["token_logprobs"]
    assert [bytes(t["bytes"]).decode() for t in got] == recorded["tokens"]
    alternatives = [
        [{"token": k, "logprob": v, "bytes": list(k.encode())} for k, v in m.items()] for m in recorded["top_logprobs"]
    ]
    assert [t["top_logprobs"] for t in got] == [a[:top] for a in alternatives]


def test_a_chat_stream_chunks_bare_logprob_is_its_token() -> None:
    """In a stream Together sends each chunk's sampled token's logprob as a number (together-python
    `ChatCompletionChoicesChunk.logprobs: float`). The chunk is a recorded one (llama-stack's recordings,
    `tests/integration/recordings/responses/d85689907fec.json`, where it was null) with that number set."""
    data = (
        b'{"id":"oBUtQrM-62bZhn-9801a1ac2a5f9b29","choices":[{"delta":{"content":"The","function_call":null,'
        b'"refusal":null,"role":"assistant","tool_calls":null,"token_id":791},"finish_reason":null,"index":0,'
        b'"logprobs":-0.25,"text":"The","seed":null}],"created":1758039001,'
        b'"model":"meta-llama/Llama-3.3-70B-Instruct-Turbo-Free","object":"chat.completion.chunk",'
        b'"service_tier":null,"system_fingerprint":null,"usage":null}'
    )
    ctx = CallContext(id="chatcmpl-t", created=1, model="m", logprobs=True, chat=True)
    chunk = ADAPTER.parse_chat_event(None, data, ctx)
    assert chunk is not None
    assert as_json(chunk.choices[0].logprobs) == {
        "content": [{"token": "The", "logprob": -0.25, "bytes": [84, 104, 101], "top_logprobs": []}]
    }
    whole = data.replace(b'"logprobs":-0.25', b'"logprobs":-1')  # a whole number is a number too
    chunk = ADAPTER.parse_chat_event(None, whole, ctx)
    assert chunk is not None and as_json(chunk.choices[0].logprobs)["content"][0]["logprob"] == -1.0


def test_a_token_named_by_its_bytes_keeps_those_bytes() -> None:
    """A token that is part of a character is named `bytes:\\x..` (as the completions route names it): its
    chat `bytes` are those bytes, not the name's UTF-8."""
    body = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "é"},
                "logprobs": {"tokens": ["bytes:\\xc3", "bytes:\\xa9"], "token_logprobs": [-0.5, -0.25]},
                "finish_reason": "stop",
            }
        ]
    }
    ctx = CallContext(id="chatcmpl-t", created=1, model="m", logprobs=True, chat=True)
    answer = ADAPTER.parse_chat_response(json.dumps(body).encode(), ctx)
    assert answer.choices[0].logprobs is not None and answer.choices[0].logprobs.content is not None
    assert [t.bytes for t in answer.choices[0].logprobs.content] == [[0xC3], [0xA9]]
