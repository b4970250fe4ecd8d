"""AWS Bedrock Converse: responses, streams and errors normalized from the real recordings in tests/fixtures/bedrock
(pydantic-ai cassettes, see SOURCES.md); frames the recordings lack (exception frames, a guardrail stop) are built
with tests/helpers/eventstream.py."""

from __future__ import annotations

import json

import pytest

from providers.bedrock import error_type
from providers.envelope import Unreadable
from tests.helpers.adapters import as_json, context
from tests.helpers.eventstream import event, exception, split_frames
from tests.helpers.recordings import fixture_bytes, fixture_json
from tests.providers.bedrock_setup import ADAPTER, STREAM, decode_frames
from wire.errors import UpstreamStatusError
from wire.schema import Completion

# --- responses (real recordings) -------------------------------------------------------------------


def test_end_turn_recording() -> None:
    out = ADAPTER.parse_response(fixture_bytes("bedrock/converse_end_turn.json"), context(["Hello!"]))
    assert as_json(out) == {
        "object": "text_completion",
        "id": "cmpl-gateway-test-id",
        "created": 1_700_000_000,
        "model": "client/model-string",
        "choices": [
            {
                "text": "Hello there! How can I assist you today? Whether you have questions, need information, "
                "or just want to chat, I'm here to help. What's on your mind?",
                "index": 0,
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 39, "total_tokens": 46},
    }


def test_max_tokens_recording() -> None:
    out = ADAPTER.parse_response(fixture_bytes("bedrock/converse_max_tokens.json"), context())
    assert as_json(out)["choices"] == [
        {"text": "The capital of France is", "index": 0, "logprobs": None, "finish_reason": "length"}
    ]
    assert as_json(out)["usage"] == {"prompt_tokens": 13, "completion_tokens": 5, "total_tokens": 18}


def test_cache_read_recording_counts_cached_tokens_as_prompt_tokens() -> None:
    out = ADAPTER.parse_response(fixture_bytes("bedrock/converse_cache_read.json"), context())
    assert out.choices[0].text == "5"
    assert as_json(out)["usage"] == {
        "prompt_tokens": 1517,
        "completion_tokens": 5,
        "total_tokens": 1522,
        "prompt_tokens_details": {"cached_tokens": 1504},
    }


@pytest.mark.parametrize(
    "stop_reason,expected",
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("tool_use", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("guardrail_intervened", "content_filter"),
        ("content_filtered", "content_filter"),
        ("malformed_model_output", "stop"),
    ],
)
def test_every_documented_stop_reason(stop_reason: str, expected: str) -> None:
    rec = fixture_json("bedrock/converse_end_turn.json")
    rec["stopReason"] = stop_reason
    out = ADAPTER.parse_response(json.dumps(rec).encode(), context())
    assert out.choices[0].finish_reason == expected


def test_reasoning_blocks_are_not_completion_text() -> None:
    rec = fixture_json("bedrock/converse_end_turn.json")
    rec["output"]["message"]["content"].insert(0, {"reasoningContent": {"reasoningText": {"text": "Hmm."}}})
    assert ADAPTER.parse_response(json.dumps(rec).encode(), context()).choices[0].text.startswith("Hello there!")


def test_a_body_without_output_is_an_upstream_error() -> None:
    # The pipeline turns Unreadable into a retryable 502 (an attempt that failed).
    with pytest.raises(Unreadable, match="an answer without an output message"):
        ADAPTER.parse_response(b'{"Output":{"__type":"com.amazon.coral.service#UnknownOperationException"}}', context())


# --- the recorded stream ---------------------------------------------------------------------------

RECORDED_TEXT = (
    "The capital of France is Paris. Paris is not only the capital city but also the most populous city in "
    "France, and it is a major center for culture, commerce, fashion, and international diplomacy. Known for "
    "its historical landmarks, such as the Eiffel Tower, the Louvre Museum, and Notre-Dame Cathedral, Paris is "
    'often referred to as "The City of Light" or "The City of Love."'
)


def _parsed(raw: bytes, size: int) -> list[Completion | None]:
    ctx = context(["What is the capital of France?"])
    return [ADAPTER.parse_event(name, data, ctx) for name, data in decode_frames(raw, size)]


@pytest.mark.parametrize("size", [1, 7, 64, 100_000])
def test_recorded_stream_normalized(size: int) -> None:
    parsed = _parsed(fixture_bytes(STREAM), size)
    # messageStart, contentBlockStop and messageStop produce nothing; metadata ends the stream.
    assert [p is None for p in parsed] == [True] + [False] * 29 + [True, True, False]
    chunks = [c for c in parsed if c is not None]
    assert "".join(c.choices[0].text for c in chunks) == RECORDED_TEXT
    assert as_json(chunks[0]) == {
        "object": "text_completion",
        "id": "cmpl-gateway-test-id",
        "created": 1_700_000_000,
        "model": "client/model-string",
        "choices": [{"text": "The", "index": 0, "logprobs": None, "finish_reason": None}],
    }
    assert all(c.usage is None and c.choices[0].finish_reason is None for c in chunks[:-1])
    # The last chunk carries the finish reason (from messageStop) and the usage (from metadata).
    assert as_json(chunks[-1]) == {
        "object": "text_completion",
        "id": "cmpl-gateway-test-id",
        "created": 1_700_000_000,
        "model": "client/model-string",
        "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 13, "completion_tokens": 82, "total_tokens": 95},
    }


def test_a_guardrail_stop_mid_stream_ends_filtered() -> None:
    frames = split_frames(fixture_bytes(STREAM))
    raw = b"".join(frames[:2]) + event("messageStop", {"stopReason": "guardrail_intervened"}) + frames[-1]
    chunks = [c for c in _parsed(raw, 11) if c is not None]
    assert [(c.choices[0].text, c.choices[0].finish_reason) for c in chunks] == [("The", None), ("", "content_filter")]


def test_reasoning_and_tool_deltas_are_skipped() -> None:
    ctx = context()
    for delta in ({"reasoningContent": {"text": "Let me think."}}, {"toolUse": {"input": "{"}}, {"text": ""}):
        data = json.dumps({"contentBlockIndex": 0, "delta": delta}).encode()
        assert ADAPTER.parse_event("contentBlockDelta", data, ctx) is None


@pytest.mark.parametrize(
    "exception_type,message,status,client,retryable,context_window",
    [
        ("throttlingException", "Too many requests, please wait before trying again.", 429, 429, True, False),
        ("validationException", "Input is too long for requested model.", 400, 400, False, True),
        ("modelStreamErrorException", "Model stream error", 424, 502, True, False),
        ("internalServerException", "Internal error", 500, 502, True, False),
        ("serviceUnavailableException", "Service unavailable", 503, 502, True, False),
    ],
)
def test_exception_frames_mid_stream_raise_the_mapped_error(
    exception_type: str, message: str, status: int, client: int, retryable: bool, context_window: bool
) -> None:
    raw = split_frames(fixture_bytes(STREAM))[1] + exception(exception_type, message)
    ctx = context()
    events = decode_frames(raw, 13)
    assert ADAPTER.parse_event(*events[0], ctx) is not None
    with pytest.raises(UpstreamStatusError) as info:
        ADAPTER.parse_event(*events[1], ctx)
    err = info.value
    assert err.upstream_status == status and err.status == client
    # A context-window error has one code whatever the vendor called it (providers/context.py).
    code = "context_length_exceeded" if context_window else exception_type[0].upper() + exception_type[1:]
    assert err.code == code
    assert err.message == f"bedrock error ({status}): {message}"
    assert (err.retryable, err.context_window) == (retryable, context_window)


def test_an_error_frame_mid_stream_raises() -> None:
    with pytest.raises(UpstreamStatusError) as info:
        ADAPTER.parse_event("error:InternalFailure", b"boom", context())
    assert (info.value.upstream_status, info.value.code, info.value.message) == (
        500,
        "InternalFailure",
        "bedrock error (500): boom",
    )


# --- errors ----------------------------------------------------------------------------------------


def test_recorded_invalid_model_error() -> None:
    err = ADAPTER.map_error(400, {}, fixture_bytes("bedrock/error_400_invalid_model.json"), "aws")
    assert isinstance(err, UpstreamStatusError)
    assert (err.status, err.type, err.upstream_status) == (400, "invalid_request_error", 400)
    assert err.message == "aws error (400): The provided model identifier is invalid."
    assert err.code is None
    assert (err.retryable, err.quota, err.context_window) == (False, False, False)
    # With the header Bedrock sends the type in (x-amzn-ErrorType, as in aws-beam/aws-erlang#161).
    typed = ADAPTER.map_error(
        400,
        {"x-amzn-errortype": "ValidationException:http://internal.amazon.com/coral/com.amazon.bedrock/"},
        fixture_bytes("bedrock/error_400_invalid_model.json"),
        "aws",
    )
    assert typed.code == "ValidationException"


def test_recorded_throttling_is_retryable_and_honours_retry_after() -> None:
    err = ADAPTER.map_error(429, {"retry-after": "3"}, fixture_bytes("bedrock/error_429_throttling.json"), "aws")
    assert isinstance(err, UpstreamStatusError)
    assert (err.status, err.type, err.code) == (429, "rate_limit_error", "ThrottlingException")
    assert err.message == "aws error (429): Rate exceeded"
    assert (err.retryable, err.quota, err.retry_after) == (True, False, 3.0)


def _error(message: str, key: str = "message") -> bytes:
    rec = fixture_json("bedrock/error_400_invalid_model.json")
    rec.pop("message")
    rec[key] = message
    return json.dumps(rec).encode()


def test_service_quota_exceeded_is_a_quota_and_reaches_the_client_as_429() -> None:
    err = ADAPTER.map_error(
        400,
        {"x-amzn-errortype": "ServiceQuotaExceededException:http://internal.amazon.com/coral/com.amazon.bedrock/"},
        _error("Too many tokens per day, please wait before trying again."),
        "aws",
    )
    assert isinstance(err, UpstreamStatusError)
    assert (err.quota, err.retryable) == (True, False)
    assert (err.status, err.type) == (429, "rate_limit_error")
    assert err.code == "ServiceQuotaExceededException"
    assert err.message == "aws error (400): Too many tokens per day, please wait before trying again."


@pytest.mark.parametrize(
    "message",
    [
        "Input is too long for requested model.",
        "The model returned the following errors: prompt is too long: 200049 tokens > 200000 maximum",
        "The model returned the following errors: input length and `max_tokens` exceed context limit: 197011 + 8192"
        " > 200000, decrease input length or `max_tokens` and try again",
    ],
)
def test_validation_exception_saying_too_long_is_a_context_window_error(message: str) -> None:
    err = ADAPTER.map_error(400, {"x-amzn-errortype": "ValidationException"}, _error(message), "aws")
    assert (err.context_window, err.retryable, err.status) == (True, False, 400)


def test_other_validation_errors_are_not_context_window_errors() -> None:
    err = ADAPTER.map_error(
        400, {"x-amzn-errortype": "ValidationException"}, _error("temperature: must be at most 1"), "aws"
    )
    assert err.context_window is False


@pytest.mark.parametrize(
    "etype,status,client,retryable",
    [
        ("ModelNotReadyException", 429, 429, True),
        ("ModelTimeoutException", 408, 504, True),
        ("InternalServerException", 500, 502, True),
        ("ServiceUnavailableException", 503, 502, True),
        ("ModelErrorException", 424, 502, False),
        ("ResourceNotFoundException", 404, 404, False),
    ],
)
def test_documented_error_types(etype: str, status: int, client: int, retryable: bool) -> None:
    err = ADAPTER.map_error(status, {"x-amzn-errortype": etype}, _error("x"), "aws")
    # Any upstream 404 says the target does not serve the model: the client sees `model_not_found`.
    code = "model_not_found" if status == 404 else etype
    assert (err.status, err.code, err.retryable, err.quota) == (client, code, retryable, False)


def test_access_denied_with_capitalized_message_is_a_gateway_credential_problem() -> None:
    # The IAM layer's body says `Message` (BerriAI/litellm#28551: "User: arn:aws:iam::... is not authorized").
    body = _error(
        "User: arn:aws:iam::123456789012:user/gw is not authorized to perform: bedrock:InvokeModel", "Message"
    )
    err = ADAPTER.map_error(403, {"x-amzn-errortype": "AccessDeniedException"}, body, "aws")
    assert (err.status, err.type) == (502, "upstream_error")
    assert err.message.startswith("aws error (403): User: arn:aws:iam::123456789012:user/gw is not authorized")


def test_error_type_forms() -> None:
    assert error_type({"x-amzn-errortype": "ThrottlingException:http://internal.amazon.com/coral/"}, None) == (
        "ThrottlingException"
    )
    assert error_type({}, "com.amazon.coral.service#UnknownOperationException") == "UnknownOperationException"
    assert error_type({}, "throttlingException") == "ThrottlingException"
    assert error_type({}, None) is None


def test_a_plain_text_error_body_is_kept() -> None:
    err = ADAPTER.map_error(502, {}, b"<html>Bad Gateway</html>", "aws")
    assert err.message == "aws error (502): <html>Bad Gateway</html>"
    assert err.retryable is True
