"""Gemini `generateContent` / `streamGenerateContent?alt=sse`: request translation field by field, and
normalization of real recordings.

Recordings: tests/fixtures/gemini (see SOURCES.md), plus response bodies quoted from public recordings and
issue reports, each cited where it is used. Bodies marked "documented shape" follow the API reference where
no recording exists (logprobsResult, cachedContentTokenCount, candidate index with candidateCount > 1).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from gateway.upstream.framing import SSEDecoder
from providers.base import PARAM_FIELDS, Endpoint, map_params
from providers.envelope import Unreadable
from providers.gemini import GeminiAdapter
from tests.helpers.adapters import NATIVE, as_json, build, chunked, context, request
from tests.helpers.recordings import fixture_bytes, fixture_json
from wire.errors import InvalidRequestError, UnsupportedParamError, UpstreamStatusError

ADAPTER = GeminiAdapter()
MODEL = "gemini-1.5-flash"
KEY = "gm-test-key"
ENDPOINT = Endpoint(provider="gemini", model=MODEL, base_url=GeminiAdapter.default_base_url or "", api_key=KEY)
NON_STREAM = "gemini/generate_content_stop_sequence.json"
STREAM = "gemini/stream_generate_content.sse.txt"
BASE = "https://generativelanguage.googleapis.com/v1beta/models/gemini-1.5-flash"

EMULATED_FIELDS = {"echo", "best_of", "include_stop_str_in_output", "guided_regex", "guided_grammar"}
REFUSED: dict[str, Any] = {
    "suffix": "tail",
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

# pydantic/pydantic-ai @111dda9bcd3b tests/models/cassettes/test_google/test_google_model_retry.yaml,
# interaction #2 response (`parsed_body` re-serialized; thoughtSignature shortened): a thinking model.
THINKING = {
    "candidates": [
        {
            "content": {
                "parts": [{"text": "The capital of France is Paris.", "thoughtSignature": "CtMDAXLI2nwxeQ..."}],
                "role": "model",
            },
            "finishReason": "STOP",
            "index": 0,
        }
    ],
    "modelVersion": "gemini-2.5-pro",
    "responseId": "T1d8aYMZ_tfPsg-V08HBDw",
    "usageMetadata": {
        "candidatesTokenCount": 7,
        "promptTokenCount": 142,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 142}],
        "thoughtsTokenCount": 101,
        "totalTokenCount": 250,
    },
}
# pydantic/pydantic-ai @0ca8327d6826 .../test_google_model_max_tokens_thinking_model_empty_response.yaml (#0):
# the whole budget went to thinking, so the candidate has a content without parts.
THINKING_EMPTY = {
    "candidates": [{"content": {"role": "model"}, "finishReason": "MAX_TOKENS", "index": 0}],
    "modelVersion": "gemini-2.5-pro",
    "responseId": "fH8oaunbEbr9qtsPjYGX4A0",
    "usageMetadata": {
        "promptTokenCount": 15,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 15}],
        "serviceTier": "standard",
        "thoughtsTokenCount": 2,
        "totalTokenCount": 17,
    },
}
# pydantic/pydantic-ai @9bc7ce4e17ce .../test_google_model_armor_prompt_template_text_gets_blocked.yaml (#1):
# a blocked prompt, no candidates (recorded on Vertex v1beta1; same GenerateContentResponse message).
BLOCKED = {
    "createTime": "2026-05-27T16:53:45.443719Z",
    "modelVersion": "gemini-2.5-flash",
    "promptFeedback": {
        "blockReason": "MODEL_ARMOR",
        "blockReasonMessage": "The prompt violated Prompt Injection and Jailbreak filters.",
    },
    "responseId": "mSEXaseKG-P51PIPwv66qQs",
    "usageMetadata": {"trafficType": "ON_DEMAND"},
}

# Error bodies quoted from public reports (see each test).
RETRY_INFO_429 = {
    "error": {
        "code": 429,
        "message": "You exceeded your current quota... Please retry in 53.016342224s.",
        "status": "RESOURCE_EXHAUSTED",
        "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "53s"}],
    }
}
PER_DAY_429 = {
    "error": {
        "code": 429,
        "message": "You exceeded your current quota, please check your plan and billing details. For more "
        "information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.",
        "status": "RESOURCE_EXHAUSTED",
        "details": [
            {
                "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                "violations": [
                    {
                        "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_input_token_count",
                        "quotaId": "GenerateContentInputTokensPerModelPerMinute-FreeTier",
                        "quotaDimensions": {"location": "global", "model": "gemini-2.5-flash-preview-image"},
                    },
                    {
                        "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                        "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                        "quotaDimensions": {"location": "global", "model": "gemini-2.5-flash-preview-image"},
                    },
                    {
                        "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                        "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
                        "quotaDimensions": {"model": "gemini-2.5-flash-preview-image", "location": "global"},
                    },
                ],
            }
        ],
    }
}
PER_MINUTE_429 = {
    "error": {
        "code": 429,
        "message": "You exceeded your current quota, please check your plan and billing details. For more "
        "information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.",
        "status": "RESOURCE_EXHAUSTED",
        "details": [
            {
                "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                "violations": [
                    {
                        "quotaMetric": "generativelanguage.googleapis.com/generate_requests_per_model",
                        "quotaId": "GenerateRequestsPerMinutePerProjectPerModel",
                        "quotaDimensions": {"model": "gemini-2.0-pro-exp", "location": "global"},
                    }
                ],
            },
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "44s"},
        ],
    }
}
CONTEXT_400 = {
    "error": {
        "code": 400,
        "message": "The input token count (132478) exceeds the maximum number of tokens allowed (131072).",
        "status": "INVALID_ARGUMENT",
    }
}


def encode(value: Any) -> bytes:
    return json.dumps(value).encode()


def with_candidate(**changes: Any) -> bytes:
    """The recorded non-streaming body with its one candidate changed (documented fields only)."""
    body = fixture_json(NON_STREAM)
    body["candidates"][0].update(changes)
    return encode(body)


def events(raw: bytes, size: int) -> list[tuple[str | None, bytes]]:
    decoder = SSEDecoder()
    out: list[tuple[str | None, bytes]] = []
    for piece in chunked(raw, size):
        out += decoder.feed(piece)
    return out + decoder.close()


# -- request translation ---------------------------------------------------------------------------


def test_every_native_field() -> None:
    req = request(
        f"gemini/{MODEL}",
        "What is the capital of France?",
        max_tokens=64,
        temperature=0.4,
        top_p=0.9,
        top_k=40,
        stop=["Paris", "Lyon"],
        n=2,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        seed=7,
        logprobs=3,
    )
    up, body, dropped = build(ADAPTER, req, ENDPOINT)
    assert up.method == "POST"
    assert up.url == f"{BASE}:generateContent"
    assert up.stream is False
    assert up.headers == {"content-type": "application/json", "accept": "application/json", "x-goog-api-key": KEY}
    assert KEY not in up.url
    assert dropped == []
    assert body == {
        "contents": [{"role": "user", "parts": [{"text": "What is the capital of France?"}]}],
        "generationConfig": {
            "maxOutputTokens": 64,
            "temperature": 0.4,
            "topP": 0.9,
            "topK": 40,
            "candidateCount": 2,
            "stopSequences": ["Paris", "Lyon"],
            "responseLogprobs": True,
            "logprobs": 3,
            "seed": 7,
            "frequencyPenalty": -0.5,
            "presencePenalty": 0.5,
        },
    }


def test_stream_uses_the_sse_endpoint() -> None:
    up, body, _ = build(ADAPTER, request(stream=True, stream_options={"include_usage": True}), ENDPOINT)
    assert up.url == f"{BASE}:streamGenerateContent?alt=sse"
    assert up.stream is True
    assert up.headers["accept"] == "text/event-stream"
    # No stream flag in the body: the method name selects streaming; every event carries usage anyway.
    assert body == {"contents": [{"role": "user", "parts": [{"text": "Say this is a test"}]}]}


def test_api_version_model_resource_name_and_base_url() -> None:
    endpoint = Endpoint(
        provider="gemini", model="models/gemini-2.0-flash", base_url="http://127.0.0.1:9/gem/", api_version="v1"
    )
    up, _, _ = build(ADAPTER, request(), endpoint)
    assert up.url == "http://127.0.0.1:9/gem/v1/models/gemini-2.0-flash:generateContent"
    assert "x-goog-api-key" not in up.headers


def test_headers_from_config_and_request() -> None:
    endpoint = Endpoint(
        provider="gemini", model=MODEL, base_url=ENDPOINT.base_url, api_key=KEY, headers={"X-Goog-User-Project": "p1"}
    )
    req = request(inference_extra_headers={"X-Trace": "t-1", "Accept": "application/json"})
    up, _, _ = build(ADAPTER, req, endpoint)
    assert up.headers == {
        "content-type": "application/json",
        "accept": "application/json",
        "x-goog-user-project": "p1",
        "x-trace": "t-1",
        "x-goog-api-key": KEY,
    }


def test_extra_params_extend_generation_config() -> None:
    req = request(
        max_tokens=5,
        inference_extra_params={
            "generationConfig": {"thinkingConfig": {"thinkingBudget": 0}},
            "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
        },
    )
    _, body, _ = build(ADAPTER, req, ENDPOINT)
    assert body["generationConfig"] == {"maxOutputTokens": 5, "thinkingConfig": {"thinkingBudget": 0}}
    assert body["safetySettings"] == [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}]


@pytest.mark.parametrize("k", [-1, 0])
def test_top_k_without_a_cut_is_left_unset(k: int) -> None:
    _, body, _ = build(ADAPTER, request(top_k=k), ENDPOINT)
    assert "generationConfig" not in body


def test_logprobs_zero_asks_only_for_the_sampled_tokens() -> None:
    _, body, _ = build(ADAPTER, request(logprobs=0), ENDPOINT)
    assert body["generationConfig"] == {"responseLogprobs": True}


def test_boolean_logprobs_up_to_twenty_alternatives() -> None:
    _, body, _ = build(ADAPTER, request(logprobs=True, top_logprobs=20), ENDPOINT)
    assert body["generationConfig"] == {"responseLogprobs": True, "logprobs": 20}


def test_stop_sequences_cap_is_five() -> None:
    assert GeminiAdapter.max_stop == 5


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.mark.parametrize(
    "response_format,config",
    [
        ({"type": "json_object"}, {"responseMimeType": "application/json"}),
        (
            {"type": "json_object", "schema": SCHEMA},
            {"responseMimeType": "application/json", "responseJsonSchema": SCHEMA},
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}},
            {"responseMimeType": "application/json", "responseJsonSchema": SCHEMA},
        ),
    ],
)
def test_response_format(response_format: dict[str, Any], config: dict[str, Any]) -> None:
    _, body, _ = build(ADAPTER, request(response_format=response_format), ENDPOINT)
    assert body["generationConfig"] == config


def test_response_format_text_is_the_default() -> None:
    _, body, _ = build(ADAPTER, request(response_format={"type": "text"}), ENDPOINT)
    assert "generationConfig" not in body


@pytest.mark.parametrize(
    "response_format", [{"type": "grammar", "grammar": "root ::= x"}, {"type": "json_schema", "json_schema": {}}]
)
def test_response_format_it_cannot_express_is_refused(response_format: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequestError) as info:
        build(ADAPTER, request(response_format=response_format), ENDPOINT)
    assert info.value.param == "response_format"
    assert info.value.status == 400


def test_guided_json_goes_to_response_json_schema() -> None:
    # additionalProperties is JSON Schema that the proto-typed responseSchema would reject.
    schema = {**SCHEMA, "additionalProperties": False}
    _, body, _ = build(ADAPTER, request(guided_json=schema), ENDPOINT)
    assert body["generationConfig"] == {"responseMimeType": "application/json", "responseJsonSchema": schema}


def test_guided_choice_uses_enum_mode() -> None:
    _, body, _ = build(ADAPTER, request(guided_choice=["Positive", "Negative", "Neutral"]), ENDPOINT)
    assert body["generationConfig"] == {
        "responseMimeType": "text/x.enum",
        "responseSchema": {"type": "STRING", "enum": ["Positive", "Negative", "Neutral"]},
    }


def test_guided_choice_conflicts_with_json_mode() -> None:
    with pytest.raises(InvalidRequestError) as info:
        build(ADAPTER, request(response_format={"type": "json_object"}, guided_choice=["a", "b"]), ENDPOINT)
    assert info.value.param == "guided_choice"


@pytest.mark.parametrize(
    "field,value",
    [
        ("echo", True),
        ("best_of", 3),
        ("include_stop_str_in_output", True),
        ("guided_regex", "[0-9]+"),
        ("guided_grammar", "root ::= 'a'"),
    ],
)
def test_emulated_fields_write_nothing(field: str, value: Any) -> None:
    _, body, dropped = build(ADAPTER, request(**{field: value}), ENDPOINT)
    assert body == {"contents": [{"role": "user", "parts": [{"text": "Say this is a test"}]}]}
    assert dropped == []
    assert ADAPTER.params[field].emulated


@pytest.mark.parametrize("field,value", sorted(REFUSED.items()))
def test_refused_fields(field: str, value: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(**{field: value}), ENDPOINT)
    assert info.value.param == field
    assert info.value.message == f"Parameter '{field}' is not supported by provider 'gemini'"


def test_drop_policy_lists_what_it_dropped() -> None:
    _, dropped = map_params(request(suffix="s", logit_bias={"1": 1.0}, user="u"), ADAPTER.params, "gemini", True)
    assert dropped == ["suffix", "logit_bias", "user"]


def test_every_canonical_field_is_mapped_emulated_or_refused() -> None:
    native = set(ADAPTER.params) - EMULATED_FIELDS
    assert EMULATED_FIELDS <= set(ADAPTER.params)
    assert native | EMULATED_FIELDS | set(REFUSED) == set(PARAM_FIELDS)
    assert not (set(ADAPTER.params) & set(REFUSED))


@pytest.mark.parametrize("prompt", [["a", "b"], [1, 2, 3], [[1], [2]]])
def test_only_one_text_prompt_per_call(prompt: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        ADAPTER.check(request(prompt=prompt), "gemini")
    assert info.value.param == "prompt"


def test_twenty_logprobs_are_accepted() -> None:
    # Gemini returns up to 20 alternatives per step; the boolean form is how a client asks for more than 5.
    assert GeminiAdapter.max_logprobs == 20
    ADAPTER.check(request(logprobs=True, top_logprobs=20), "gemini")


# -- responses -------------------------------------------------------------------------------------


def test_recording_normalizes_to_our_completion() -> None:
    out = ADAPTER.parse_response(fixture_bytes(NON_STREAM), context(["What is the capital of France?"]))
    assert as_json(out) == {
        "object": "text_completion",
        "id": "cmpl-gateway-test-id",
        "created": 1_700_000_000,
        "model": "client/model-string",
        # A stopSequences hit is finishReason STOP, and the stop text ("Paris") is not in the output.
        "choices": [
            {"text": "The most iconic city in France is ", "index": 0, "logprobs": None, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 25, "completion_tokens": 8, "total_tokens": 33},
    }


@pytest.mark.parametrize("size", [1, 7, 64, 4096])
def test_recorded_stream_in_odd_sized_chunks(size: int) -> None:
    raw = fixture_bytes(STREAM)
    assert b"\r\n" in raw  # the recording's own CRLF framing
    ctx = context(["What is the capital of France?"])
    chunks = [ADAPTER.parse_event(name, data, ctx) for name, data in events(raw, size)]
    assert all(c is not None for c in chunks)
    got = [as_json(c) for c in chunks]
    assert [c["choices"] for c in got] == [
        [{"text": "The", "index": 0, "logprobs": None, "finish_reason": None}],
        [{"text": " capital of France", "index": 0, "logprobs": None, "finish_reason": None}],
        [{"text": " is Paris.\n", "index": 0, "logprobs": None, "finish_reason": "stop"}],
    ]
    # Each event repeats a running usageMetadata: only the last one (with finishReason) is relayed.
    assert [c.get("usage") for c in got] == [
        None,
        None,
        {"prompt_tokens": 13, "completion_tokens": 8, "total_tokens": 21},
    ]
    assert {c["id"] for c in got} == {"cmpl-gateway-test-id"}


def test_thinking_tokens_are_completion_tokens() -> None:
    out = as_json(ADAPTER.parse_response(encode(THINKING), context(["What is the capital of France?"])))
    assert out["choices"] == [
        {"text": "The capital of France is Paris.", "index": 0, "logprobs": None, "finish_reason": "stop"}
    ]
    # 142 + (7 + 101) = 250: totalTokenCount includes the thoughts that candidatesTokenCount leaves out.
    assert out["usage"] == {
        "prompt_tokens": 142,
        "completion_tokens": 108,
        "total_tokens": 250,
        "completion_tokens_details": {"reasoning_tokens": 101},
    }


def test_thinking_used_the_whole_budget() -> None:
    out = as_json(ADAPTER.parse_response(encode(THINKING_EMPTY), context(["What is the capital of France?"])))
    assert out["choices"] == [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}]
    assert out["usage"] == {
        "prompt_tokens": 15,
        "completion_tokens": 2,
        "total_tokens": 17,
        "completion_tokens_details": {"reasoning_tokens": 2},
    }


def test_cached_content_tokens() -> None:
    # Documented shape: UsageMetadata.cachedContentTokenCount, added to the recorded usage.
    body = fixture_json(NON_STREAM)
    body["usageMetadata"]["cachedContentTokenCount"] = 20
    out = as_json(ADAPTER.parse_response(encode(body), context(["x"])))
    assert out["usage"] == {
        "prompt_tokens": 25,
        "completion_tokens": 8,
        "total_tokens": 33,
        "prompt_tokens_details": {"cached_tokens": 20},
    }


def test_thought_parts_are_not_completion_text() -> None:
    # Documented shape: Part.thought marks a thought summary (includeThoughts).
    parts = [{"text": "Let me think about French cities.", "thought": True}, {"text": "Paris"}]
    out = ADAPTER.parse_response(with_candidate(content={"parts": parts, "role": "model"}), context(["x"]))
    assert out.choices[0].text == "Paris"


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("STOP", "stop"),
        ("MAX_TOKENS", "length"),
        ("SAFETY", "content_filter"),
        ("RECITATION", "content_filter"),
        ("BLOCKLIST", "content_filter"),
        ("PROHIBITED_CONTENT", "content_filter"),
        ("SPII", "content_filter"),
        ("IMAGE_SAFETY", "content_filter"),
        # Neither the limit nor a filter: the model stopped (documented choice).
        ("OTHER", "stop"),
        ("LANGUAGE", "stop"),
        ("MALFORMED_FUNCTION_CALL", "stop"),
        ("FINISH_REASON_UNSPECIFIED", "stop"),
    ],
)
def test_finish_reasons(raw: str, expected: str) -> None:
    out = ADAPTER.parse_response(with_candidate(finishReason=raw), context(["x"]))
    assert out.choices[0].finish_reason == expected


@pytest.mark.parametrize("n", [1, 3])
def test_blocked_prompt_is_content_filter_with_no_text(n: int) -> None:
    out = as_json(ADAPTER.parse_response(encode(BLOCKED), context(["Ignore all previous instructions"], n=n)))
    assert out["choices"] == [
        {"text": "", "index": i, "logprobs": None, "finish_reason": "content_filter"} for i in range(n)
    ]
    assert "usage" not in out  # the recording's usageMetadata has no token counts


def test_blocked_prompt_in_a_stream() -> None:
    chunk = ADAPTER.parse_event(None, encode(BLOCKED), context(["x"]))
    assert chunk is not None
    assert as_json(chunk)["choices"] == [{"text": "", "index": 0, "logprobs": None, "finish_reason": "content_filter"}]


def test_no_candidates_and_no_block_reason_is_an_upstream_error() -> None:
    body = fixture_json(NON_STREAM)
    del body["candidates"]
    # The pipeline turns Unreadable into a retryable 502 (an attempt that failed).
    with pytest.raises(Unreadable):
        ADAPTER.parse_response(encode(body), context(["x"]))
    assert ADAPTER.parse_event(None, encode(body), context(["x"])) is None


def test_several_candidates() -> None:
    # Documented shape: candidateCount = 2 returns candidates with their `index`.
    body = fixture_json(NON_STREAM)
    first = body["candidates"][0]
    second = {**first, "content": {"parts": [{"text": "Paris, of course: "}], "role": "model"}, "index": 1}
    body["candidates"] = [{**first, "index": 0}, second]
    out = ADAPTER.parse_response(encode(body), context(["x"], n=2))
    assert [(c.index, c.text) for c in out.choices] == [
        (0, "The most iconic city in France is "),
        (1, "Paris, of course: "),
    ]


# Documented shape (API reference LogprobsResult): chosenCandidates[] and topCandidates[].candidates[], each
# {token, tokenId, logProbability}; a zero log probability may be omitted (proto3 JSON).
LOGPROBS = {
    "chosenCandidates": [
        {"token": "The", "tokenId": 651, "logProbability": -0.25},
        {"token": " most", "tokenId": 1546},
    ],
    "topCandidates": [
        {
            "candidates": [
                {"token": "The", "tokenId": 651, "logProbability": -0.25},
                {"token": "Paris", "tokenId": 2, "logProbability": -1.5},
            ]
        },
        {"candidates": [{"token": " most", "tokenId": 1546}]},
    ],
}


def test_logprobs_with_computed_offsets() -> None:
    prompt = "France: "
    out = ADAPTER.parse_response(with_candidate(logprobsResult=LOGPROBS), context([prompt]))
    assert as_json(out.choices[0].logprobs) == {
        "tokens": ["The", " most"],
        "token_logprobs": [-0.25, 0.0],
        "top_logprobs": [{"The": -0.25, "Paris": -1.5}, {" most": 0.0}],
        "text_offset": [len(prompt), len(prompt) + 3],
    }


def test_logprobs_without_alternatives() -> None:
    only_chosen = {"chosenCandidates": LOGPROBS["chosenCandidates"]}
    out = ADAPTER.parse_response(with_candidate(logprobsResult=only_chosen), context(["ab"]))
    logprobs = out.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.top_logprobs is None
    assert logprobs.text_offset == [2, 5]


def test_stream_logprob_offsets_continue_across_events() -> None:
    ctx = context(["Q: "])
    first = fixture_json(NON_STREAM)
    first["candidates"][0].update(finishReason=None, logprobsResult={"chosenCandidates": [{"token": "ab"}]})
    second = fixture_json(NON_STREAM)
    second["candidates"][0]["logprobsResult"] = {"chosenCandidates": [{"token": "c", "logProbability": -1.0}]}
    a = ADAPTER.parse_event(None, encode(first), ctx)
    b = ADAPTER.parse_event(None, encode(second), ctx)
    assert a is not None and b is not None
    assert a.choices[0].logprobs is not None and a.choices[0].logprobs.text_offset == [3]
    assert b.choices[0].logprobs is not None and b.choices[0].logprobs.text_offset == [5]
    assert a.usage is None and b.usage is not None


# -- errors ----------------------------------------------------------------------------------------


def test_retry_info_delay() -> None:
    # googleapis/python-genai#1875: the RetryInfo entry of a 429 (the message's "..." is the reporter's).
    err = ADAPTER.map_error(429, {}, encode(RETRY_INFO_429), "gemini")
    assert isinstance(err, UpstreamStatusError)
    assert err.status == 429
    assert err.retry_after == 53.0
    assert err.code == "RESOURCE_EXHAUSTED"
    assert err.retryable and not err.quota and not err.context_window
    assert err.message.startswith("gemini error (429): You exceeded your current quota")


def test_fractional_retry_delay() -> None:
    # dcdpr/jp#1061: retryDelay is a protobuf Duration with up to nine fractional digits.
    body = json.loads(json.dumps(RETRY_INFO_429))
    body["error"]["details"][0]["retryDelay"] = "45.837906927s"
    assert ADAPTER.map_error(429, {}, encode(body), "gemini").retry_after == 45.837906927


def test_retry_after_header_wins() -> None:
    assert ADAPTER.map_error(429, {"retry-after": "7"}, encode(RETRY_INFO_429), "gemini").retry_after == 7.0


def test_per_minute_quota_is_retryable() -> None:
    # Aider-AI/aider#3694 (QuotaFailure per minute + RetryInfo "44s"; the Help entry omitted).
    err = ADAPTER.map_error(429, {}, encode(PER_MINUTE_429), "gemini")
    assert err.retry_after == 44.0
    assert err.retryable and not err.quota


def test_per_day_quota_is_not_retried() -> None:
    # google-gemini/gemini-cli#8437: violations include GenerateRequestsPerDayPerProjectPerModel-FreeTier
    # (quoted up to the QuotaFailure entry; the Help entry that followed is omitted).
    err = ADAPTER.map_error(429, {}, encode(PER_DAY_429), "gemini")
    assert err.quota
    assert not err.retryable
    assert err.status == 429


def test_zero_limit_is_a_quota() -> None:
    # continuedev/continue#9570: no QuotaFailure, the message says "limit: 0" and "Please retry in ...s".
    message = (
        "You exceeded your current quota, please check your plan and billing details. "
        "* Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, "
        "limit: 0, model: gemini-3-pro\nPlease retry in 45.578569677s."
    )
    body = {"error": {"code": 429, "message": message, "status": "RESOURCE_EXHAUSTED"}}
    err = ADAPTER.map_error(429, {}, encode(body), "gemini")
    assert err.quota and not err.retryable
    assert err.retry_after == 45.578569677


def test_prompt_too_long_is_a_context_window_error() -> None:
    # google-gemini/gemini-cli#4118 (AI Studio key): the whole 400 body.
    err = ADAPTER.map_error(400, {}, encode(CONTEXT_400), "gemini")
    assert err.context_window
    assert err.status == 400 and err.type == "invalid_request_error"
    assert err.code == "context_length_exceeded"  # one code for the meaning (providers/context.py)
    assert not err.retryable


def test_array_wrapped_envelope() -> None:
    # The non-SSE stream endpoint wraps errors in an array (gemini-cli#14811 shows `[{"error": ...}]`).
    err = ADAPTER.map_error(400, {}, encode([CONTEXT_400]), "gemini")
    assert err.context_window


@pytest.mark.parametrize("status", [500, 503])
def test_server_errors_are_retryable(status: int) -> None:
    body = {"error": {"code": status, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}
    err = ADAPTER.map_error(status, {}, encode(body), "gemini")
    assert err.retryable and err.status == 502
    assert err.retry_after is None


def test_unparseable_error_body() -> None:
    err = ADAPTER.map_error(502, {}, b"<html>Bad Gateway</html>", "gemini")
    assert err.message == "gemini error (502): <html>Bad Gateway</html>"
    assert err.code is None


def test_error_event_mid_stream_raises() -> None:
    with pytest.raises(UpstreamStatusError) as info:
        ADAPTER.parse_event(None, encode(RETRY_INFO_429), context(["x"]))
    assert info.value.upstream_status == 429
    assert info.value.retry_after == 53.0


def test_invalid_json_event_is_a_decode_error() -> None:
    with pytest.raises(msgspec.DecodeError):
        ADAPTER.parse_event(None, b"{not json", context(["x"]))
