"""Mistral chat (`/v1/chat/completions`) and FIM (`/v1/fim/completions`, when `suffix` is set): request
translation field by field, normalization of real recordings, error and rate-limit header mapping.

Recordings: tests/fixtures/mistral (see SOURCES.md) and the streamed chat below, quoted from a public cassette.
No FIM response was ever recorded: its test parses the SDK-typed shape and says so.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.upstream.framing import SSEDecoder
from providers.base import PARAM_FIELDS, Endpoint, map_params
from providers.mistral import MistralAdapter, RateLimit, rate_limits
from tests.helpers.adapters import NATIVE, as_json, build, chunked, context, request
from tests.helpers.recordings import fixture_bytes, fixture_headers, fixture_json
from wire.errors import InvalidRequestError, UnsupportedParamError, UpstreamStatusError

ADAPTER = MistralAdapter()
MODEL = "mistral-tiny"
KEY = "ms-test-key"
ENDPOINT = Endpoint(provider="mistral", model=MODEL, base_url=MistralAdapter.default_base_url or "", api_key=KEY)
CHAT = "mistral/chat_with_ratelimit_headers.json"
HEADERS = "mistral/chat_with_ratelimit_headers.headers.json"
PROMPT = "Tell me a joke about OpenTelemetry"

# traceloop/openllmetry @45af4941301c packages/opentelemetry-instrumentation-mistralai/tests/cassettes/test_chat/
# test_mistralai_streaming_chat_legacy.yaml (#0): the first ten and the last three events of the recorded
# stream plus its end marker, verbatim after YAML decoding (the content events in between are left out).
_ID = '"id":"6dc321029f5d4aa5899c1b38c9657a61","object":"chat.completion.chunk","created":1757759492'
STREAM_EVENTS: list[bytes] = [
    (
        "data: {" + _ID + ',"model":"mistral-tiny","choices":[{"index":0,"delta":{"role":"assistant","content":""},'
        '"finish_reason":null}]}'
    ).encode(),
    *(
        (
            "data: {"
            + _ID
            + ',"model":"mistral-tiny","choices":[{"index":0,"delta":{"content":'
            + json.dumps(text)
            + '},"finish_reason":null}],"p":"'
            + pad
            + '"}'
        ).encode()
        for text, pad in [
            ("Here", "abcdefghijklmnopqrstuvwxyz01234"),
            ("'", "abcde"),
            ("s", "abcdefghijklmnopqr"),
            (" a", "abcdefghijkl"),
            (" light", "abcdefghijklm"),
            ("-", "abcdefghijklm"),
            ("heart", "abcdefghijklmn"),
            ("ed", "abcdefghijklmnopqrs"),
            (" joke", "abcdefghijklm"),
            (" face", "abcdefghijklmnopqrstuvwxyz012345"),
            (".)", "abcdefghijk"),
        ]
    ),
    (
        "data: {"
        + _ID
        + ',"model":"mistral-tiny","choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}],'
        '"usage":{"prompt_tokens":11,"total_tokens":91,"completion_tokens":80},"p":"abcdefghijklmnopqrst"}'
    ).encode(),
    b"data: [DONE]",
]
STREAM_TEXTS = ["Here", "'", "s", " a", " light", "-", "heart", "ed", " joke", " face", ".)"]

EMULATED_FIELDS = {
    "echo",
    "best_of",
    "include_stop_str_in_output",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
}
REFUSED: dict[str, Any] = {
    "logprobs": 1,
    "top_k": 40,
    "logit_bias": {"50256": -100},
    "user": "u-1",
    "images": ["data:image/png;base64,AAAA"],
    "context_length_exceeded_behavior": "error",
    "audio": {"voice": "alloy"},
    "modalities": ["text"],
    "tools": [{"type": "function"}],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "prediction": {"type": "content"},
    **NATIVE,
}
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def encode(value: Any) -> bytes:
    return json.dumps(value).encode()


def with_choice(**changes: Any) -> bytes:
    """The recorded chat completion with its one choice changed (documented fields only)."""
    body = fixture_json(CHAT)
    body["choices"][0].update(changes)
    return encode(body)


# -- chat request translation ----------------------------------------------------------------------


def test_every_native_chat_field() -> None:
    req = request(
        f"mistral/{MODEL}",
        PROMPT,
        max_tokens=96,
        temperature=0.3,
        top_p=0.95,
        stop=["\n\n"],
        seed=42,
        presence_penalty=0.1,
        frequency_penalty=0.2,
        n=2,
    )
    up, body, dropped = build(ADAPTER, req, ENDPOINT)
    assert up.method == "POST"
    assert up.url == "https://api.mistral.ai/v1/chat/completions"
    assert up.stream is False
    assert up.headers == {
        "content-type": "application/json",
        "accept": "application/json",
        "authorization": f"Bearer {KEY}",
    }
    assert dropped == []
    assert body == {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 96,
        "temperature": 0.3,
        "top_p": 0.95,
        "n": 2,
        "stop": ["\n\n"],
        "random_seed": 42,
        "frequency_penalty": 0.2,
        "presence_penalty": 0.1,
    }


def test_stream_request() -> None:
    up, body, _ = build(ADAPTER, request(prompt=PROMPT, stream=True, stream_options={"include_usage": True}), ENDPOINT)
    assert up.stream is True
    assert up.headers["accept"] == "text/event-stream"
    # As the recorded request: no stream_options, usage comes on the finish chunk regardless.
    assert body == {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "stream": True}


def test_config_and_request_headers_and_extra_params() -> None:
    endpoint = Endpoint(
        provider="mistral", model=MODEL, base_url="http://127.0.0.1:9/m/", api_key=KEY, headers={"X-Org": "o1"}
    )
    req = request(inference_extra_headers={"X-Trace": "t"}, inference_extra_params={"safe_prompt": True})
    up, body, _ = build(ADAPTER, req, endpoint)
    assert up.url == "http://127.0.0.1:9/m/v1/chat/completions"
    assert up.headers == {
        "content-type": "application/json",
        "accept": "application/json",
        "x-org": "o1",
        "x-trace": "t",
        "authorization": f"Bearer {KEY}",
    }
    assert body["safe_prompt"] is True


@pytest.mark.parametrize(
    "response_format,sent",
    [
        ({"type": "json_object"}, {"type": "json_object"}),
        (
            {"type": "json_object", "schema": SCHEMA},
            {"type": "json_schema", "json_schema": {"name": "output", "schema": SCHEMA, "strict": True}},
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "book", "schema": SCHEMA, "strict": True}},
            {"type": "json_schema", "json_schema": {"name": "book", "schema": SCHEMA, "strict": True}},
        ),
        ({"type": "text"}, {"type": "text"}),
    ],
)
def test_response_format(response_format: dict[str, Any], sent: dict[str, Any]) -> None:
    _, body, _ = build(ADAPTER, request(response_format=response_format), ENDPOINT)
    assert body["response_format"] == sent


def test_response_format_it_cannot_express_is_refused() -> None:
    with pytest.raises(InvalidRequestError) as info:
        build(ADAPTER, request(response_format={"type": "grammar", "grammar": "root ::= x"}), ENDPOINT)
    assert info.value.param == "response_format"


def test_guided_json_is_a_strict_json_schema() -> None:
    _, body, _ = build(ADAPTER, request(guided_json=SCHEMA), ENDPOINT)
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": SCHEMA, "strict": True},
    }


@pytest.mark.parametrize(
    "field,value",
    [
        ("echo", True),
        ("best_of", 2),
        ("include_stop_str_in_output", True),
        ("guided_regex", "[0-9]+"),
        ("guided_choice", ["yes", "no"]),
        ("guided_grammar", "root ::= 'a'"),
    ],
)
def test_emulated_fields_write_nothing(field: str, value: Any) -> None:
    _, body, dropped = build(ADAPTER, request(**{field: value}), ENDPOINT)
    assert body == {"model": MODEL, "messages": [{"role": "user", "content": "Say this is a test"}]}
    assert dropped == []
    assert ADAPTER.params[field].emulated


@pytest.mark.parametrize("field,value", sorted(REFUSED.items()))
def test_refused_fields(field: str, value: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(**{field: value}), ENDPOINT)
    assert info.value.param == field
    assert info.value.message == f"Parameter '{field}' is not supported by provider 'mistral'"


def test_drop_policy_lists_what_it_dropped() -> None:
    _, dropped = map_params(request(top_k=5, logprobs=2, user="u"), ADAPTER.params, "mistral", True)
    assert dropped == ["top_k", "logprobs", "user"]


def test_every_canonical_field_is_mapped_emulated_or_refused() -> None:
    assert EMULATED_FIELDS <= set(ADAPTER.params)
    assert set(ADAPTER.params) | set(REFUSED) == set(PARAM_FIELDS)
    assert not (set(ADAPTER.params) & set(REFUSED))


@pytest.mark.parametrize("prompt", [["a", "b"], [1, 2, 3]])
def test_only_one_text_prompt_per_call(prompt: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        ADAPTER.check(request(prompt=prompt), "mistral")
    assert info.value.param == "prompt"


# -- FIM request translation -----------------------------------------------------------------------


def test_suffix_switches_to_fim() -> None:
    req = request(
        "mistral/codestral-latest",
        "def fib(n):\n",
        suffix="\nprint(fib(10))",
        max_tokens=64,
        temperature=0.0,
        top_p=1.0,
        stop=["\n\n"],
        seed=3,
        n=1,
        stream=True,
    )
    endpoint = Endpoint(provider="mistral", model="codestral-latest", base_url=ENDPOINT.base_url, api_key=KEY)
    up, body, _ = build(ADAPTER, req, endpoint)
    assert up.url == "https://api.mistral.ai/v1/fim/completions"
    assert up.headers["authorization"] == f"Bearer {KEY}"
    # n=1 is FIM's only behaviour, so it is not sent (FIMCompletionRequest has no `n`).
    assert body == {
        "model": "codestral-latest",
        "prompt": "def fib(n):\n",
        "suffix": "\nprint(fib(10))",
        "max_tokens": 64,
        "temperature": 0.0,
        "top_p": 1.0,
        "stop": ["\n\n"],
        "random_seed": 3,
        "stream": True,
    }


@pytest.mark.parametrize(
    "field,value",
    [
        ("n", 2),
        ("presence_penalty", 0.5),
        ("frequency_penalty", 0.5),
        ("response_format", {"type": "json_object"}),
        ("guided_json", SCHEMA),
    ],
)
def test_chat_only_fields_are_refused_with_suffix(field: str, value: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(suffix="x", **{field: value}), ENDPOINT)
    assert info.value.param == field
    assert info.value.message == (
        f"Parameter '{field}' is not supported by provider 'mistral' together with 'suffix' (Mistral FIM completions)"
    )


# -- responses -------------------------------------------------------------------------------------


def test_recording_normalizes_to_our_completion() -> None:
    recorded = fixture_json(CHAT)
    out = ADAPTER.parse_response(fixture_bytes(CHAT), context([PROMPT]))
    assert as_json(out) == {
        "object": "text_completion",
        "id": "cmpl-gateway-test-id",
        "created": 1757759489,
        "model": "client/model-string",
        "choices": [
            {
                "text": recorded["choices"][0]["message"]["content"],
                "index": 0,
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 96, "total_tokens": 107},
    }
    assert out.choices[0].text.startswith("Here's a light-hearted, tech-themed joke related to OpenTelemetry:")


@pytest.mark.parametrize("size", [1, 9, 100, 65536])
def test_recorded_stream_in_odd_sized_chunks(size: int) -> None:
    raw = b"".join(e + b"\n\n" for e in STREAM_EVENTS)
    decoder = SSEDecoder()
    pairs: list[tuple[str | None, bytes]] = []
    for piece in chunked(raw, size):
        pairs += decoder.feed(piece)
    pairs += decoder.close()
    assert len(pairs) == len(STREAM_EVENTS)
    ctx = context([PROMPT])
    parsed = [ADAPTER.parse_event(name, data, ctx) for name, data in pairs]
    # The role-only opening chunk and `[DONE]` produce nothing.
    assert parsed[0] is None and parsed[-1] is None
    chunks = [as_json(c) for c in parsed[1:-1] if c is not None]
    assert [c["choices"][0]["text"] for c in chunks] == [*STREAM_TEXTS, ""]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * len(STREAM_TEXTS) + ["stop"]
    assert [c.get("usage") for c in chunks] == [None] * len(STREAM_TEXTS) + [
        {"prompt_tokens": 11, "completion_tokens": 80, "total_tokens": 91}
    ]
    assert {c["created"] for c in chunks} == {1757759492}
    assert all("p" not in c for c in chunks)


@pytest.mark.parametrize(
    "raw,expected", [("stop", "stop"), ("length", "length"), ("model_length", "length"), ("tool_calls", "stop")]
)
def test_finish_reasons(raw: str, expected: str) -> None:
    out = ADAPTER.parse_response(with_choice(finish_reason=raw), context([PROMPT]))
    assert out.choices[0].finish_reason == expected


def test_finish_reason_error_is_an_upstream_failure() -> None:
    with pytest.raises(UpstreamStatusError) as info:
        ADAPTER.parse_response(with_choice(finish_reason="error"), context([PROMPT]))
    assert info.value.retryable
    assert info.value.status == 502
    last = json.loads(STREAM_EVENTS[-2][len(b"data: ") :])
    last["choices"][0]["finish_reason"] = "error"
    with pytest.raises(UpstreamStatusError):
        ADAPTER.parse_event(None, encode(last), context([PROMPT]))


def test_content_chunks_keep_only_text() -> None:
    # Documented shape (AssistantMessage.content may be a list of ContentChunk): reasoning models send
    # `thinking` chunks before the `text` ones.
    content = [
        {"type": "thinking", "thinking": [{"type": "text", "text": "A pun on traces."}]},
        {"type": "text", "text": "Why did the span "},
        {"type": "text", "text": "cross the road?"},
    ]
    out = ADAPTER.parse_response(with_choice(message={"role": "assistant", "content": content}), context([PROMPT]))
    assert out.choices[0].text == "Why did the span cross the road?"


def test_null_content() -> None:
    out = ADAPTER.parse_response(with_choice(message={"role": "assistant", "content": None}), context([PROMPT]))
    assert out.choices[0].text == ""


def test_fim_response_is_parsed_as_the_sdk_types_it() -> None:
    # NOT a recording: no FIM response was ever recorded. client-python types FIMCompletionResponse as
    # {id, object, model, usage, created, choices: ChatCompletionChoice[]}; this is the recorded chat body
    # relabelled with the FIM model, to pin that the chat shape is what the adapter reads.
    body = fixture_json(CHAT)
    body["model"] = "codestral-latest"
    body["choices"][0]["message"]["content"] = "    return n if n < 2 else fib(n - 1) + fib(n - 2)"
    out = ADAPTER.parse_response(encode(body), context(["def fib(n):\n"]))
    assert out.choices[0].text == "    return n if n < 2 else fib(n - 1) + fib(n - 2)"
    assert out.choices[0].finish_reason == "stop"


def test_cached_tokens_when_reported() -> None:
    # Not recorded for Mistral: the OpenAI-style prompt_tokens_details is read if it ever appears.
    body = fixture_json(CHAT)
    body["usage"]["prompt_tokens_details"] = {"cached_tokens": 8}
    out = as_json(ADAPTER.parse_response(encode(body), context([PROMPT])))
    assert out["usage"] == {
        "prompt_tokens": 11,
        "completion_tokens": 96,
        "total_tokens": 107,
        "prompt_tokens_details": {"cached_tokens": 8},
    }


# -- rate-limit headers and errors -----------------------------------------------------------------


def test_recorded_rate_limit_headers() -> None:
    limits = rate_limits(fixture_headers(HEADERS))
    assert limits == {
        "req-10-second": RateLimit(limit=60, remaining=59),
        "tokens-minute": RateLimit(limit=2_000_000, remaining=1_999_893),
        "tokens-month": RateLimit(limit=10_000_000_000, remaining=9_999_999_893),
    }


def exhausted(bucket: str) -> dict[str, str]:
    """The recorded headers with one bucket's remaining count at zero (as a 429 would report it)."""
    headers = fixture_headers(HEADERS)
    headers[f"x-ratelimit-remaining-{bucket}"] = "0"
    return headers


# cline/cline#9085: the 429 body of the current API.
RATE_LIMITED = {
    "object": "error",
    "message": "Rate limit exceeded",
    "type": "rate_limited",
    "param": None,
    "code": "1300",
}


def test_429_with_retry_after() -> None:
    err = ADAPTER.map_error(429, {**fixture_headers(HEADERS), "retry-after": "3"}, encode(RATE_LIMITED), "mistral")
    assert isinstance(err, UpstreamStatusError)
    assert err.status == 429 and err.type == "rate_limit_error"
    assert err.retry_after == 3.0
    assert err.code == "1300"
    assert err.retryable and not err.quota
    assert err.message == "mistral error (429): Rate limit exceeded"


def test_429_with_recorded_headers_and_nothing_exhausted_has_no_hint() -> None:
    err = ADAPTER.map_error(429, fixture_headers(HEADERS), encode(RATE_LIMITED), "mistral")
    assert err.retry_after is None and err.retryable


@pytest.mark.parametrize("bucket,window", [("req-10-second", 10.0), ("tokens-minute", 60.0)])
def test_exhausted_window_bounds_the_wait(bucket: str, window: float) -> None:
    err = ADAPTER.map_error(429, exhausted(bucket), encode(RATE_LIMITED), "mistral")
    assert err.retry_after == window
    assert err.retryable and not err.quota


def test_exhausted_monthly_budget_is_a_quota() -> None:
    err = ADAPTER.map_error(429, exhausted("tokens-month"), encode(RATE_LIMITED), "mistral")
    assert err.quota and not err.retryable
    assert err.status == 429


def test_older_error_body() -> None:
    # pydantic/pydantic-ai#1885: {"message": "Requests rate limit exceeded"}.
    err = ADAPTER.map_error(429, {}, b'{"message":"Requests rate limit exceeded"}', "mistral")
    assert err.message == "mistral error (429): Requests rate limit exceeded"
    assert err.code is None and err.retryable


def test_context_window_wording() -> None:
    # Wording not recorded for Mistral (see the adapter): the OpenAI/vLLM phrase.
    body = {
        "object": "error",
        "message": "This model's maximum context length is 32768 tokens. However, you requested 40000 tokens.",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    err = ADAPTER.map_error(400, {}, encode(body), "mistral")
    assert err.context_window and not err.retryable
    assert err.code == "context_length_exceeded"


def test_structured_validation_message() -> None:
    body = {"object": "error", "message": {"detail": [{"loc": ["body", "top_p"], "msg": "bad"}]}, "type": "invalid"}
    err = ADAPTER.map_error(422, {}, encode(body), "mistral")
    assert err.status == 422
    assert err.message == 'mistral error (422): {"detail":[{"loc":["body","top_p"],"msg":"bad"}]}'


def test_auth_failure_is_the_gateways_problem() -> None:
    err = ADAPTER.map_error(401, {}, b'{"message":"Unauthorized","request_id":"r"}', "mistral")
    assert err.status == 502 and not err.retryable


def test_unparseable_error_body() -> None:
    err = ADAPTER.map_error(503, {}, b"upstream connect error", "mistral")
    assert err.message == "mistral error (503): upstream connect error"
    assert err.retryable
