"""Every request-validation error, on every dialect's route, over real HTTP.

Each case is sent with a model routed to the loopback OpenAI upstream, which then must have received
nothing: validation happens before any upstream I/O.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.errors import ALL_ROUTES, assert_error
from tests.helpers.upstreams import Upstream

MODEL = "openai/davinci-002"


class Case:
    def __init__(
        self,
        id: str,
        body: dict[str, Any],
        param: str | None,
        code: str,
        message: str,
        loc: list[str | int] | None = None,
    ) -> None:
        self.id = id
        self.body = body
        self.param = param
        self.code = code
        self.message = message
        self.loc = loc


def _req(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Say this is a test", **fields}


CASES = [
    Case(
        "unknown-field",
        _req(foo=1),
        "foo",
        "unknown_parameter",
        "Unrecognized request argument supplied: foo",
    ),
    # Chat's prefill fields, held on the shared request under names with a leading space: no completion's.
    *(
        Case(
            f"chat-only-{name}",
            _req(**{f" {name}": value}),
            f" {name}",
            "unknown_parameter",
            f"Unrecognized request argument supplied:  {name}",
        )
        for name, value in (("continue_final_message", True), ("add_generation_prompt", False))
    ),
    # A name 100,000 characters long: named by its first 64.
    Case(
        "unknown-field-long-name",
        _req(**{"f" * 100_000: 1}),
        "f" * 64 + "...",
        "unknown_parameter",
        "Unrecognized request argument supplied: " + "f" * 64 + "...",
        loc=["f" * 64 + "..."],
    ),
    Case(
        "unknown-nested-field",
        _req(stream=True, stream_options={"include_usage": True, "extra": 1}),
        "stream_options.extra",
        "unknown_parameter",
        "Unrecognized request argument supplied: stream_options.extra",
        loc=["stream_options", "extra"],
    ),
    Case(
        "missing-model",
        {"prompt": "x"},
        "model",
        "missing_required_parameter",
        "Missing required parameter: 'model'",
    ),
    Case(
        "missing-prompt",
        {"model": MODEL},
        "prompt",
        "missing_required_parameter",
        "Missing required parameter: 'prompt'",
    ),
    Case(
        "wrong-type-temperature",
        _req(temperature="hot"),
        "temperature",
        "invalid_value",
        "Invalid value for 'temperature': Expected `float | null`, got `str`",
    ),
    Case(
        "wrong-type-max-tokens",
        _req(max_tokens="16"),
        "max_tokens",
        "invalid_value",
        "Invalid value for 'max_tokens': Expected `int | null`, got `str`",
    ),
    Case(
        "wrong-type-stream",
        _req(stream="yes"),
        "stream",
        "invalid_value",
        "Invalid value for 'stream': Expected `bool | null`, got `str`",
    ),
    Case(
        "wrong-type-prompt",
        _req(prompt={"text": "x"}),
        "prompt",
        "invalid_value",
        "Invalid value for 'prompt': Expected `str | array`, got `object`",
    ),
    Case(
        "temperature-above-2",
        _req(temperature=2.01),
        "temperature",
        "invalid_value",
        "Invalid value for 'temperature': Expected `float` <= 2.0",
    ),
    Case(
        "temperature-below-0",
        _req(temperature=-0.5),
        "temperature",
        "invalid_value",
        "Invalid value for 'temperature': Expected `float` >= 0.0",
    ),
    Case(
        "frequency-penalty-above-2",
        _req(frequency_penalty=2.5),
        "frequency_penalty",
        "invalid_value",
        "Invalid value for 'frequency_penalty': Expected `float` <= 2.0",
    ),
    Case(
        "presence-penalty-below-minus-2",
        _req(presence_penalty=-3),
        "presence_penalty",
        "invalid_value",
        "Invalid value for 'presence_penalty': Expected `float` >= -2.0",
    ),
    Case(
        "top-p-above-1",
        _req(top_p=1.5),
        "top_p",
        "invalid_value",
        "Invalid value for 'top_p': Expected `float` <= 1.0",
    ),
    Case("n-zero", _req(n=0), "n", "invalid_value", "Invalid value for 'n': Expected `int` >= 1"),
    Case(
        "too-many-choices",
        _req(prompt=["a", "b"], n=65),
        "n",
        "invalid_value",
        "at most 128 choices per request (prompts x n)",
    ),
    Case(
        "sixty-five-stop-sequences",
        _req(stop=["a"] * 65),
        "stop",
        "invalid_value",
        "Invalid value for 'stop': Expected `array` of length <= 64",
    ),
    Case(
        "sixty-five-stop-sequences-sgp-name",
        _req(stop_sequences=["a"] * 65),
        "stop_sequences",
        "invalid_value",
        "Invalid value for 'stop_sequences': Expected `array` of length <= 64",
    ),
    Case(
        "logprobs-int-above-100",
        _req(logprobs=101),
        "logprobs",
        "invalid_value",
        "Invalid value for 'logprobs': Expected `int` <= 100",
    ),
    Case(
        "logprobs-int-negative",
        _req(logprobs=-1),
        "logprobs",
        "invalid_value",
        "Invalid value for 'logprobs': Expected `int` >= 0",
    ),
    Case(
        "top-logprobs-above-100",
        _req(logprobs=True, top_logprobs=101),
        "top_logprobs",
        "invalid_value",
        "Invalid value for 'top_logprobs': Expected `int` <= 100",
    ),
    Case(
        "top-logprobs-without-logprobs",
        _req(top_logprobs=3),
        "top_logprobs",
        "invalid_value",
        "'top_logprobs' requires 'logprobs' to be true",
    ),
    Case(
        "top-logprobs-with-logprobs-false",
        _req(logprobs=False, top_logprobs=3),
        "top_logprobs",
        "invalid_value",
        "'top_logprobs' requires 'logprobs' to be true",
    ),
    Case(
        "top-logprobs-disagrees-with-int-logprobs",
        _req(logprobs=2, top_logprobs=3),
        "top_logprobs",
        "invalid_value",
        "'top_logprobs' disagrees with the integer 'logprobs'",
    ),
    Case(
        "max-new-tokens-disagrees",
        _req(max_tokens=5, max_new_tokens=6),
        "max_new_tokens",
        "invalid_value",
        "'max_new_tokens' (6) disagrees with the token limit already given (5)",
    ),
    Case(
        "max-completion-tokens-disagrees",
        _req(max_new_tokens=7, max_completion_tokens=8),
        "max_completion_tokens",
        "invalid_value",
        "'max_completion_tokens' (8) disagrees with the token limit already given (7)",
    ),
    Case(
        "stop-sequences-disagree",
        _req(stop="\n", stop_sequences=["END"]),
        "stop_sequences",
        "invalid_value",
        "'stop_sequences' disagrees with 'stop'",
    ),
    Case(
        "stream-options-without-stream",
        _req(stream_options={"include_usage": True}),
        "stream_options",
        "invalid_value",
        "'stream_options' is only allowed when 'stream' is true",
    ),
    Case(
        "best-of-below-n",
        _req(n=3, best_of=2),
        "best_of",
        "invalid_value",
        "'best_of' must be greater than or equal to 'n'",
    ),
    Case(
        "best-of-with-stream",
        _req(best_of=2, stream=True),
        "best_of",
        "invalid_value",
        "'best_of' cannot be used with 'stream'",
    ),
    Case(
        "empty-prompt-list",
        _req(prompt=[]),
        "prompt",
        "invalid_value",
        "'prompt' must not be an empty list",
    ),
    Case(
        "mixed-prompt-list",
        _req(prompt=["a", 1]),
        "prompt",
        "invalid_value",
        "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists",
    ),
    Case(
        "negative-token-id",
        _req(prompt=[1, -2]),
        "prompt",
        "invalid_value",
        "'prompt' token ids must be non-negative",
    ),
    Case(
        "two-guided-constraints",
        _req(guided_json={"type": "object"}, guided_regex="[a-z]+"),
        "guided_regex",
        "invalid_value",
        "only one structured-output constraint may be set, got guided_json, guided_regex",
    ),
    Case(
        "inference-timeout-not-a-number",
        _req(inference_timeout="soon"),
        "inference_timeout",
        "invalid_value",
        "'inference_timeout' must be a number of seconds",
    ),
    Case(
        "inference-extra-headers-credentials",
        _req(inference_extra_headers={"Authorization": "Bearer stolen"}),
        "inference_extra_headers",
        "invalid_value",
        "'inference_extra_headers' may not set 'Authorization'",
    ),
    Case(
        "inference-extra-headers-injection",
        _req(inference_extra_headers={"x-trace": "1\r\nx-injected: yes"}),
        "inference_extra_headers",
        "invalid_value",
        "'inference_extra_headers' has an invalid header 'x-trace': names are HTTP tokens and values one line of "
        "latin-1 text",
    ),
    Case(
        "inference-extra-params-model",
        _req(inference_extra_params={"model": "other"}),
        "inference_extra_params",
        "invalid_value",
        "'inference_extra_params' may not set 'model'",
    ),
]


@pytest.mark.parametrize("route", ALL_ROUTES)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_field_error(api: httpx.Client, upstream: Upstream, route: str, case: Case) -> None:
    resp = api.post(route, json=case.body)
    assert_error(
        resp,
        route,
        status=400,
        type="invalid_request_error",
        param=case.param,
        code=case.code,
        message=case.message,
        loc=case.loc,
    )
    assert upstream.received == []


INVALID_JSON = "We could not parse the JSON body of your request: it must be a JSON object"


@pytest.mark.parametrize("route", ALL_ROUTES)
@pytest.mark.parametrize(
    ("raw", "code", "message"),
    [
        pytest.param(b'{"model": "openai/davinci-002", "prompt": ', "invalid_json", INVALID_JSON, id="truncated-json"),
        pytest.param(b"model=openai/davinci-002", "invalid_json", INVALID_JSON, id="form-encoded"),
        pytest.param(b"", "invalid_json", INVALID_JSON, id="empty-body"),
        pytest.param(
            b'["openai/davinci-002", "hi"]',
            "invalid_value",
            "Invalid value for 'request body': Expected `object`, got `array`",
            id="array-body",
        ),
        pytest.param(
            b'"hi"', "invalid_value", "Invalid value for 'request body': Expected `object`, got `str`", id="string-body"
        ),
    ],
)
def test_body_error(api: httpx.Client, upstream: Upstream, route: str, raw: bytes, code: str, message: str) -> None:
    # OpenAI answers its 400 envelope; SGP and PAIS answer as FastAPI does: 422 located at the body.
    resp = api.post(route, content=raw, headers={"content-type": "application/json"})
    assert_error(
        resp,
        route,
        status=400,
        type="invalid_request_error",
        param=None,
        code=code,
        message=message,
        field_error=True,
        loc=[],
    )
    assert upstream.received == []


def _documented_codes() -> dict[str, str]:
    """docs/dialects.md's error-code table: each code's `when`, as client authors read it."""
    lines = (Path(__file__).resolve().parents[2] / "docs" / "dialects.md").read_text().splitlines()
    start = lines.index("| code | when |") + 2
    rows: dict[str, str] = {}
    for line in lines[start:]:
        if not line.startswith("| `"):
            break
        code, when = line[3:].split("` | ", 1)
        rows[code] = when
    return rows


@pytest.mark.parametrize("route", ALL_ROUTES)
@pytest.mark.parametrize(
    ("raw", "said"),
    [
        pytest.param(b'{"model": ', "not JSON", id="not-json"),
        pytest.param(b"[1]", "not an object", id="array"),
        pytest.param(b'"x"', "not an object", id="string"),
        pytest.param(b"null", "not an object", id="null"),
    ],
)
def test_a_bad_body_gets_the_code_documented_for_it(api: httpx.Client, route: str, raw: bytes, said: str) -> None:
    resp = api.post(route, content=raw, headers={"content-type": "application/json"})
    body = resp.json()
    code = body["error"]["code"] if "error" in body else body["detail"][0]["type"]
    assert [c for c, when in _documented_codes().items() if said in when] == [code]


@pytest.mark.parametrize("route", ALL_ROUTES)
def test_aliases_that_agree_are_accepted(api: httpx.Client, route: str) -> None:
    # The same limit under three names and the same stop under two names is not a conflict.
    body = {
        "model": "demo/long",
        "prompt": "count",
        "max_tokens": 3,
        "max_new_tokens": 3,
        "max_completion_tokens": 3,
        "stop": ["zzz"],
        "stop_sequences": ["zzz"],
    }
    resp = api.post(route, json=body)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert resp.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize(
    ("path", "method", "status", "message", "type", "code"),
    [
        ("/v2/completions", "POST", 404, "Not Found", "not_found_error", "not_found"),
        ("/v1/completions", "GET", 405, "Method Not Allowed", "invalid_request_error", "method_not_allowed"),
    ],
)
def test_unknown_path_and_method(
    api: httpx.Client, path: str, method: str, status: int, message: str, type: str, code: str
) -> None:
    resp = api.request(method, path)
    assert (resp.status_code, resp.json()) == (
        status,
        {"error": {"message": message, "type": type, "param": None, "code": code}},
    )


@pytest.mark.parametrize("route", ALL_ROUTES)
def test_body_over_8_mib_is_413(api: httpx.Client, upstream: Upstream, route: str) -> None:
    body = json.dumps({"model": MODEL, "prompt": "x" * (8 * 1024 * 1024)}).encode()
    resp = api.post(route, content=body, headers={"content-type": "application/json"})
    assert_error(
        resp,
        route,
        status=413,
        type="invalid_request_error",
        message="The request body is larger than 8388608 bytes",
        code="request_too_large",
    )
    assert upstream.received == []
