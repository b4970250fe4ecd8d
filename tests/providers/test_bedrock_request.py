"""AWS Bedrock Converse: requests translated field by field and signed, and the provider's config (region,
credentials)."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from yarl import URL

from gateway import emulation
from gateway.config import ConfigError, parse_config
from providers import REGISTRY
from providers.base import Endpoint
from providers.bedrock import DEFAULT_BASE_URL, BedrockAdapter, credentials
from tests.helpers.adapters import COMPLETION_FIELDS, NATIVE, OPENAI_ONLY, SAMPLE, build, context, request, sample
from tests.helpers.recordings import fixture_bytes
from tests.providers.bedrock_setup import ADAPTER, NOW
from wire.errors import (
    InvalidRequestError,
    ProviderUnavailableError,
    UnsupportedParamError,
)

AKID = "AKIDEXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
CLAUDE = "anthropic.claude-3-haiku-20240307-v1:0"
NOVA = "us.amazon.nova-micro-v1:0"
# As the router builds it: the kind's default base URL, the provider's region and credentials.
ENDPOINT = Endpoint(
    provider="aws", model=CLAUDE, base_url=DEFAULT_BASE_URL, api_key=f"{AKID}:{SECRET}", region="us-east-1"
)
HOST = "bedrock-runtime.us-east-1.amazonaws.com"


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
    "reasoning_effort",
    *OPENAI_ONLY,
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


# --- request translation ----------------------------------------------------------------------------


def test_registered_under_its_kind() -> None:
    assert REGISTRY["bedrock"] is BedrockAdapter


def test_every_canonical_field_is_mapped_emulated_or_refused() -> None:
    native = {"max_tokens", "temperature", "top_p", "top_k", "stop", "user"}
    assert set(ADAPTER.params) == native | set(EMULATED_FIELDS)
    assert all(ADAPTER.params[f].emulated for f in EMULATED_FIELDS)
    assert set(COMPLETION_FIELDS) == native | set(EMULATED_FIELDS) | set(REFUSED)


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


@pytest.mark.parametrize("region", ["us-east1", '"us-east-1\\n"', '"\\n"', "us-east-\u0661"])
def test_config_rejects_a_malformed_region(region: str) -> None:
    # A final newline or a digit of another script would go into the endpoint's host name.
    with pytest.raises(ConfigError) as info:
        parse_config(BEDROCK_YAML + f"    region: {region}\n", "c.yaml", env={})
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
