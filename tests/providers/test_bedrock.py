"""AWS Bedrock Converse: SigV4 against AWS's published test-suite vectors, the event-stream decoder against the
real recorded ConverseStream body, requests translated field by field, responses, streams and errors
normalized from the real recordings in tests/fixtures/bedrock (pydantic-ai cassettes, see SOURCES.md).

Frames the recordings lack (exception frames, a guardrail stop, non-string header types) are built with
tests/helpers/eventstream.py, which is first shown to reproduce a recorded frame byte for byte."""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
import zlib
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from yarl import URL

from gateway import emulation
from gateway.config import ConfigError, parse_config
from gateway.upstream.framing import DECODERS, EventStreamDecoder, EventStreamError
from providers import REGISTRY, sigv4
from providers.base import PARAM_FIELDS, Endpoint
from providers.bedrock import DEFAULT_BASE_URL, BedrockAdapter, credentials, error_type
from providers.envelope import Unreadable
from tests.helpers.adapters import NATIVE, SAMPLE, as_json, build, chunked, context, request, sample
from tests.helpers.eventstream import event, exception, frame, split_frames
from tests.helpers.recordings import fixture_bytes, fixture_json
from wire.errors import (
    InvalidRequestError,
    ProviderUnavailableError,
    UnsupportedParamError,
    UpstreamError,
    UpstreamStatusError,
)
from wire.schema import Completion

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
ADAPTER = BedrockAdapter(clock=lambda: NOW)
AKID = "AKIDEXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
CLAUDE = "anthropic.claude-3-haiku-20240307-v1:0"
NOVA = "us.amazon.nova-micro-v1:0"
# As the router builds it: the kind's default base URL, the provider's region and credentials.
ENDPOINT = Endpoint(
    provider="aws", model=CLAUDE, base_url=DEFAULT_BASE_URL, api_key=f"{AKID}:{SECRET}", region="us-east-1"
)
HOST = "bedrock-runtime.us-east-1.amazonaws.com"
STREAM = "bedrock/converse_stream.eventstream"
SUITE = fixture_json("bedrock/sigv4_test_suite.json")

EMULATED_FIELDS = (
    "n",
    "best_of",
    "echo",
    "include_stop_str_in_output",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)
REFUSED: dict[str, Any] = sample(
    "frequency_penalty",
    "presence_penalty",
    "logprobs",
    "suffix",
    "seed",
    "logit_bias",
    "response_format",
    "images",
    "context_length_exceeded_behavior",
    "audio",
    "modalities",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "prediction",
    *NATIVE,
)


def _hex_hmac(key: bytes, msg: str) -> str:
    return hmac.new(key, msg.encode(), hashlib.sha256).hexdigest()


def expected_authorization(creq: str, *, secret: str = SECRET, date: str = "20260102") -> str:
    """The Authorization header for a canonical request written out by hand: the string to sign and the HMAC
    chain computed here, independently of providers.sigv4's own composition."""
    signed = creq.split("\n")[-2]
    cscope = f"{date}/us-east-1/bedrock/aws4_request"
    sts = f"AWS4-HMAC-SHA256\n{date}T030405Z\n{cscope}\n{hashlib.sha256(creq.encode()).hexdigest()}"
    key = ("AWS4" + secret).encode()
    for part in (date, "us-east-1", "bedrock", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return f"AWS4-HMAC-SHA256 Credential={AKID}/{cscope}, SignedHeaders={signed}, Signature={_hex_hmac(key, sts)}"


# --- SigV4: AWS's published test suite -------------------------------------------------------------


@pytest.mark.parametrize("case", SUITE["cases"], ids=lambda c: c["name"])
def test_sigv4_reproduces_the_published_test_suite(case: dict[str, Any]) -> None:
    when = datetime.fromisoformat(SUITE["timestamp"].replace("Z", "+00:00"))
    # The date and the token are added by sign(); every other header of the suite request is signed as given.
    headers = {k: v for k, v in case["headers"] if k.lower() not in ("x-amz-date", "x-amz-security-token")}
    query = "?" + case["query"] if case["query"] else ""
    out = sigv4.sign(
        method=case["method"],
        url="https://example.amazonaws.com" + case["path"] + query,
        headers=headers,
        body=case["body"].encode(),
        access_key=SUITE["credentials"]["access_key_id"],
        secret_key=SUITE["credentials"]["secret_access_key"],
        region=SUITE["region"],
        service=SUITE["service"],
        now=when,
        session_token=case.get("session_token"),
    )
    assert out["authorization"] == case["authz"]
    assert out["x-amz-date"] == "20150830T123600Z"
    if "creq" in case:
        all_headers = {k: v for k, v in case["headers"]}
        creq, signed = sigv4.canonical_request(
            case["method"], case["path"], case["query"], all_headers, hashlib.sha256(case["body"].encode()).hexdigest()
        )
        assert creq == case["creq"]
        assert signed == case["authz"].split("SignedHeaders=")[1].split(",")[0]
        cscope = sigv4.scope("20150830", "us-east-1", "service")
        assert sigv4.string_to_sign("20150830T123600Z", cscope, creq) == case["sts"]


def test_signing_key_matches_the_documented_derivation() -> None:
    ex = SUITE["signing_key_example"]
    k_date = hmac.new(("AWS4" + ex["secret_access_key"]).encode(), ex["date"].encode(), hashlib.sha256).digest()
    k_region = hmac.new(k_date, ex["region"].encode(), hashlib.sha256).digest()
    k_service = hmac.new(k_region, ex["service"].encode(), hashlib.sha256).digest()
    assert (k_date.hex(), k_region.hex(), k_service.hex()) == (ex["k_date"], ex["k_region"], ex["k_service"])
    key = sigv4.signing_key(ex["secret_access_key"], ex["date"], ex["region"], ex["service"])
    assert key.hex() == ex["k_signing"]


def test_sigv4_needs_an_aware_time() -> None:
    with pytest.raises(ValueError):
        sigv4.amz_date(datetime(2026, 1, 2, 3, 4, 5))  # noqa: DTZ001 - the naive time is the point
    assert sigv4.amz_date(NOW) == "20260102T030405Z"


def test_host_of_keeps_the_port_and_drops_credentials() -> None:
    assert sigv4.host_of("http://127.0.0.1:8123/model/x/converse") == "127.0.0.1:8123"
    assert sigv4.host_of("https://user:pw@bedrock-runtime.eu-west-1.amazonaws.com/x") == (
        "bedrock-runtime.eu-west-1.amazonaws.com"
    )


# --- the event-stream decoder on the recorded ConverseStream body -----------------------------------


def _decode(raw: bytes, size: int) -> list[tuple[str | None, bytes]]:
    decoder = EventStreamDecoder()
    return [e for part in chunked(raw, size) for e in decoder.feed(part)] + decoder.close()


RECORDED_NAMES = ["messageStart"] + ["contentBlockDelta"] * 29 + ["contentBlockStop", "messageStop", "metadata"]


def test_recorded_stream_decodes_into_its_33_events() -> None:
    events = _decode(fixture_bytes(STREAM), 100_000)
    assert [name for name, _ in events] == RECORDED_NAMES
    assert json.loads(events[0][1])["role"] == "assistant"
    assert json.loads(events[1][1])["delta"] == {"text": "The"}
    assert json.loads(events[-2][1])["stopReason"] == "end_turn"
    assert json.loads(events[-1][1])["usage"] == {
        "inputTokens": 13,
        "outputTokens": 82,
        "serverToolUsage": {},
        "totalTokens": 95,
    }


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11, 12, 13, 16, 64, 181, 333, 4096])
def test_recorded_stream_in_odd_chunks(size: int) -> None:
    assert _decode(fixture_bytes(STREAM), size) == _decode(fixture_bytes(STREAM), 100_000)


def test_recorded_stream_split_at_every_byte() -> None:
    raw = fixture_bytes(STREAM)
    whole = _decode(raw, len(raw))
    for cut in range(1, len(raw)):
        decoder = EventStreamDecoder()
        assert decoder.feed(raw[:cut]) + decoder.feed(raw[cut:]) + decoder.close() == whole


def test_the_test_encoder_reproduces_recorded_frames_byte_for_byte() -> None:
    frames = split_frames(fixture_bytes(STREAM))
    assert len(frames) == 33
    for raw, (name, payload) in zip(frames, _decode(fixture_bytes(STREAM), 100_000), strict=True):
        assert name is not None
        assert event(name, json.loads(payload)) == raw


def test_a_corrupt_payload_byte_fails_the_message_checksum() -> None:
    raw = bytearray(fixture_bytes(STREAM))
    raw[181 + 120] ^= 0x01  # inside the second frame's payload
    decoder = EventStreamDecoder()
    with pytest.raises(EventStreamError, match="message checksum mismatch") as info:
        for part in chunked(bytes(raw), 50):
            decoder.feed(part)
    assert isinstance(info.value, UpstreamError)
    assert info.value.retryable is True
    assert info.value.status == 502


def test_a_corrupt_length_fails_the_prelude_checksum_before_waiting_for_the_frame() -> None:
    raw = bytearray(fixture_bytes(STREAM))
    raw[3] ^= 0x40  # the first frame's total length
    with pytest.raises(EventStreamError, match="prelude checksum mismatch"):
        EventStreamDecoder().feed(bytes(raw[:12]))


def test_a_json_body_is_not_an_event_stream() -> None:
    # What Bedrock answers (HTTP 200) to a path it cannot route (BerriAI/litellm#28551).
    body = b'{"Output":{"__type":"com.amazon.coral.service#UnknownOperationException"},"Version":"1.0"}'
    with pytest.raises(EventStreamError, match=r"prelude checksum mismatch \(starts b'\{\"Output"):
        EventStreamDecoder().feed(body)


def test_impossible_lengths_are_refused() -> None:
    prelude = struct.pack(">II", 8, 0)
    with pytest.raises(EventStreamError, match="length 8"):
        EventStreamDecoder().feed(prelude + struct.pack(">I", zlib.crc32(prelude)))
    prelude = struct.pack(">II", 40, 30)
    with pytest.raises(EventStreamError, match="headers 30"):
        EventStreamDecoder().feed(prelude + struct.pack(">I", zlib.crc32(prelude)))


def test_a_stream_cut_inside_a_frame_raises_on_close() -> None:
    raw = fixture_bytes(STREAM)
    decoder = EventStreamDecoder()
    assert [n for n, _ in decoder.feed(raw[:-10])] == RECORDED_NAMES[:-1]
    with pytest.raises(EventStreamError, match=r"inside a frame \(229 bytes unread\)"):
        decoder.close()


def test_exception_and_error_frames_are_named_by_their_type() -> None:
    raw = exception("throttlingException", "Too many requests, please wait before trying again.")
    error = frame([(":message-type", "error"), (":error-code", "InternalFailure"), (":error-message", "boom")], b"")
    assert _decode(raw + error, 9) == [
        ("exception:throttlingException", b'{"message": "Too many requests, please wait before trying again."}'),
        ("error:InternalFailure", b"boom"),
    ]


def test_non_string_headers_are_skipped() -> None:
    def header(name: str, kind: int, value: bytes) -> bytes:
        return bytes([len(name)]) + name.encode() + bytes([kind]) + value

    headers = (
        header(":event-type", 7, struct.pack(">H", 8) + b"metadata")
        + header("t", 0, b"")
        + header("f", 1, b"")
        + header("b", 2, b"\x01")
        + header("s", 3, b"\x00\x02")
        + header("i", 4, b"\x00\x00\x00\x03")
        + header("l", 5, b"\x00" * 8)
        + header("raw", 6, struct.pack(">H", 3) + b"xyz")
        + header("ts", 8, b"\x00" * 8)
        + header("id", 9, b"\x00" * 16)
    )
    payload = b"{}"
    total = 12 + len(headers) + len(payload) + 4
    prelude = struct.pack(">II", total, len(headers))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + headers + payload
    raw = message + struct.pack(">I", zlib.crc32(message))
    assert _decode(raw, 5) == [("metadata", b"{}")]
    bad = message.replace(bytes([2]) + b"\x01", bytes([42]) + b"\x01", 1)
    bad_raw = bad + struct.pack(">I", zlib.crc32(bad))
    with pytest.raises(EventStreamError, match="unknown header type 42"):
        EventStreamDecoder().feed(bad_raw)


def test_the_pipeline_picks_the_decoder_by_framing() -> None:
    assert BedrockAdapter.framing == "eventstream"
    assert DECODERS["eventstream"] is EventStreamDecoder


# --- request translation ----------------------------------------------------------------------------


def test_registered_under_its_kind() -> None:
    assert REGISTRY["bedrock"] is BedrockAdapter


def test_every_canonical_field_is_mapped_emulated_or_refused() -> None:
    native = {"max_tokens", "temperature", "top_p", "top_k", "stop", "user"}
    assert set(ADAPTER.params) == native | set(EMULATED_FIELDS)
    assert all(ADAPTER.params[f].emulated for f in EMULATED_FIELDS)
    assert set(PARAM_FIELDS) == native | set(EMULATED_FIELDS) | set(REFUSED)


def test_every_native_field_reaches_the_converse_body_and_the_request_is_signed() -> None:
    req = request(
        "aws/" + CLAUDE,
        "What is the capital of France?",
        max_tokens=50,
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        stop=["Paris", "\n\n"],
        user="user-1234",
    )
    up, body, dropped = build(ADAPTER, req, ENDPOINT)
    assert (up.method, up.stream, dropped) == ("POST", False, [])
    assert up.url == f"https://{HOST}/model/anthropic.claude-3-haiku-20240307-v1:0/converse"
    assert body == {
        "messages": [{"role": "user", "content": [{"text": "What is the capital of France?"}]}],
        "inferenceConfig": {"maxTokens": 50, "temperature": 0.5, "topP": 0.9, "stopSequences": ["Paris", "\n\n"]},
        "additionalModelRequestFields": {"top_k": 40},
        "requestMetadata": {"user": "user-1234"},
    }
    creq = (
        "POST\n/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse\n\n"
        f"content-type:application/json\nhost:{HOST}\nx-amz-date:20260102T030405Z\n\n"
        f"content-type;host;x-amz-date\n{hashlib.sha256(up.body).hexdigest()}"
    )
    assert up.headers == {
        "content-type": "application/json",
        "host": HOST,
        "x-amz-date": "20260102T030405Z",
        "authorization": expected_authorization(creq),
    }


def test_minimal_body_sends_no_inference_config() -> None:
    up, body, _ = build(ADAPTER, request(prompt="Hi"), ENDPOINT)
    assert body == {"messages": [{"role": "user", "content": [{"text": "Hi"}]}]}
    assert up.body == b'{"messages":[{"role":"user","content":[{"text":"Hi"}]}]}'


def test_stream_goes_to_converse_stream() -> None:
    up, body, _ = build(ADAPTER, request(stream=True, stream_options={"include_usage": True}), ENDPOINT)
    assert up.stream is True
    assert up.url == f"https://{HOST}/model/anthropic.claude-3-haiku-20240307-v1:0/converse-stream"
    # ConverseStream always reports usage (metadata event): nothing like stream_options goes upstream.
    assert body == {"messages": [{"role": "user", "content": [{"text": "Say this is a test"}]}]}


def test_session_token_is_sent_and_signed() -> None:
    endpoint = msgspec.structs.replace(ENDPOINT, api_key=f"{AKID}:{SECRET}:FwoGZXIvYXdzEXAMPLETOKEN==")
    up, _, _ = build(ADAPTER, request(prompt="Hi"), endpoint)
    assert up.headers["x-amz-security-token"] == "FwoGZXIvYXdzEXAMPLETOKEN=="
    creq = (
        "POST\n/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse\n\n"
        f"content-type:application/json\nhost:{HOST}\nx-amz-date:20260102T030405Z\n"
        "x-amz-security-token:FwoGZXIvYXdzEXAMPLETOKEN==\n\n"
        f"content-type;host;x-amz-date;x-amz-security-token\n{hashlib.sha256(up.body).hexdigest()}"
    )
    assert up.headers["authorization"] == expected_authorization(creq)


def test_an_empty_session_token_part_means_none() -> None:
    # `${AWS_SESSION_TOKEN:-}` left empty: long-term keys.
    assert credentials(f"{AKID}:{SECRET}:", "aws") == (AKID, SECRET, None)
    endpoint = msgspec.structs.replace(ENDPOINT, api_key=f"{AKID}:{SECRET}:")
    up, _, _ = build(ADAPTER, request(prompt="Hi"), endpoint)
    assert "x-amz-security-token" not in up.headers


def test_bedrock_api_key_is_a_bearer_token() -> None:
    endpoint = msgspec.structs.replace(ENDPOINT, api_key="ABSKQmVkcm9ja0FQSUtleS1leGFtcGxl")
    up, _, _ = build(ADAPTER, request(prompt="Hi"), endpoint)
    assert up.headers == {
        "content-type": "application/json",
        "authorization": "Bearer ABSKQmVkcm9ja0FQSUtleS1leGFtcGxl",
    }


@pytest.mark.parametrize("key", [":secret", "akid:", "a:b:c:d"])
def test_malformed_credentials_are_a_provider_error(key: str) -> None:
    endpoint = msgspec.structs.replace(ENDPOINT, api_key=key)
    with pytest.raises(ProviderUnavailableError) as info:
        build(ADAPTER, request(), endpoint)
    assert info.value.message == (
        "Provider 'aws' api_key must be ACCESS_KEY_ID:SECRET_ACCESS_KEY[:SESSION_TOKEN] or an Amazon Bedrock API key"
    )


@pytest.mark.parametrize("region", [None, ""])
def test_no_region_refuses_before_any_call(region: str | None) -> None:
    endpoint = msgspec.structs.replace(ENDPOINT, region=region)
    with pytest.raises(ProviderUnavailableError) as info:
        build(ADAPTER, request(), endpoint)
    assert info.value.message == "Provider 'aws' is unavailable: it has no region configured"
    assert info.value.code == "provider_unavailable"


def test_base_url_override_keeps_the_region_in_the_signature_and_the_port_in_host() -> None:
    endpoint = msgspec.structs.replace(ENDPOINT, base_url="http://127.0.0.1:8123/", region="eu-west-3", model=NOVA)
    up, _, _ = build(ADAPTER, request(prompt="Hi"), endpoint)
    assert up.url == "http://127.0.0.1:8123/model/us.amazon.nova-micro-v1:0/converse"
    assert up.headers["host"] == "127.0.0.1:8123"
    assert "Credential=AKIDEXAMPLE/20260102/eu-west-3/bedrock/aws4_request" in up.headers["authorization"]


def test_default_base_url_takes_the_region() -> None:
    endpoint = msgspec.structs.replace(ENDPOINT, region="ap-southeast-2")
    up, _, _ = build(ADAPTER, request(), endpoint)
    assert up.url.startswith("https://bedrock-runtime.ap-southeast-2.amazonaws.com/model/")
    assert up.headers["host"] == "bedrock-runtime.ap-southeast-2.amazonaws.com"


def test_an_arn_model_id_is_one_path_segment_signed_as_sent() -> None:
    arn = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-5-haiku-20241022-v1:0"
    up, _, _ = build(ADAPTER, request(prompt="Hi"), msgspec.structs.replace(ENDPOINT, model=arn))
    wire = (
        "/model/arn:aws:bedrock:us-east-1:123456789012:inference-profile%2F"
        "us.anthropic.claude-3-5-haiku-20241022-v1:0/converse"
    )
    assert up.url == f"https://{HOST}{wire}"
    # aiohttp re-parses the URL with yarl: the path it sends is the one signed.
    assert URL(up.url).raw_path == wire
    creq = (
        "POST\n/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%252F"
        "us.anthropic.claude-3-5-haiku-20241022-v1%3A0/converse\n\n"
        f"content-type:application/json\nhost:{HOST}\nx-amz-date:20260102T030405Z\n\n"
        f"content-type;host;x-amz-date\n{hashlib.sha256(up.body).hexdigest()}"
    )
    assert up.headers["authorization"] == expected_authorization(creq)


@pytest.mark.parametrize(
    "model,expected",
    [
        (CLAUDE, {"top_k": 20}),
        ("us.anthropic.claude-sonnet-4-5-20250929-v1:0", {"top_k": 20}),
        (NOVA, {"inferenceConfig": {"topK": 20}}),
        ("amazon.nova-lite-v1:0", {"inferenceConfig": {"topK": 20}}),
    ],
)
def test_top_k_goes_where_the_model_family_takes_it(model: str, expected: dict[str, Any]) -> None:
    # The two shapes pydantic-ai recorded Bedrock accepting (test_bedrock_top_k_{anthropic,nova}_variant.yaml).
    _, body, _ = build(ADAPTER, request(top_k=20), msgspec.structs.replace(ENDPOINT, model=model))
    assert body["additionalModelRequestFields"] == expected
    assert "__top_k" not in body


def test_top_k_for_another_family_is_refused_naming_it() -> None:
    endpoint = msgspec.structs.replace(ENDPOINT, model="meta.llama3-8b-instruct-v1:0")
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(top_k=20), endpoint)
    assert info.value.param == "top_k"
    assert info.value.message == (
        "Parameter 'top_k' is not supported by provider 'aws' for model 'meta.llama3-8b-instruct-v1:0'"
        " (Bedrock takes it for Anthropic Claude and Amazon Nova models only)"
    )


@pytest.mark.parametrize("top_k", [-1, 0])
def test_top_k_off_sends_nothing(top_k: int) -> None:
    endpoint = msgspec.structs.replace(ENDPOINT, model="meta.llama3-8b-instruct-v1:0")
    _, body, _ = build(ADAPTER, request(top_k=top_k), endpoint)
    assert "additionalModelRequestFields" not in body


def test_bare_string_stop_becomes_a_list() -> None:
    _, body, _ = build(ADAPTER, request(stop="\n"), ENDPOINT)
    assert body["inferenceConfig"] == {"stopSequences": ["\n"]}


def test_stops_go_upstream_and_the_gateway_cuts_them_too() -> None:
    # The Nova recording answers with the stop string itself: the gateway enforces stops on the text as well.
    assert BedrockAdapter.stop_in_output is True
    em = emulation.plan(ADAPTER, request(stop=["Paris"]), "aws", 0)
    assert em is not None and (em.stops, em.upstream_stop) == (["Paris"], ["Paris"])
    out = ADAPTER.parse_response(fixture_bytes("bedrock/converse_stop_nova_keeps_stop_text.json"), context())
    assert (out.choices[0].text, out.choices[0].finish_reason) == ("Paris", "stop")


def test_configured_default_max_tokens_is_sent_unless_the_request_has_one() -> None:
    endpoint = msgspec.structs.replace(ENDPOINT, default_max_tokens=1024)
    assert build(ADAPTER, request(), endpoint)[1]["inferenceConfig"] == {"maxTokens": 1024}
    assert build(ADAPTER, request(max_tokens=5), endpoint)[1]["inferenceConfig"] == {"maxTokens": 5}
    assert build(ADAPTER, request(max_new_tokens=6), endpoint)[1]["inferenceConfig"] == {"maxTokens": 6}
    assert BedrockAdapter.default_max_tokens == 4096


def test_extra_params_merge_one_level_and_extra_headers_are_signed() -> None:
    endpoint = msgspec.structs.replace(ENDPOINT, headers={"X-Amzn-Bedrock-Trace": "ENABLED"})
    req = request(
        max_tokens=3,
        top_k=5,
        inference_extra_params={
            "inferenceConfig": {"topP": 0.5},
            "additionalModelRequestFields": {"anthropic_beta": ["x"]},
            "guardrailConfig": {"guardrailIdentifier": "g1", "guardrailVersion": "DRAFT"},
        },
        inference_extra_headers={"x-trace-id": "t-1", "X-Amz-Security-Token": "not-from-the-client"},
    )
    up, body, _ = build(ADAPTER, req, endpoint)
    assert body["inferenceConfig"] == {"maxTokens": 3, "topP": 0.5}  # maxTokens is guarded: never from extras
    assert body["additionalModelRequestFields"] == {"top_k": 5, "anthropic_beta": ["x"]}
    assert body["guardrailConfig"] == {"guardrailIdentifier": "g1", "guardrailVersion": "DRAFT"}
    assert up.headers["x-amzn-bedrock-trace"] == "ENABLED"
    assert up.headers["x-trace-id"] == "t-1"
    # Only the gateway's own credentials sign the call.
    assert "x-amz-security-token" not in up.headers
    assert "SignedHeaders=content-type;host;x-amz-date;x-amzn-bedrock-trace;x-trace-id," in up.headers["authorization"]


def test_each_call_is_signed_at_its_own_time() -> None:
    times = iter([NOW, datetime(2026, 1, 2, 3, 9, 0, tzinfo=UTC)])
    adapter = BedrockAdapter(clock=lambda: next(times))
    first, _, _ = build(adapter, request(), ENDPOINT)
    second, _, _ = build(adapter, request(), ENDPOINT)
    assert (first.headers["x-amz-date"], second.headers["x-amz-date"]) == ("20260102T030405Z", "20260102T030900Z")
    assert first.headers["authorization"] != second.headers["authorization"]


@pytest.mark.parametrize("field", EMULATED_FIELDS)
def test_emulated_fields_write_nothing_upstream(field: str) -> None:
    value = SAMPLE[field]
    _, body, dropped = build(ADAPTER, request(**dict[str, Any]({field: value})), ENDPOINT)
    assert dropped == []
    assert body == {"messages": [{"role": "user", "content": [{"text": "Say this is a test"}]}]}


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_unsupported_fields_are_refused_naming_field_and_provider(field: str) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(**{field: REFUSED[field]}), ENDPOINT)
    assert info.value.status == 400
    assert info.value.param == field
    assert info.value.message == f"Parameter '{field}' is not supported by provider 'aws'"


@pytest.mark.parametrize("logprobs", [0, 3, 5])
def test_logprobs_can_be_dropped_under_the_drop_policy(logprobs: int) -> None:
    _, body, dropped = build(ADAPTER, request(logprobs=logprobs, seed=1), ENDPOINT, drop=True)
    assert dropped == ["logprobs", "seed"]
    assert body == {"messages": [{"role": "user", "content": [{"text": "Say this is a test"}]}]}


@pytest.mark.parametrize("temperature", [1.01, 2.0])
def test_temperature_above_one_is_refused_not_clamped(temperature: float) -> None:
    with pytest.raises(InvalidRequestError) as info:
        ADAPTER.check(request(temperature=temperature), "aws")
    assert (info.value.param, info.value.code) == ("temperature", "invalid_value")
    assert info.value.message == f"Provider 'aws' accepts 'temperature' from 0 to 1, got {temperature:g}"


@pytest.mark.parametrize("prompt", [["a", "b"], [1, 2], [[1], [2]]])
def test_only_a_single_text_prompt(prompt: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        ADAPTER.check(request(prompt=prompt), "aws")
    assert info.value.param == "prompt"


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
    return [ADAPTER.parse_event(name, data, ctx) for name, data in _decode(raw, size)]


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
    events = _decode(raw, 13)
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


# --- config -----------------------------------------------------------------------------------------

BEDROCK_YAML = """
providers:
  aws:
    kind: bedrock
    api_key: ${AWS_ACCESS_KEY_ID}:${AWS_SECRET_ACCESS_KEY}
"""


def test_config_requires_a_region_for_bedrock() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(BEDROCK_YAML, "c.yaml", env={"AWS_ACCESS_KEY_ID": AKID, "AWS_SECRET_ACCESS_KEY": SECRET})
    assert str(info.value) == "c.yaml: providers.aws.region: required for kind 'bedrock'"


def test_config_rejects_a_malformed_region() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(BEDROCK_YAML + "    region: us-east1\n", "c.yaml", env={})
    assert str(info.value).startswith("c.yaml: providers.aws.region: Expected `str` matching regex")


def test_config_region_and_credentials_from_the_environment() -> None:
    yaml_text = BEDROCK_YAML + "    region: ${AWS_REGION}\n"
    env = {"AWS_ACCESS_KEY_ID": AKID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "eu-central-1"}
    loaded = parse_config(yaml_text, "c.yaml", env=env)
    p = loaded.providers["aws"]
    assert (p.kind, p.region, p.api_key) == ("bedrock", "eu-central-1", f"{AKID}:{SECRET}")
    # An unset secret marks the provider unavailable by name (the router's rule for api_key variables).
    missing = parse_config(yaml_text, "c.yaml", env={"AWS_ACCESS_KEY_ID": AKID, "AWS_REGION": "eu-central-1"})
    assert missing.missing_env == {"providers.aws.api_key": ["AWS_SECRET_ACCESS_KEY"]}
    # An unset region variable loads (as "") and the adapter refuses the call naming the region.
    unset = parse_config(yaml_text, "c.yaml", env={"AWS_ACCESS_KEY_ID": AKID, "AWS_SECRET_ACCESS_KEY": SECRET})
    assert unset.providers["aws"].region == ""
