"""gateway.path.request.normalize: alias folding, precedence, and the checks msgspec cannot express."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gateway.config import CapsConfig
from gateway.emulation.planning import GUIDED_CHOICE_CHARS, GUIDED_CHOICES
from gateway.path.dialects import decode_error
from gateway.path.request import FORBIDDEN_HEADERS, MAX_CHOICES, normalize
from tests.helpers.adapters import request
from wire.errors import InvalidRequestError
from wire.schema import MAX_LOGPROBS, MAX_STOPS, CompletionRequest, decode_request


def refused(param: str, **fields: Any) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        request(**fields)
    err = info.value
    assert err.param == param
    assert (err.status, err.type, err.code) == (400, "invalid_request_error", "invalid_value")
    return err


def canonical(req: CompletionRequest) -> tuple[Any, ...]:
    return (req.max_tokens, req.max_new_tokens, req.max_completion_tokens)


# --- token limit ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [{"max_tokens": 9}, {"max_new_tokens": 9}, {"max_completion_tokens": 9}, {"max_tokens": 9, "max_new_tokens": 9}],
)
def test_token_limit_names_fold_into_max_tokens(fields: dict[str, Any]) -> None:
    assert canonical(request(**fields)) == (9, None, None)


def test_all_three_equal_is_fine() -> None:
    assert canonical(request(max_tokens=4, max_new_tokens=4, max_completion_tokens=4)) == (4, None, None)


def test_zero_is_a_value_not_absence() -> None:
    assert request(max_tokens=0).max_tokens == 0
    refused("max_new_tokens", max_tokens=0, max_new_tokens=1)


@pytest.mark.parametrize(
    "fields,param",
    [
        ({"max_tokens": 1, "max_new_tokens": 2}, "max_new_tokens"),
        ({"max_tokens": 1, "max_completion_tokens": 2}, "max_completion_tokens"),
        ({"max_new_tokens": 1, "max_completion_tokens": 2}, "max_completion_tokens"),
        ({"max_tokens": 3, "max_new_tokens": 3, "max_completion_tokens": 2}, "max_completion_tokens"),
    ],
)
def test_disagreement_names_the_later_field(fields: dict[str, int], param: str) -> None:
    err = refused(param, **fields)
    assert err.message.startswith(f"'{param}' (")


# --- stop ----------------------------------------------------------------------------------------------


def test_stop_string_becomes_a_list() -> None:
    req = request(stop="\n")
    assert (req.stop, req.stop_sequences) == (["\n"], None)


def test_stop_sequences_fold_into_stop() -> None:
    req = request(stop_sequences=["a", "b"])
    assert (req.stop, req.stop_sequences) == (["a", "b"], None)


def test_stop_and_equal_stop_sequences() -> None:
    assert request(stop="a", stop_sequences=["a"]).stop == ["a"]
    assert request(stop=["a", "b"], stop_sequences=["a", "b"]).stop == ["a", "b"]


def test_stop_and_different_stop_sequences() -> None:
    assert (
        refused("stop_sequences", stop=["a"], stop_sequences=["b"]).message == "'stop_sequences' disagrees with 'stop'"
    )


def test_empty_stop_list_is_no_stop() -> None:
    assert request(stop=[]).stop is None


@pytest.mark.parametrize("field", ["stop", "stop_sequences"])
def test_more_stops_than_openai_takes_are_a_request_not_an_error(field: str) -> None:
    # lm-eval's humaneval and gsm8k-cot send 5 and 6; the provider's own count is checked after routing.
    six = ["\nclass", "\ndef", "\n#", "\nif", "\nprint", "Question:"]
    assert request(**dict[str, Any]({field: six})).stop == six
    assert len(request(**dict[str, Any]({field: [str(i) for i in range(MAX_STOPS)]})).stop or ()) == MAX_STOPS


@pytest.mark.parametrize("field", ["stop", "stop_sequences"])
def test_stop_count_has_an_absolute_bound(field: str) -> None:
    err = decode_error(_decode_fails(**{field: [str(i) for i in range(MAX_STOPS + 1)]}))
    assert (err.param, err.code) == (field, "invalid_value")
    assert err.message == f"Invalid value for '{field}': Expected `array` of length <= {MAX_STOPS}"


@pytest.mark.parametrize(
    "choices",
    [
        [str(i) for i in range(GUIDED_CHOICES + 1)],
        ["x" * (GUIDED_CHOICE_CHARS // 2), "y" * (GUIDED_CHOICE_CHARS // 2 + 1)],
    ],
    ids=["entries", "characters"],
)
def test_guided_choice_is_bounded_whoever_serves_it(choices: list[str]) -> None:
    # The bound holds at normalize, before any route is chosen: a native grammar is built from the choices too.
    err = refused("guided_choice", guided_choice=choices)
    assert err.message == (
        f"'guided_choice' may have at most {GUIDED_CHOICES} entries of at most {GUIDED_CHOICE_CHARS} "
        "characters together"
    )


def test_guided_choice_at_its_bounds_is_taken() -> None:
    at_most = [str(i) for i in range(GUIDED_CHOICES)]
    assert request(guided_choice=at_most).guided_choice == at_most
    widest = ["x" * (GUIDED_CHOICE_CHARS // 2), "y" * (GUIDED_CHOICE_CHARS // 2)]
    assert request(guided_choice=widest).guided_choice == widest
    refused("guided_choice", guided_choice=[])


@pytest.mark.parametrize("field", ["stop", "stop_sequences"])
def test_each_stop_is_held_to_the_pattern_bound(field: str) -> None:
    caps = CapsConfig(pattern_chars=16)
    assert normalize(_decoded(**{field: ["x" * 16, "y"]}), caps).stop == ["x" * 16, "y"]
    with pytest.raises(InvalidRequestError) as info:
        normalize(_decoded(**{field: ["y", "x" * 17]}), caps)
    assert (info.value.param, info.value.code) == (field, "invalid_value")
    assert info.value.message == f"'{field}' may hold sequences of at most 16 characters"


def _decoded(**fields: Any) -> CompletionRequest:
    return decode_request(msgspec.json.encode({"model": "m/x", "prompt": "p", **fields}))


def _decode_fails(**fields: Any) -> msgspec.ValidationError:
    with pytest.raises(msgspec.ValidationError) as info:
        _decoded(**fields)
    return info.value


# --- logprobs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields,count",
    [
        ({"logprobs": 3}, 3),
        ({"logprobs": 0}, 0),
        ({"logprobs": True}, 0),
        ({"logprobs": True, "top_logprobs": 7}, 7),
        # Counts beyond OpenAI's 5 and 20 are the provider's to refuse (vLLM takes 20, or its --max-logprobs).
        ({"logprobs": 10}, 10),
        ({"logprobs": True, "top_logprobs": 30}, 30),
        ({"logprobs": MAX_LOGPROBS}, MAX_LOGPROBS),
        ({"logprobs": True, "top_logprobs": 0}, 0),
        ({"logprobs": False}, None),
        ({"return_token_log_probs": True}, 0),
        ({"return_token_log_probs": False}, None),
        ({"logprobs": 4, "return_token_log_probs": True}, 4),
        ({"logprobs": 2, "top_logprobs": 2}, 2),
        ({}, None),
    ],
)
def test_logprobs_forms(fields: dict[str, Any], count: int | None) -> None:
    req = request(**fields)
    assert req.logprobs == count
    assert isinstance(req.logprobs, int | None) and not isinstance(req.logprobs, bool)
    assert (req.top_logprobs, req.return_token_log_probs) == (None, None)


@pytest.mark.parametrize(
    "fields",
    [
        {"top_logprobs": 3},
        {"logprobs": False, "top_logprobs": 3},
        {"logprobs": 2, "top_logprobs": 3},
        {"top_logprobs": 0},
    ],
)
def test_top_logprobs_needs_agreeing_logprobs(fields: dict[str, Any]) -> None:
    refused("top_logprobs", **fields)


# --- best_of, n, prompts -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields", [{"logprobs": MAX_LOGPROBS + 1}, {"logprobs": True, "top_logprobs": MAX_LOGPROBS + 1}]
)
def test_logprobs_count_has_an_absolute_bound(fields: dict[str, Any]) -> None:
    err = decode_error(_decode_fails(**fields))
    assert err.param == ("top_logprobs" if "top_logprobs" in fields else "logprobs")
    assert err.message.endswith(f"<= {MAX_LOGPROBS}")


def test_best_of_rules() -> None:
    assert request(n=2, best_of=2).best_of == 2
    assert request(best_of=3).best_of == 3
    assert refused("best_of", n=3, best_of=2).message == "'best_of' must be greater than or equal to 'n'"
    assert refused("best_of", best_of=2, stream=True).message == "'best_of' cannot be used with 'stream'"


def test_choice_cap() -> None:
    assert MAX_CHOICES == 128
    assert request(n=128).n == 128
    assert request(prompt=["a"] * 64, n=2).n == 2
    refused("n", n=129)
    refused("n", prompt=["a"] * 65, n=2)
    refused("n", prompt=["a", "b"], best_of=65)
    # Token ids are one prompt; token-id lists are one prompt each.
    assert request(prompt=list(range(500)), n=128).n == 128
    refused("n", prompt=[[1]] * 129)


@pytest.mark.parametrize(
    "prompt",
    ["", "text", ["a", "b"], [1, 2, 3], [0], [[1, 2], [3]]],
)
def test_prompt_forms_accepted(prompt: Any) -> None:
    assert request(prompt=prompt).prompt == prompt


@pytest.mark.parametrize(
    "prompt,message",
    [
        ([], "'prompt' must not be an empty list"),
        (["a", 1], "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists"),
        ([1, "a"], "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists"),
        ([[1], 2], "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists"),
        ([1, [2]], "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists"),
        ([[1], []], "'prompt' token-id lists must not be empty"),
        ([1, -2], "'prompt' token ids must be non-negative"),
        ([[1], [-2]], "'prompt' token ids must be non-negative"),
    ],
)
def test_prompt_forms_refused(prompt: Any, message: str) -> None:
    assert refused("prompt", prompt=prompt).message == message


# --- stream_options, guided, timeout, extras -------------------------------------------------------------


def test_stream_options_need_stream() -> None:
    assert request(stream=True, stream_options={"include_usage": True}).stream_options is not None
    refused("stream_options", stream_options={"include_usage": True})
    refused("stream_options", stream=False, stream_options={"include_usage": True})


def test_one_structured_output_constraint() -> None:
    err = refused("guided_choice", guided_regex="a", guided_choice=["a"])
    assert err.message == "only one structured-output constraint may be set, got guided_regex, guided_choice"
    refused("guided_regex", guided_json={"type": "object"}, guided_regex="a", guided_grammar="g")
    refused("response_format", guided_json={}, response_format={"type": "json_object", "schema": {"type": "object"}})
    refused("guided_choice", guided_choice=[])
    # A schema-less response_format alongside a guided field is not a second schema.
    assert request(guided_regex="a", response_format={"type": "json_object"}).guided_regex == "a"


@pytest.mark.parametrize("value,seconds", [("30", 30.0), ("0.5", 0.5), (" 2 ", 2.0), ("1e1", 10.0)])
def test_inference_timeout_string(value: str, seconds: float) -> None:
    assert request(inference_timeout=value).inference_timeout == seconds


def test_inference_timeout_number_is_kept() -> None:
    assert request(inference_timeout=12.5).inference_timeout == 12.5


@pytest.mark.parametrize("value", ["abc", "", "0", "-1", "nan"])
def test_inference_timeout_bad_strings(value: str) -> None:
    refused("inference_timeout", inference_timeout=value)


@pytest.mark.parametrize("header", sorted(FORBIDDEN_HEADERS) + ["Authorization", "X-API-KEY", "Api-Key"])
def test_forbidden_extra_headers(header: str) -> None:
    err = refused("inference_extra_headers", inference_extra_headers={"x-ok": "1", header: "v"})
    assert err.message == f"'inference_extra_headers' may not set '{header}'"


@pytest.mark.parametrize(
    "headers",
    [{"x-a": "1\r\nx-b: 2"}, {"x-a": "line\nbreak"}, {"x a": "1"}, {"x-a:": "1"}, {"": "1"}, {"x-a": "\u20ac"}],
)
def test_extra_headers_that_cannot_go_on_the_wire(headers: dict[str, str]) -> None:
    err = refused("inference_extra_headers", inference_extra_headers=headers)
    assert "invalid header" in err.message


def test_allowed_extra_headers() -> None:
    req = request(inference_extra_headers={"x-selected-account-id": "a", "openai-organization": "o"})
    assert req.inference_extra_headers == {"x-selected-account-id": "a", "openai-organization": "o"}


@pytest.mark.parametrize("key", ["model", "prompt", "stream"])
def test_extra_params_may_not_replace_the_gateway_fields(key: str) -> None:
    refused("inference_extra_params", inference_extra_params={key: "x"})


def test_forbidden_header_list() -> None:
    assert {"authorization", "api-key", "x-api-key", "host", "content-length", "cookie"} <= FORBIDDEN_HEADERS
