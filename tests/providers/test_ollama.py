"""Ollama native `/api/generate`: the request translated field by field (raw continuation, stream always
explicit, options), the real openllmetry recordings (one JSON object; NDJSON lines fed in odd-sized chunks)
normalized value by value, and error mapping."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.upstream.framing import NDJSONDecoder
from providers.base import Endpoint
from providers.ollama import OllamaAdapter
from tests.helpers.adapters import as_json, build, chunked, context, request
from tests.helpers.recordings import fixture_bytes
from wire.errors import InvalidRequestError, UnsupportedParamError, UpstreamStatusError
from wire.schema import Completion

ADAPTER = OllamaAdapter()
ENDPOINT = Endpoint(provider="local-ollama", model="llama3", base_url="http://127.0.0.1:11434")
PROMPT = "Say this is a test"
BASE = {"model": "llama3", "prompt": PROMPT, "raw": True, "stream": False}
SCHEMA: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "integer"}}}
# The recordings' prompt (openllmetry test_ollama_generation_legacy).
JOKE = "Tell me a joke about OpenTelemetry"
NONSTREAM_TEXT = (
    "A niche topic!\n\nHere's one:\n\nWhy did the OpenTelemetry collector go to therapy?\n\nBecause it was "
    'struggling to "instrument" its problems and "scope" out some answers!\n\n(Sorry, I know that one was a '
    "bit of a stretch... but I hope it brought a smile to your face!)"
)


def body_for(**fields: Any) -> dict[str, Any]:
    _, body, _ = build(ADAPTER, request(**fields), ENDPOINT)
    return body


def test_every_native_field() -> None:
    up, body, dropped = build(
        ADAPTER,
        request(
            max_tokens=32,
            temperature=0.2,
            top_p=0.9,
            top_k=40,
            presence_penalty=0.1,
            frequency_penalty=0.3,
            seed=7,
            stop=["\n\n", "###"],
            logprobs=True,
            top_logprobs=20,
        ),
        ENDPOINT,
    )
    assert (up.method, up.url, up.stream, dropped) == ("POST", "http://127.0.0.1:11434/api/generate", False, [])
    assert up.headers == {"content-type": "application/json", "accept": "application/json"}
    assert body == {
        **BASE,
        "options": {
            "num_predict": 32,
            "temperature": 0.2,
            "top_p": 0.9,
            "top_k": 40,
            "presence_penalty": 0.1,
            "frequency_penalty": 0.3,
            "seed": 7,
            "stop": ["\n\n", "###"],
        },
        "logprobs": True,
        "top_logprobs": 20,
    }


def test_stream_is_always_explicit() -> None:
    # Ollama streams unless told otherwise: false must be sent, not omitted.
    assert body_for() == BASE
    up, body, _ = build(ADAPTER, request(stream=True), ENDPOINT)
    assert (up.stream, up.headers["accept"], body) == (True, "application/x-ndjson", {**BASE, "stream": True})


def test_logprobs_zero_is_the_sampled_tokens_alone() -> None:
    assert body_for(logprobs=0) == {**BASE, "logprobs": True, "top_logprobs": 0}


def test_suffix_turns_raw_off_so_the_fill_in_the_middle_template_runs() -> None:
    assert body_for(suffix="\n    return x") == {**BASE, "raw": False, "suffix": "\n    return x"}


@pytest.mark.parametrize(
    "fields,fmt",
    [
        ({"guided_json": SCHEMA}, SCHEMA),
        ({"response_format": {"type": "json_object"}}, "json"),
        ({"response_format": {"type": "json_object", "schema": SCHEMA}}, SCHEMA),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}}, SCHEMA),
    ],
)
def test_json_constraints_become_format(fields: dict[str, Any], fmt: Any) -> None:
    assert body_for(**fields) == {**BASE, "format": fmt}


def test_text_response_format_and_conflicts() -> None:
    assert body_for(response_format={"type": "text"}) == BASE
    with pytest.raises(InvalidRequestError):
        build(ADAPTER, request(guided_json=SCHEMA, response_format={"type": "json_object"}), ENDPOINT)


@pytest.mark.parametrize(
    "field,value",
    [
        ("n", 2),
        ("best_of", 3),
        ("echo", True),
        ("include_stop_str_in_output", True),
        ("guided_regex", "[a-z]+"),
        ("guided_choice", ["a", "b"]),
        ("guided_grammar", 'root ::= "a"'),
    ],
)
def test_emulated_fields_are_accepted_and_not_sent(field: str, value: Any) -> None:
    assert body_for(**{field: value}) == BASE


@pytest.mark.parametrize(
    "field,value",
    [("logit_bias", {"1": 5}), ("user", "u"), ("images", ["data:image/png;base64,AA=="])],
)
def test_fields_ollama_lacks_are_refused(field: str, value: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(**{field: value}), ENDPOINT)
    assert info.value.param == field
    assert info.value.message == f"Parameter '{field}' is not supported by provider 'local-ollama'"


def test_capabilities() -> None:
    emulated = {k for k, p in ADAPTER.params.items() if p.emulated}
    assert emulated == {
        "n",
        "best_of",
        "echo",
        "include_stop_str_in_output",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
    }
    assert (ADAPTER.framing, ADAPTER.default_base_url, ADAPTER.needs_api_key) == (
        "ndjson",
        "http://127.0.0.1:11434",
        False,
    )
    assert (ADAPTER.max_logprobs, ADAPTER.max_stop, ADAPTER.prompt_forms) == (20, None, frozenset({"text"}))
    with pytest.raises(UnsupportedParamError):
        build(ADAPTER, request(prompt=[1, 2, 3]), ENDPOINT)


def test_key_headers_extra_params_merge_into_options_and_default_limit() -> None:
    endpoint = Endpoint(
        provider="cloud",
        model="gpt-oss:120b",
        base_url="https://ollama.com/",
        api_key="ok-1",
        default_max_tokens=512,
    )
    req = request(
        temperature=0.5,
        inference_extra_params={"options": {"num_ctx": 8192}, "keep_alive": "5m"},
        inference_extra_headers={"X-Req": "1"},
    )
    up, body, _ = build(ADAPTER, req, endpoint)
    assert up.url == "https://ollama.com/api/generate"
    assert up.headers == {
        "content-type": "application/json",
        "accept": "application/json",
        "x-req": "1",
        "authorization": "Bearer ok-1",
    }
    assert body == {
        "model": "gpt-oss:120b",
        "prompt": PROMPT,
        "raw": True,
        "stream": False,
        "options": {"temperature": 0.5, "num_predict": 512, "num_ctx": 8192},
        "keep_alive": "5m",
    }


# ------------------------------------------------------------------------------------------------
# Responses


def test_recorded_non_stream_response() -> None:
    out = ADAPTER.parse_response(fixture_bytes("ollama/generate_nonstream.json"), context([JOKE]))
    assert as_json(out) == {
        "object": "text_completion",
        "id": "cmpl-gateway-test-id",
        "created": 1_700_000_000,
        "model": "client/model-string",
        "choices": [{"text": NONSTREAM_TEXT, "index": 0, "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 17, "completion_tokens": 63, "total_tokens": 80},
    }


def _lines(raw: bytes, chunk_size: int, ctx_prompt: str = JOKE) -> list[Completion | None]:
    ctx = context([ctx_prompt])
    decoder = NDJSONDecoder()
    events = [e for part in chunked(raw, chunk_size) for e in decoder.feed(part)] + decoder.close()
    return [ADAPTER.parse_event(name, data, ctx) for name, data in events]


def _recorded_pieces() -> list[str]:
    return [json.loads(line)["response"] for line in fixture_bytes("ollama/generate_stream.ndjson").splitlines()]


@pytest.mark.parametrize("chunk_size", [1, 7, 61, 333, 100_000])
def test_recorded_stream(chunk_size: int) -> None:
    chunks = _lines(fixture_bytes("ollama/generate_stream.ndjson"), chunk_size)
    assert all(c is not None for c in chunks)
    pieces = _recorded_pieces()
    assert len(chunks) == len(pieces) == 71
    assert [c.choices[0].text for c in chunks if c is not None] == pieces
    assert "".join(pieces).startswith("A joke about OpenTelemetry! Here's one:\n\nWhy did the OpenTelemetry Span go")
    assert [c.choices[0].finish_reason for c in chunks if c is not None] == [None] * 70 + ["stop"]
    assert [c.usage for c in chunks[:-1] if c is not None] == [None] * 70
    last = chunks[-1]
    assert last is not None and last.choices[0].text == ""
    assert as_json(last.usage) == {"prompt_tokens": 17, "completion_tokens": 71, "total_tokens": 88}
    assert {(c.id, c.model, c.created, c.choices[0].index) for c in chunks if c is not None} == {
        ("cmpl-gateway-test-id", "client/model-string", 1_700_000_000, 0)
    }


def test_length_and_a_missing_done_reason() -> None:
    # done_reason "length" (llm/server.go); before done_reason existed, done meant a normal end.
    length = b'{"model":"llama3","response":"","done":true,"done_reason":"length","prompt_eval_count":3,"eval_count":8}'
    out = ADAPTER.parse_response(length, context(["x"]))
    assert (out.choices[0].finish_reason, as_json(out.usage)) == (
        "length",
        {"prompt_tokens": 3, "completion_tokens": 8, "total_tokens": 11},
    )
    old = b'{"model":"llama3","response":"hi","done":true,"eval_count":1}'
    assert ADAPTER.parse_response(old, context(["x"])).choices[0].finish_reason == "stop"


def _with_logprobs(top: bool) -> bytes:
    """The first recorded stream lines with `logprobs` added as api/types.go defines it (Logprob: token,
    logprob, bytes, top_logprobs); no recording has logprobs."""
    lines = [json.loads(line) for line in fixture_bytes("ollama/generate_stream.ndjson").splitlines()[:3]]
    values = [-0.25, -1.5, -0.75]
    for line, value in zip(lines, values, strict=True):
        entry: dict[str, Any] = {"token": line["response"], "logprob": value, "bytes": list(line["response"].encode())}
        if top:
            entry["top_logprobs"] = [
                {"token": line["response"], "logprob": value},
                {"token": "?", "logprob": value - 2},
            ]
        line["logprobs"] = [entry]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


@pytest.mark.parametrize("chunk_size", [1, 50, 10_000])
def test_stream_logprobs_with_alternatives(chunk_size: int) -> None:
    chunks = [c for c in _lines(_with_logprobs(top=True), chunk_size, "Q: ") if c is not None]
    lps = [as_json(c.choices[0].logprobs) for c in chunks]
    assert lps == [
        {"tokens": ["A"], "token_logprobs": [-0.25], "top_logprobs": [{"A": -0.25, "?": -2.25}], "text_offset": [3]},
        {
            "tokens": [" joke"],
            "token_logprobs": [-1.5],
            "top_logprobs": [{" joke": -1.5, "?": -3.5}],
            "text_offset": [4],
        },
        {
            "tokens": [" about"],
            "token_logprobs": [-0.75],
            "top_logprobs": [{" about": -0.75, "?": -2.75}],
            "text_offset": [9],
        },
    ]


def test_logprobs_without_alternatives_have_no_top_logprobs() -> None:
    chunks = [c for c in _lines(_with_logprobs(top=False), 4096, "") if c is not None]
    assert [as_json(c.choices[0].logprobs) for c in chunks] == [
        {"tokens": ["A"], "token_logprobs": [-0.25], "top_logprobs": None, "text_offset": [0]},
        {"tokens": [" joke"], "token_logprobs": [-1.5], "top_logprobs": None, "text_offset": [1]},
        {"tokens": [" about"], "token_logprobs": [-0.75], "top_logprobs": None, "text_offset": [6]},
    ]


def test_error_line_inside_a_stream_raises() -> None:
    with pytest.raises(UpstreamStatusError) as info:
        ADAPTER.parse_event(None, b'{"error":"an error was encountered while running the model"}', context(["x"]))
    err = info.value
    assert (err.upstream_status, err.status, err.retryable) == (500, 502, True)
    assert err.message == "ollama error (500): an error was encountered while running the model"


# ------------------------------------------------------------------------------------------------
# Errors (bodies as server/routes.go writes them, {"error": "..."}; none is recorded)


@pytest.mark.parametrize(
    "status,message,code,client,retryable",
    [
        (404, "model 'llama9' not found", "model_not_found", 404, False),
        (429, "too many requests", None, 429, True),
        (503, "server busy, please try again.  maximum pending requests exceeded", None, 502, True),
        (400, "invalid options", None, 400, False),
    ],
)
def test_error_mapping(status: int, message: str, code: str | None, client: int, retryable: bool) -> None:
    body = json.dumps({"error": message}).encode()
    err = ADAPTER.map_error(status, {"retry-after": "2"}, body, "local-ollama")
    assert isinstance(err, UpstreamStatusError)
    assert err.message == f"local-ollama error ({status}): {message}"
    assert (err.code, err.status, err.retryable, err.retry_after) == (code, client, retryable, 2.0)
    assert (err.quota, err.context_window) == (False, False)


def test_non_json_error_body() -> None:
    err = ADAPTER.map_error(502, {}, b"Bad Gateway\n", "local-ollama")
    assert err.message == "local-ollama error (502): Bad Gateway"
