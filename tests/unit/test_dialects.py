"""decode_error (msgspec failures -> param + loc) and the error bodies each dialect renders."""

from __future__ import annotations

import json
import typing
from typing import Any

import msgspec
import pytest

from gateway.path.dialects import OPENAI, PAIS, SGP, Dialect, RequestError, decode_error
from wire.errors import (
    AuthenticationError,
    GatewayError,
    InvalidRequestError,
    ModelNotFoundError,
    PermissionDeniedError,
    ProviderUnavailableError,
    UnsupportedParamError,
    UpstreamStatusError,
)
from wire.schema import CompletionRequest, decode_request


def decode_fails(body: dict[str, Any] | bytes) -> RequestError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)) as info:
        decode_request(raw)
    assert isinstance(info.value, msgspec.DecodeError | msgspec.ValidationError)
    return decode_error(info.value)


OK: dict[str, Any] = {"model": "demo/text", "prompt": "hi"}


def test_unknown_field() -> None:
    err = decode_fails({**OK, "foo": 1})
    assert (err.param, err.loc, err.code) == ("foo", ["foo"], "unknown_parameter")
    assert err.message == "Unrecognized request argument supplied: foo"
    assert (err.status, err.type) == (400, "invalid_request_error")


def test_unknown_nested_field() -> None:
    err = decode_fails({**OK, "stream": True, "stream_options": {"include_usage": True, "chunk": 1}})
    assert (err.param, err.loc, err.code) == ("stream_options.chunk", ["stream_options", "chunk"], "unknown_parameter")


def test_missing_field() -> None:
    err = decode_fails({"prompt": "hi"})
    assert (err.param, err.loc, err.code) == ("model", ["model"], "missing_required_parameter")
    assert err.message == "Missing required parameter: 'model'"


def test_nested_wrong_type() -> None:
    err = decode_fails({**OK, "stream": True, "stream_options": {"include_usage": "yes"}})
    assert (err.param, err.loc, err.code) == (
        "stream_options.include_usage",
        ["stream_options", "include_usage"],
        "invalid_value",
    )
    assert err.message == "Invalid value for 'stream_options.include_usage': Expected `bool | null`, got `str`"


@pytest.mark.parametrize(
    "field,value,problem",
    [
        ("temperature", 2.5, "Expected `float` <= 2.0"),
        ("n", 0, "Expected `int` >= 1"),
        ("logprobs", 101, "Expected `int` <= 100"),
        ("top_logprobs", 101, "Expected `int` <= 100"),
        ("max_tokens", "5", "Expected `int | null`, got `str`"),
        ("stop", ["a"] * 65, "Expected `array` of length <= 64"),
        ("inference_timeout", 0, "Expected `float` > 0.0"),
        ("context_length_exceeded_behavior", "drop", "Invalid enum value 'drop'"),
    ],
)
def test_out_of_range_and_wrong_type(field: str, value: Any, problem: str) -> None:
    err = decode_fails({**OK, field: value})
    assert (err.param, err.loc, err.code) == (field, [field], "invalid_value")
    assert err.message == f"Invalid value for '{field}': {problem}"


def _integer_fields() -> list[str]:
    """Every field of the request whose value is, or may be, an integer (`prompt` as token ids too)."""
    hints = typing.get_type_hints(CompletionRequest, include_extras=True)
    ints = [name for name, hint in hints.items() if "int" in repr(hint) and name != "prompt"]
    assert {"max_tokens", "seed", "n", "priority", "stop_token_ids"} <= set(ints)
    return ints


@pytest.mark.parametrize("field", _integer_fields())
@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 10**400])
def test_an_integer_past_64_bits_is_refused_naming_its_field(field: str, value: int) -> None:
    """JSON has no bound on integers; upstreams, the cache's key and the budgets' arithmetic do."""
    hint = repr(typing.get_type_hints(CompletionRequest, include_extras=True)[field])
    raw = json.dumps({**OK, field: [value] if hint.count("list[") else value}).encode()
    with pytest.raises(msgspec.ValidationError) as info:
        decode_request(raw)
    err = decode_error(info.value)
    assert (err.param, err.code) == (field, "invalid_value")
    assert "Expected `int` <=" in err.message or "Expected `int` >=" in err.message, err.message


@pytest.mark.parametrize("prompt", [[2**63], [[1, 2**64]], [-(2**63) - 1]])
def test_a_token_id_past_64_bits_is_refused(prompt: list[Any]) -> None:
    err = decode_fails({**OK, "prompt": prompt})
    assert (err.param, err.code) == ("prompt", "invalid_value")


def test_the_64_bit_integers_themselves_pass() -> None:
    req = decode_request(json.dumps({**OK, "seed": 2**63 - 1, "max_tokens": 2**63 - 1, "prompt": [2**63 - 1]}).encode())
    assert (req.seed, req.max_tokens, req.prompt) == (2**63 - 1, 2**63 - 1, [2**63 - 1])
    assert decode_request(json.dumps({**OK, "seed": -(2**63)}).encode()).seed == -(2**63)


def test_list_index_in_loc_not_in_param() -> None:
    err = decode_fails({**OK, "prompt": ["a", 1.5]})
    assert (err.param, err.loc) == ("prompt", ["prompt", 1])
    err = decode_fails({**OK, "prompt": [[1, "a"]]})
    assert (err.param, err.loc) == ("prompt", ["prompt", 0, 1])


def test_map_value_error_names_the_map() -> None:
    # msgspec reports a bad dict value at `$.logit_bias[...]`: the param is the field, not "logit_bias....".
    err = decode_fails({**OK, "logit_bias": {"50256": 101}})
    assert (err.param, err.loc) == ("logit_bias", ["logit_bias", "..."])
    assert err.message == "Invalid value for 'logit_bias': Expected `float` <= 100.0"


def test_not_an_object_and_not_json() -> None:
    err = decode_fails(b"[1, 2]")
    assert (err.param, err.loc, err.code) == (None, [], "invalid_value")
    assert err.message == "Invalid value for 'request body': Expected `object`, got `array`"
    for raw in (b"{bad", b"", b'{"model": "a",'):
        err = decode_fails(raw)
        assert (err.param, err.loc, err.code) == (None, [], "invalid_json")
        assert err.message == "We could not parse the JSON body of your request: it must be a JSON object"


# --- rendering -----------------------------------------------------------------------------------------


def render(dialect: Dialect, exc: GatewayError) -> tuple[int, Any]:
    status, body = dialect.error(exc)
    return status, json.loads(body)


def test_openai_dialect_shapes() -> None:
    assert render(OPENAI, decode_fails({**OK, "foo": 1})) == (
        400,
        {
            "error": {
                "message": "Unrecognized request argument supplied: foo",
                "type": "invalid_request_error",
                "param": "foo",
                "code": "unknown_parameter",
            }
        },
    )
    assert render(OPENAI, ModelNotFoundError("nope/x")) == (
        404,
        {
            "error": {
                "message": "The model 'nope/x' does not exist",
                "type": "invalid_request_error",
                "param": "model",
                "code": "model_not_found",
            }
        },
    )
    assert render(OPENAI, AuthenticationError("Incorrect API key provided", code="invalid_api_key")) == (
        401,
        {
            "error": {
                "message": "Incorrect API key provided",
                "type": "authentication_error",
                "param": None,
                "code": "invalid_api_key",
            }
        },
    )
    upstream = UpstreamStatusError("openai error (429): slow down", upstream_status=429, provider="openai")
    assert render(OPENAI, upstream) == (
        429,
        {
            "error": {
                "message": "openai error (429): slow down",
                "type": "rate_limit_error",
                "param": None,
                "code": None,
            }
        },
    )


@pytest.mark.parametrize("dialect", [SGP, PAIS], ids=["sgp", "pais"])
def test_fastapi_dialects_validation_is_422_detail_list(dialect: Dialect) -> None:
    err = decode_fails({**OK, "stream": True, "stream_options": {"include_usage": "yes"}})
    assert render(dialect, err) == (
        422,
        {
            "detail": [
                {
                    "loc": ["body", "stream_options", "include_usage"],
                    "msg": "Invalid value for 'stream_options.include_usage': Expected `bool | null`, got `str`",
                    "type": "invalid_value",
                }
            ]
        },
    )
    assert render(dialect, decode_fails({**OK, "prompt": ["a", 1.5]}))[1]["detail"][0]["loc"] == ["body", "prompt", 1]
    assert render(dialect, UnsupportedParamError("top_k", "pais")) == (
        422,
        {
            "detail": [
                {
                    "loc": ["body", "top_k"],
                    "msg": "Parameter 'top_k' is not supported by provider 'pais'",
                    "type": "unsupported_parameter",
                }
            ]
        },
    )
    # normalize()'s errors carry a dotted param, split into the loc.
    plain = InvalidRequestError("bad", param="stream_options.include_usage", code="invalid_value")
    assert render(dialect, plain)[1]["detail"][0]["loc"] == ["body", "stream_options", "include_usage"]


@pytest.mark.parametrize("dialect", [SGP, PAIS], ids=["sgp", "pais"])
def test_fastapi_dialects_other_errors(dialect: Dialect) -> None:
    assert render(dialect, ModelNotFoundError("nope/x")) == (
        404,
        {"detail": "Unknown model endpoint requested. The model 'nope/x' does not exist"},
    )
    unavailable = ProviderUnavailableError(
        "Provider 'openai' is unavailable: environment variable OPENAI_API_KEY is not set", param="model"
    )
    assert render(dialect, unavailable) == (
        400,
        {
            "detail": "Invalid model endpoint specified or model endpoint not ready. "
            "Provider 'openai' is unavailable: environment variable OPENAI_API_KEY is not set"
        },
    )
    assert render(dialect, PermissionDeniedError("Key 'k' may not use model 'm'", param="model")) == (
        403,
        {"detail": "Key 'k' may not use model 'm'"},
    )
    assert render(dialect, decode_fails(b"{bad")) == (
        422,
        {
            "detail": [
                {
                    "loc": ["body"],
                    "msg": "We could not parse the JSON body of your request: it must be a JSON object",
                    "type": "invalid_json",
                }
            ]
        },
    )
    upstream = UpstreamStatusError("x error (503): busy", upstream_status=503, provider="x")
    assert render(dialect, upstream) == (502, {"detail": "x error (503): busy"})


def test_dialect_names() -> None:
    assert (OPENAI.name, SGP.name, PAIS.name) == ("openai", "sgp", "pais")
