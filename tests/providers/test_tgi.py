"""TGI native `/generate` and `/generate_stream`: the request translated field by field, the real recordings
(huggingface_hub cassettes: a JSON array of one GenerateResponse, the `data:`-without-space stream, the 422
body) and the text-generation-inference snapshots (client-parsed objects, used for values) normalized value
by value, and error mapping."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from gateway.upstream.framing import SSEDecoder
from providers.base import PARAM_FIELDS, Endpoint
from providers.tgi import TGIAdapter
from tests.helpers.adapters import as_json, build, chunked, context, request
from tests.helpers.recordings import fixture_bytes, fixture_json
from wire.errors import InvalidRequestError, UnsupportedParamError, UpstreamStatusError
from wire.schema import Completion

ADAPTER = TGIAdapter()
ENDPOINT = Endpoint(provider="hf-tgi", model="tgi", base_url="http://tgi.local:8080/")
PROMPT = "Say this is a test"
# What every request carries: details (finish reason, counts), no prompt echo, sampling unless greedy.
ALWAYS = {"details": True, "return_full_text": False, "do_sample": True}
NON_STREAM = {**ALWAYS, "decoder_input_details": True}
SCHEMA: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def body_for(**fields: Any) -> dict[str, Any]:
    _, body, _ = build(ADAPTER, request(**fields), ENDPOINT)
    return body


def test_every_native_field_lands_in_parameters() -> None:
    up, body, dropped = build(
        ADAPTER,
        request(
            max_tokens=16,
            temperature=0.7,
            top_p=0.9,
            top_k=20,
            frequency_penalty=0.5,
            seed=3,
            stop=["###", "\n\n"],
            logprobs=3,
        ),
        ENDPOINT,
    )
    assert (up.method, up.url, up.stream, dropped) == ("POST", "http://tgi.local:8080/generate", False, [])
    assert up.headers == {"content-type": "application/json", "accept": "application/json"}
    assert body == {
        "inputs": PROMPT,
        "parameters": {
            **NON_STREAM,
            "max_new_tokens": 16,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 20,
            "frequency_penalty": 0.5,
            "seed": 3,
            "stop": ["###", "\n\n"],
            "top_n_tokens": 3,
        },
    }


def test_bare_string_stop_becomes_a_list() -> None:
    assert body_for(stop="END")["parameters"]["stop"] == ["END"]


def test_temperature_zero_is_greedy_without_temperature_top_p_or_top_k() -> None:
    # TGI refuses temperature 0; its own /v1/completions sends do_sample false and no temperature.
    params = body_for(temperature=0, top_p=0.5, top_k=5, seed=1)["parameters"]
    assert params == {**NON_STREAM, "do_sample": False, "seed": 1}


def test_top_p_zero_is_greedy_too() -> None:
    params = body_for(top_p=0, temperature=0.8)["parameters"]
    assert params == {**NON_STREAM, "do_sample": False}


@pytest.mark.parametrize("fields", [{"top_p": 1}, {"top_k": 0}, {"top_k": -1}, {}])
def test_knobs_that_filter_nothing_are_left_out(fields: dict[str, Any]) -> None:
    # TGI refuses top_p >= 1 and top_k <= 0; both mean "no filtering", its default.
    assert body_for(**fields)["parameters"] == NON_STREAM


def test_logprobs_zero_asks_for_one_alternative() -> None:
    # TGI always returns token logprobs; alternatives are what tells the parser they were asked for.
    assert body_for(logprobs=0)["parameters"]["top_n_tokens"] == 1
    assert body_for(logprobs=True, top_logprobs=5)["parameters"]["top_n_tokens"] == 5


@pytest.mark.parametrize(
    "fields,grammar",
    [
        ({"guided_json": SCHEMA}, {"type": "json", "value": SCHEMA}),
        ({"guided_regex": "[0-9]{3}"}, {"type": "regex", "value": "[0-9]{3}"}),
        ({"response_format": {"type": "json_object", "schema": SCHEMA}}, {"type": "json", "value": SCHEMA}),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}},
            {"type": "json", "value": SCHEMA},
        ),
    ],
)
def test_constraints_become_a_grammar(fields: dict[str, Any], grammar: dict[str, Any]) -> None:
    assert body_for(**fields)["parameters"] == {**NON_STREAM, "grammar": grammar}


def test_guided_choice_is_an_escaped_alternation() -> None:
    params = body_for(guided_choice=["yes", "no (maybe)", "a.b|c", "1+1=2?", "[x]{y}^$*\\"])["parameters"]
    pattern = r"(yes|no \(maybe\)|a\.b\|c|1\+1=2\?|\[x\]\{y\}\^\$\*\\)"
    assert params["grammar"] == {"type": "regex", "value": pattern}


def test_text_response_format_asks_for_nothing() -> None:
    assert body_for(response_format={"type": "text"})["parameters"] == NON_STREAM


def test_schemaless_json_mode_is_refused_naming_the_provider() -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(response_format={"type": "json_object"}), ENDPOINT)
    assert info.value.param == "response_format"
    assert info.value.message == (
        "Provider 'hf-tgi' needs a JSON schema in 'response_format': "
        "TGI's JSON grammar cannot express schemaless JSON mode"
    )


def test_an_unknown_response_format_type_is_a_400() -> None:
    with pytest.raises(InvalidRequestError) as info:
        build(ADAPTER, request(response_format={"type": "yaml"}), ENDPOINT)
    assert info.value.param == "response_format"


def test_two_grammars_are_refused() -> None:
    both: dict[str, Any] = {
        "guided_json": SCHEMA,
        "response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}},
    }
    with pytest.raises(InvalidRequestError) as info:
        build(ADAPTER, request(**both), ENDPOINT)
    assert info.value.param == "response_format"


@pytest.mark.parametrize(
    "field,value",
    [
        ("n", 3),
        ("best_of", 2),
        ("echo", True),
        ("include_stop_str_in_output", True),
        ("guided_grammar", 'root ::= "a"'),
    ],
)
def test_emulated_fields_are_accepted_and_not_sent(field: str, value: Any) -> None:
    assert body_for(**{field: value}) == {"inputs": PROMPT, "parameters": NON_STREAM}


@pytest.mark.parametrize(
    "field,value",
    [
        ("presence_penalty", 0.5),
        ("logit_bias", {"50256": -100}),
        ("suffix", "tail"),
        ("user", "u-1"),
        ("images", ["data:image/png;base64,AA=="]),
        ("context_length_exceeded_behavior", "error"),
    ],
)
def test_fields_tgi_lacks_are_refused(field: str, value: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(**{field: value}), ENDPOINT)
    assert info.value.param == field
    assert info.value.message == f"Parameter '{field}' is not supported by provider 'hf-tgi'"


def test_table_covers_every_canonical_field_it_names() -> None:
    native = {
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "frequency_penalty",
        "seed",
        "stop",
        "logprobs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "response_format",
        "repetition_penalty",
        "typical_p",
        "truncate_prompt_tokens",
        "watermark",
    }
    emulated = {"n", "best_of", "echo", "include_stop_str_in_output", "guided_grammar"}
    assert {k for k, p in ADAPTER.params.items() if not p.emulated} == native
    assert {k for k, p in ADAPTER.params.items() if p.emulated} == emulated
    assert set(ADAPTER.params) <= set(PARAM_FIELDS)
    assert (ADAPTER.max_stop, ADAPTER.max_logprobs, ADAPTER.needs_api_key) == (4, 5, False)
    assert ADAPTER.default_base_url is None
    assert ADAPTER.stop_in_output is True


def test_only_a_single_text_prompt() -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(prompt=["a", "b"]), ENDPOINT)
    assert info.value.param == "prompt"
    with pytest.raises(UnsupportedParamError):
        build(ADAPTER, request(logprobs=True, top_logprobs=6), ENDPOINT)


def test_stream_goes_to_generate_stream_without_prefill_details() -> None:
    up, body, _ = build(ADAPTER, request(stream=True, max_tokens=5), ENDPOINT)
    assert (up.url, up.stream) == ("http://tgi.local:8080/generate_stream", True)
    assert up.headers["accept"] == "text/event-stream"
    # TGI refuses decoder_input_details on a stream.
    assert body == {"inputs": PROMPT, "parameters": {**ALWAYS, "max_new_tokens": 5}}


def test_key_headers_extra_params_and_default_max_tokens() -> None:
    endpoint = Endpoint(
        provider="hf-tgi",
        model="tgi",
        base_url="https://x.endpoints.huggingface.cloud",
        api_key="hf_key",
        headers={"X-Team": "a"},
        default_max_tokens=256,
    )
    req = request(
        inference_extra_params={"parameters": {"repetition_penalty": 1.2, "truncate": 100}},
        inference_extra_headers={"X-Trace": "t1"},
    )
    up, body, _ = build(ADAPTER, req, endpoint)
    assert up.url == "https://x.endpoints.huggingface.cloud/generate"
    assert up.headers == {
        "content-type": "application/json",
        "accept": "application/json",
        "x-team": "a",
        "x-trace": "t1",
        "authorization": "Bearer hf_key",
    }
    assert body == {
        "inputs": PROMPT,
        "parameters": {**NON_STREAM, "max_new_tokens": 256, "repetition_penalty": 1.2, "truncate": 100},
    }
    # A client's own limit wins over the configured default.
    _, body, _ = build(ADAPTER, request(max_tokens=7), endpoint)
    assert body["parameters"]["max_new_tokens"] == 7


# ------------------------------------------------------------------------------------------------
# Responses


def test_recorded_array_body_with_details() -> None:
    # flan-t5 (encoder-decoder): the prefill is the decoder start token, and TGI's text drops the space.
    out = ADAPTER.parse_response(fixture_bytes("tgi/generate_details_length.json"), context(["Hi"]))
    assert as_json(out) == {
        "object": "text_completion",
        "id": "cmpl-gateway-test-id",
        "created": 1_700_000_000,
        "model": "client/model-string",
        "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def test_recorded_best_of_body_keeps_the_best_sequence_only() -> None:
    out = ADAPTER.parse_response(fixture_bytes("tgi/generate_best_of.json"), context(["x"]))
    assert [(c.text, c.finish_reason) for c in out.choices] == [("5", "length")]
    assert as_json(out.usage) == {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}


@pytest.mark.parametrize(
    "snapshot,text,finish,usage",
    [
        # Request: stop_sequences=["test"], return_full_text=True; the stop string stays in the text.
        ("tgi/snapshot_generate_stop_sequence.json", "Test request failed: Error in test", "stop", (0, 5)),
        ("tgi/snapshot_generate_eos_token.json", "To sell things.", "stop", (1, 5)),
    ],
)
def test_snapshot_values(snapshot: str, text: str, finish: str, usage: tuple[int, int]) -> None:
    # Snapshots are client-parsed objects with the wire's field names: a single object, not an array.
    out = ADAPTER.parse_response(fixture_bytes(snapshot), context(["x"]))
    assert [(c.text, c.index, c.finish_reason, c.logprobs) for c in out.choices] == [(text, 0, finish, None)]
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (*usage, sum(usage))


def _with_top_tokens(snapshot: str) -> bytes:
    """A snapshot's details plus `top_tokens` (docs/openapi.json Details: one Token list per generated
    token). No recording has top_tokens: the alternatives are the snapshot's own tokens, shifted."""
    doc = fixture_json(snapshot)
    tokens = doc["details"]["tokens"]
    doc["details"]["top_tokens"] = [[tok, tokens[(i + 1) % len(tokens)]] for i, tok in enumerate(tokens)]
    return json.dumps([doc]).encode()


def test_logprobs_skip_special_tokens_and_count_offsets_from_the_prompt() -> None:
    prompt = "What is Deep Learning?"
    out = ADAPTER.parse_response(_with_top_tokens("tgi/snapshot_generate_eos_token.json"), context([prompt]))
    lp = out.choices[0].logprobs
    assert lp is not None
    # `</s>` (special) is not in the text, so not in the logprobs.
    assert lp.tokens == [" To", " sell", " things", "."]
    assert lp.token_logprobs == [-4.3554688, -7.7734375, -3.9257812, -2.4179688]
    assert lp.top_logprobs == [
        {" To": -4.3554688, " sell": -7.7734375},
        {" sell": -7.7734375, " things": -3.9257812},
        {" things": -3.9257812, ".": -2.4179688},
        {".": -2.4179688, "</s>": 0.0},
    ]
    start = len(prompt)
    assert lp.text_offset == [start, start + 3, start + 8, start + 15]


def test_a_body_of_several_generations_is_invalid() -> None:
    two = json.dumps(fixture_json("tgi/generate_details_length.json") * 2).encode()
    with pytest.raises(msgspec.ValidationError):
        ADAPTER.parse_response(two, context(["x"]))


# ------------------------------------------------------------------------------------------------
# Streams


def _events(raw: bytes, chunk_size: int, prompt: str = "x") -> list[Completion | None]:
    ctx = context([prompt])
    decoder = SSEDecoder()
    events = [e for part in chunked(raw, chunk_size) for e in decoder.feed(part)] + decoder.close()
    return [ADAPTER.parse_event(name, data, ctx) for name, data in events]


@pytest.mark.parametrize("chunk_size", [1, 2, 5, 17, 4096])
def test_recorded_stream_carries_finish_and_usage_on_its_last_event(chunk_size: int) -> None:
    parsed = _events(fixture_bytes("tgi/generate_stream_details.sse.txt"), chunk_size)
    assert len(parsed) == 1 and parsed[0] is not None
    assert as_json(parsed[0]) == {
        "object": "text_completion",
        "id": "cmpl-gateway-test-id",
        "created": 1_700_000_000,
        "model": "client/model-string",
        "choices": [{"text": " ", "index": 0, "logprobs": None, "finish_reason": "length"}],
        # This TGI sent no input_length in its stream details: prompt tokens unknown, 0.
        "usage": {"prompt_tokens": 0, "completion_tokens": 1, "total_tokens": 1},
    }


def _stream_from_snapshot() -> bytes:
    """The eos snapshot replayed as /generate_stream events (router/src/server.rs StreamResponse: token,
    top_tokens, generated_text and details on the last event only, details with input_length)."""
    doc = fixture_json("tgi/snapshot_generate_eos_token.json")
    tokens = doc["details"]["tokens"]
    events = []
    for i, tok in enumerate(tokens):
        last = i == len(tokens) - 1
        event = {
            "index": i + 1,
            "token": tok,
            "top_tokens": [tok],
            "generated_text": doc["generated_text"] if last else None,
            "details": {"finish_reason": "eos_token", "generated_tokens": 5, "seed": 0, "input_length": 7}
            if last
            else None,
        }
        events.append(b"data:" + json.dumps(event).encode() + b"\n\n")
    return b"".join(events)


@pytest.mark.parametrize("chunk_size", [1, 3, 64, 4096])
def test_stream_logprobs_offsets_run_across_events(chunk_size: int) -> None:
    prompt = "Why?"
    chunks = [c for c in _events(_stream_from_snapshot(), chunk_size, prompt) if c is not None]
    assert [c.choices[0].text for c in chunks] == [" To", " sell", " things", ".", ""]
    assert [c.choices[0].finish_reason for c in chunks] == [None, None, None, None, "stop"]
    assert [c.usage for c in chunks[:-1]] == [None] * 4
    assert as_json(chunks[-1].usage) == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
    lps = [c.choices[0].logprobs for c in chunks]
    assert all(lp is not None for lp in lps)
    assert [as_json(lp) for lp in lps] == [
        {"tokens": [" To"], "token_logprobs": [-4.3554688], "top_logprobs": [{" To": -4.3554688}], "text_offset": [4]},
        {
            "tokens": [" sell"],
            "token_logprobs": [-7.7734375],
            "top_logprobs": [{" sell": -7.7734375}],
            "text_offset": [7],
        },
        {
            "tokens": [" things"],
            "token_logprobs": [-3.9257812],
            "top_logprobs": [{" things": -3.9257812}],
            "text_offset": [12],
        },
        {"tokens": ["."], "token_logprobs": [-2.4179688], "top_logprobs": [{".": -2.4179688}], "text_offset": [19]},
        # The special `</s>` is not text: an empty logprobs entry on the finishing chunk.
        {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []},
    ]


def test_error_event_inside_a_stream_raises_with_the_status_of_its_type() -> None:
    data = b'{"error":"Model is overloaded","error_type":"overloaded"}'
    with pytest.raises(UpstreamStatusError) as info:
        ADAPTER.parse_event(None, data, context(["x"]))
    err = info.value
    assert (err.upstream_status, err.status, err.type, err.code) == (429, 429, "rate_limit_error", "overloaded")
    assert err.message == "tgi error (429): Model is overloaded"
    assert err.retryable is True
    generation = b'{"error":"Request failed during generation: CUDA OOM","error_type":"generation"}'
    with pytest.raises(UpstreamStatusError) as info:
        ADAPTER.parse_event(None, generation, context(["x"]))
    assert (info.value.upstream_status, info.value.retryable) == (424, False)


# ------------------------------------------------------------------------------------------------
# Errors


def test_recorded_422_is_a_context_window_error() -> None:
    err = ADAPTER.map_error(422, {}, fixture_bytes("tgi/error_422_validation.json"), "hf-tgi")
    assert isinstance(err, UpstreamStatusError)
    expected = (422, "invalid_request_error", "context_length_exceeded", "hf-tgi")
    assert (err.status, err.type, err.code, err.provider) == expected
    assert err.message == (
        "hf-tgi error (422): Input validation error: `inputs` tokens + `max_new_tokens` must be <= 1512. "
        "Given: 2 `inputs` tokens and 10000 `max_new_tokens`"
    )
    assert err.context_window is True
    assert err.retryable is False


@pytest.mark.parametrize(
    "status,body,code,retryable,client",
    [
        (429, {"error": "Model is overloaded", "error_type": "overloaded"}, "overloaded", True, 429),
        (424, {"error": "Request failed during generation", "error_type": "generation"}, "generation", False, 502),
        (
            500,
            {"error": "Incomplete generation", "error_type": "incomplete_generation"},
            "incomplete_generation",
            True,
            502,
        ),
        (
            422,
            {"error": "Input validation error: `top_p` must be > 0.0 and < 1.0", "error_type": "validation"},
            "validation",
            False,
            422,
        ),
    ],
)
def test_error_types_from_server_rs(status: int, body: dict[str, str], code: str, retryable: bool, client: int) -> None:
    # Bodies as router/src/server.rs documents them ({"error", "error_type"}); not recorded.
    err = ADAPTER.map_error(status, {"retry-after": "3"}, json.dumps(body).encode(), "hf-tgi")
    assert (err.code, err.retryable, err.status, err.retry_after) == (code, retryable, client, 3.0)
    assert err.context_window is False and err.quota is False


def test_input_length_error_is_a_context_window_error() -> None:
    body = (
        b'{"error":"Input validation error: `inputs` must have less than 4096 tokens. Given: 5000",'
        b'"error_type":"validation"}'
    )
    assert ADAPTER.map_error(422, {}, body, "hf-tgi").context_window is True


def test_non_json_error_body_keeps_its_text() -> None:
    err = ADAPTER.map_error(503, {"x-should-retry": "false"}, b"<html>Service Unavailable</html>", "hf-tgi")
    assert err.message == "hf-tgi error (503): <html>Service Unavailable</html>"
    assert (err.code, err.retryable) == (None, False)
    assert ADAPTER.map_error(500, {}, b"", "hf-tgi").message == "hf-tgi error (500): no error body"
