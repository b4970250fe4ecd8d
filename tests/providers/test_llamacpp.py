"""llama.cpp native `/completion`: the request translated field by field, and responses normalized.

No llama.cpp response has been recorded anywhere public (fixtures INDEX): the bodies below are built from
the fields ggml-org/llama.cpp `tools/server/README.md` documents (content, stop, stop_type, stopping_word,
tokens_evaluated, tokens_predicted, completion_probabilities, and the 503 "Loading model" body it prints
verbatim), and nothing else."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from gateway.upstream.framing import SSEDecoder
from providers.base import Endpoint
from providers.envelope import Unreadable
from providers.llamacpp import LlamaCppAdapter
from tests.helpers.adapters import as_json, build, chunked, context, request
from wire.errors import InvalidRequestError, UnsupportedParamError, UpstreamStatusError
from wire.schema import Completion

ADAPTER = LlamaCppAdapter()
ENDPOINT = Endpoint(provider="llama", model="qwen2.5-7b", base_url="http://gpu-2:8080")
PROMPT = "Building a website can be done in 10 simple steps:"
BASE = {"model": "qwen2.5-7b", "prompt": PROMPT, "stream": False, "cache_prompt": True}
SCHEMA: dict[str, Any] = {"items": {"type": "string"}, "minItems": 10, "maxItems": 100}
LOADING = b'{"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}'


def body_for(**fields: Any) -> dict[str, Any]:
    _, body, _ = build(ADAPTER, request(prompt=PROMPT, **fields), ENDPOINT)
    return body


def test_every_native_field() -> None:
    up, body, dropped = build(
        ADAPTER,
        request(
            prompt=PROMPT,
            max_tokens=128,
            temperature=0.8,
            top_p=0.95,
            top_k=40,
            presence_penalty=0.1,
            frequency_penalty=0.2,
            seed=42,
            stop=["\n\n"],
            logprobs=3,
            logit_bias={"15043": 1.0, "29871": -100},
            guided_grammar='root ::= "yes" | "no"',
        ),
        ENDPOINT,
    )
    assert (up.method, up.url, up.stream, dropped) == ("POST", "http://gpu-2:8080/completion", False, [])
    assert up.headers == {"content-type": "application/json", "accept": "application/json"}
    assert body == {
        **BASE,
        "n_predict": 128,
        "temperature": 0.8,
        "top_p": 0.95,
        "top_k": 40,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "seed": 42,
        "stop": ["\n\n"],
        "n_probs": 3,
        "logit_bias": [[15043, 1.0], [29871, -100]],
        "grammar": 'root ::= "yes" | "no"',
    }


def test_logprobs_zero_asks_for_one_probability() -> None:
    # n_probs 0 returns nothing at all, not even the sampled token's logprob.
    assert body_for(logprobs=0)["n_probs"] == 1


def test_logit_bias_keys_must_be_token_ids() -> None:
    with pytest.raises(InvalidRequestError) as info:
        build(ADAPTER, request(logit_bias={"Hello": 1.0}), ENDPOINT)
    assert (info.value.param, info.value.code) == ("logit_bias", "invalid_value")


@pytest.mark.parametrize(
    "fields,schema",
    [
        ({"guided_json": SCHEMA}, SCHEMA),
        ({"response_format": {"type": "json_object", "schema": SCHEMA}}, SCHEMA),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}}, SCHEMA),
        # JSON mode is a JSON object; the README's {} would also admit a bare string.
        ({"response_format": {"type": "json_object"}}, {"type": "object"}),
    ],
)
def test_json_constraints_become_json_schema(fields: dict[str, Any], schema: dict[str, Any]) -> None:
    assert body_for(**fields) == {**BASE, "json_schema": schema}


def test_grammar_and_schema_together_are_refused() -> None:
    with pytest.raises(InvalidRequestError) as info:
        build(ADAPTER, request(guided_grammar="root ::= x", response_format={"type": "json_object"}), ENDPOINT)
    assert info.value.param == "grammar"
    assert body_for(response_format={"type": "text"}) == BASE


@pytest.mark.parametrize(
    "field,value",
    [
        ("n", 2),
        ("best_of", 2),
        ("echo", True),
        ("include_stop_str_in_output", True),
        ("guided_regex", "[0-9]+"),
    ],
)
def test_emulated_fields_are_accepted_and_not_sent(field: str, value: Any) -> None:
    assert body_for(**{field: value}) == BASE


def test_guided_choice_is_a_grammar_of_its_choices_as_literals() -> None:
    # The server decodes one of the choices exactly; a choice's quote, backslash, newline or non-ASCII text
    # is escaped (`parse_char` in src/llama-grammar.cpp), so it can neither end its literal nor add a rule.
    choices = ["yes", 'say "hi"', "back\\slash", "two\nlines", "na\u00efve \u2713", '" | root ::= "x']
    grammar = body_for(guided_choice=choices)["grammar"]
    assert grammar == (
        'root ::= "yes" | "say \\"hi\\"" | "back\\\\slash" | "two\\U0000000Alines" | "na\\U000000EFve \\U00002713" | '
        '"\\" | root ::= \\"x"'
    )
    with pytest.raises(InvalidRequestError) as info:
        build(ADAPTER, request(guided_choice=["a"], response_format={"type": "json_object"}), ENDPOINT)
    assert info.value.code == "invalid_value"


@pytest.mark.parametrize("field,value", [("suffix", "}"), ("user", "u"), ("images", ["data:image/png;base64,AA=="])])
def test_fields_llamacpp_lacks_are_refused(field: str, value: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(**{field: value}), ENDPOINT)
    assert info.value.param == field
    assert info.value.message == f"Parameter '{field}' is not supported by provider 'llama'"


def test_token_prompt_passes_as_is_and_lists_are_fanned_out_by_the_gateway() -> None:
    _, body, _ = build(ADAPTER, request(prompt=[12, 34, 56]), ENDPOINT)
    assert body["prompt"] == [12, 34, 56]
    with pytest.raises(UnsupportedParamError):
        build(ADAPTER, request(prompt=["a", "b"]), ENDPOINT)
    assert (ADAPTER.max_logprobs, ADAPTER.needs_api_key, ADAPTER.default_base_url) == (20, False, None)


def test_stream_key_headers_extra_params_and_default_limit() -> None:
    endpoint = Endpoint(
        provider="llama", model="m", base_url="http://gpu-2:8080/", api_key="sk-local", default_max_tokens=64
    )
    req = request(stream=True, inference_extra_params={"min_p": 0.05, "cache_prompt": False})
    up, body, _ = build(ADAPTER, req, endpoint)
    assert (up.url, up.stream) == ("http://gpu-2:8080/completion", True)
    assert up.headers == {
        "content-type": "application/json",
        "accept": "text/event-stream",
        "authorization": "Bearer sk-local",
    }
    assert body == {
        "model": "m",
        "prompt": "Say this is a test",
        "n_predict": 64,
        "stream": True,
        "cache_prompt": False,
        "min_p": 0.05,
    }


# ------------------------------------------------------------------------------------------------
# Responses (README fields only)


def _final(**fields: Any) -> bytes:
    body = {
        "content": " 1. Choose a domain",
        "stop": True,
        "stop_type": "limit",
        "stopping_word": "",
        "tokens_evaluated": 14,
        "tokens_predicted": 6,
    }
    body.update(fields)
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    "stop_type,finish", [("limit", "length"), ("eos", "stop"), ("word", "stop"), ("none", "length")]
)
def test_final_response_and_stop_types(stop_type: str, finish: str) -> None:
    out = ADAPTER.parse_response(_final(stop_type=stop_type), context([PROMPT]))
    assert as_json(out) == {
        "object": "text_completion",
        "id": "cmpl-gateway-test-id",
        "created": 1_700_000_000,
        "model": "client/model-string",
        "choices": [{"text": " 1. Choose a domain", "index": 0, "logprobs": None, "finish_reason": finish}],
        "usage": {"prompt_tokens": 14, "completion_tokens": 6, "total_tokens": 20},
    }


def test_older_stopped_flags_when_stop_type_is_absent() -> None:
    older = {"content": "x", "stop": True, "tokens_evaluated": 1, "tokens_predicted": 1}
    for flag, finish in [("stopped_eos", "stop"), ("stopped_word", "stop"), ("stopped_limit", "length")]:
        out = ADAPTER.parse_response(json.dumps({**older, flag: True}).encode(), context(["p"]))
        assert out.choices[0].finish_reason == finish


def _probs() -> list[dict[str, Any]]:
    # README `completion_probabilities` entries: {id, logprob, token, bytes, top_logprobs[{id, logprob, token, bytes}]}.
    return [
        {
            "id": 220,
            "logprob": -0.5,
            "token": " 1",
            "bytes": [32, 49],
            "top_logprobs": [
                {"id": 220, "logprob": -0.5, "token": " 1", "bytes": [32, 49]},
                {"id": 198, "logprob": -1.25, "token": "\n", "bytes": [10]},
            ],
        },
        {
            "id": 13,
            "logprob": -0.125,
            "token": ".",
            "bytes": [46],
            "top_logprobs": [{"id": 13, "logprob": -0.125, "token": ".", "bytes": [46]}],
        },
    ]


@pytest.mark.parametrize("key", ["completion_probabilities", "probs"])
def test_probabilities_become_logprobs_with_offsets(key: str) -> None:
    out = ADAPTER.parse_response(_final(content=" 1.", **{key: _probs()}), context([PROMPT]))
    assert as_json(out.choices[0].logprobs) == {
        "tokens": [" 1", "."],
        "token_logprobs": [-0.5, -0.125],
        "top_logprobs": [{" 1": -0.5, "\n": -1.25}, {".": -0.125}],
        "text_offset": [len(PROMPT), len(PROMPT) + 2],
    }


def _stream() -> bytes:
    # Partial events carry content (and probabilities when asked); the last has stop: true and the counts.
    probs = _probs()
    events = [
        {"content": " 1", "tokens": [220], "stop": False, "completion_probabilities": [probs[0]]},
        {"content": ".", "tokens": [13], "stop": False, "completion_probabilities": [probs[1]]},
        {
            "content": "",
            "tokens": [],
            "stop": True,
            "stop_type": "eos",
            "stopping_word": "",
            "tokens_evaluated": 14,
            "tokens_predicted": 2,
        },
    ]
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


@pytest.mark.parametrize("chunk_size", [1, 9, 80, 4096])
def test_stream(chunk_size: int) -> None:
    ctx = context([PROMPT])
    decoder = SSEDecoder()
    events = [e for part in chunked(_stream(), chunk_size) for e in decoder.feed(part)] + decoder.close()
    chunks: list[Completion | None] = [ADAPTER.parse_event(name, data, ctx) for name, data in events]
    assert all(c is not None for c in chunks)
    done = [c for c in chunks if c is not None]
    assert [(c.choices[0].text, c.choices[0].finish_reason) for c in done] == [(" 1", None), (".", None), ("", "stop")]
    assert [c.usage for c in done[:2]] == [None, None]
    assert as_json(done[2].usage) == {"prompt_tokens": 14, "completion_tokens": 2, "total_tokens": 16}
    offsets = [c.choices[0].logprobs.text_offset if c.choices[0].logprobs else None for c in done]
    assert offsets == [[len(PROMPT)], [len(PROMPT) + 2], None]
    assert ADAPTER.parse_event(None, b"[DONE]", ctx) is None


def test_error_inside_a_stream_raises() -> None:
    with pytest.raises(UpstreamStatusError) as info:
        ADAPTER.parse_event(None, LOADING, context(["x"]))
    assert (info.value.upstream_status, info.value.code, info.value.retryable) == (503, "unavailable_error", True)


# ------------------------------------------------------------------------------------------------
# Errors


def test_loading_model_is_retryable() -> None:
    err = ADAPTER.map_error(503, {}, LOADING, "llama")
    assert isinstance(err, UpstreamStatusError)
    assert err.message == "llama error (503): Loading model"
    assert (err.status, err.type, err.code, err.retryable, err.context_window) == (
        502,
        "upstream_error",
        "unavailable_error",
        True,
        False,
    )


def test_prompt_too_long_is_a_context_window_error() -> None:
    # Type name from the server code (ERROR_TYPE_EXCEED_CONTEXT_SIZE), as public clients quote it.
    body = (
        b'{"error":{"code":400,"message":"request (9412 tokens) exceeds the available context size (8192 tokens),'
        b' try increasing it","type":"exceed_context_size_error"}}'
    )
    err = ADAPTER.map_error(400, {}, body, "llama")
    assert (err.status, err.code, err.context_window, err.retryable) == (400, "context_length_exceeded", True, False)


def test_other_error_shapes() -> None:
    assert ADAPTER.map_error(401, {}, b'{"error":"Invalid API Key"}', "llama").message == (
        "llama error (401): Invalid API Key"
    )
    err = ADAPTER.map_error(500, {"retry-after": "1"}, b"oops", "llama")
    assert (err.message, err.retry_after) == ("llama error (500): oops", 1.0)


# ------------------------------------------------------------------------------------------------
# `n` in one call (`max_n` set): the server's `n_cmpl` (tools/server/server-schema.cpp and server-context.cpp:
# buffered, a JSON array of its results in index order; streamed, each event names its result's `index`)


def test_n_is_sent_only_once_max_n_is_set() -> None:
    assert "n_cmpl" not in body_for(n=3)  # fanned out: each call is sent without it
    native = LlamaCppAdapter().configure(max_n=4)
    _, body, _ = build(native, request(prompt=PROMPT, n=3), ENDPOINT)
    assert body["n_cmpl"] == 3 and "n" not in body
    assert ADAPTER.params["n"].emulated  # the kind's own table is left as it was
    assert native.max_n == 4 and ADAPTER.max_n > 2**62


def _result(index: int, content: str, predicted: int, **more: Any) -> dict[str, Any]:
    return {
        "index": index,
        "content": content,
        "stop": True,
        "stop_type": "limit",
        "tokens_evaluated": 14,
        "tokens_predicted": predicted,
        **more,
    }


def test_an_array_of_results_is_one_choice_each() -> None:
    body = json.dumps([_result(0, " 1.", 2), _result(1, " A", 1, stop_type="eos"), _result(2, " x y z", 3)])
    out = ADAPTER.parse_response(body.encode(), context([PROMPT], n=3))
    assert [(c.index, c.text, c.finish_reason) for c in out.choices] == [
        (0, " 1.", "length"),
        (1, " A", "stop"),
        (2, " x y z", "length"),
    ]
    # The prompt once (each result reports it), the completions added.
    assert as_json(out.usage) == {"prompt_tokens": 14, "completion_tokens": 6, "total_tokens": 20}


def test_each_result_has_its_own_logprobs() -> None:
    probs = _probs()
    body = json.dumps(
        [
            _result(0, " 1.", 2, completion_probabilities=probs),
            _result(1, " 1", 1, completion_probabilities=probs[:1]),
        ]
    )
    out = ADAPTER.parse_response(body.encode(), context([PROMPT], n=2))
    lps = [c.logprobs for c in out.choices]
    assert [lp.tokens if lp else None for lp in lps] == [[" 1", "."], [" 1"]]


def test_an_error_among_the_results_is_the_answer() -> None:
    body = b"[" + json.dumps(_result(0, "x", 1)).encode() + b"," + LOADING + b"]"
    with pytest.raises(UpstreamStatusError) as info:
        ADAPTER.parse_response(body, context(["x"], n=2))
    assert info.value.upstream_status == 503


def test_a_stream_of_several_results_tells_them_apart_and_adds_their_tokens() -> None:
    ctx = context([PROMPT], n=2)
    events = [
        {"index": 1, "content": " A", "stop": False},
        {"index": 0, "content": " 1", "stop": False},
        {"index": 1, "content": "", "stop": True, "stop_type": "eos", "tokens_evaluated": 14, "tokens_predicted": 1},
        {"index": 0, "content": ".", "stop": False},
        {"index": 0, "content": "", "stop": True, "stop_type": "limit", "tokens_evaluated": 14, "tokens_predicted": 2},
    ]
    out = [ADAPTER.parse_event(None, json.dumps(e).encode(), ctx) for e in events]
    done = [c for c in out if c is not None]
    assert [(c.choices[0].index, c.choices[0].text, c.choices[0].finish_reason) for c in done] == [
        (1, " A", None),
        (0, " 1", None),
        (1, "", "stop"),
        (0, ".", None),
        (0, "", "length"),
    ]
    # The stream's usage is its last event's: by then every result's tokens, the prompt once.
    assert as_json(done[2].usage) == {"prompt_tokens": 14, "completion_tokens": 1, "total_tokens": 15}
    assert as_json(done[-1].usage) == {"prompt_tokens": 14, "completion_tokens": 3, "total_tokens": 17}


@pytest.mark.parametrize("index", [-1, 2, 2**40])
def test_a_result_no_one_asked_for_is_an_unreadable_answer(index: int) -> None:
    body = json.dumps([_result(0, "x", 1), _result(index, "y", 1)]).encode()
    with pytest.raises((Unreadable, msgspec.ValidationError)):
        ADAPTER.parse_response(body, context([PROMPT], n=2))
    with pytest.raises((Unreadable, msgspec.ValidationError)):
        ADAPTER.parse_event(None, json.dumps({"index": index, "content": "y"}).encode(), context([PROMPT], n=2))
