"""Upstream failures as the client sees them: status mapping, Retry-After, timeouts, bad bodies."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import openai
import pytest

from tests.helpers.errors import ALL_ROUTES, SGP_ROUTE, assert_error
from tests.helpers.recordings import fixture_bytes, fixture_json
from tests.helpers.upstreams import Upstream, hang, reply

OPENAI_400 = "openai/error_400_model_not_found.json"
TGI_422 = "tgi/error_422_validation.json"


def openai_error_body(message: str, type: str, code: str | None, param: str | None = None) -> bytes:
    """An error body in the recorded OpenAI envelope's shape (openai/error_400_model_not_found.json).

    Only that one OpenAI error was recorded; other statuses reuse its exact structure with their own
    message, type and code.
    """
    body: dict[str, Any] = fixture_json(OPENAI_400)
    body["error"].update(message=message, type=type, code=code, param=param)
    return json.dumps(body).encode()


RATE_LIMITED = openai_error_body(
    "Rate limit reached for davinci-002 on requests per min (RPM): Limit 3, Used 3, Requested 1.",
    "requests",
    "rate_limit_exceeded",
)


@pytest.mark.parametrize("route", ALL_ROUTES)
@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param({"retry-after": "20"}, "20", id="seconds"),
        pytest.param({"retry-after-ms": "1500", "retry-after": "9"}, "2", id="milliseconds-win-rounded-up"),
    ],
)
def test_upstream_429_keeps_status_and_retry_after(
    api: httpx.Client, upstream: Upstream, route: str, headers: dict[str, str], expected: str
) -> None:
    upstream.handler = reply(RATE_LIMITED, status=429, headers=headers)
    resp = api.post(route, json={"model": "openai/davinci-002", "prompt": "x"})
    assert resp.headers["retry-after"] == expected
    assert_error(
        resp,
        route,
        status=429,
        type="rate_limit_error",
        code="rate_limit_exceeded",
        message="openai error (429): Rate limit reached for davinci-002 on requests per min (RPM): "
        "Limit 3, Used 3, Requested 1.",
    )


def test_upstream_429_through_the_sdk(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.handler = reply(RATE_LIMITED, status=429, headers={"retry-after": "3"})
    with pytest.raises(openai.RateLimitError) as info:
        oai.completions.create(model="openai/davinci-002", prompt="x")
    assert info.value.status_code == 429
    assert info.value.response.headers["retry-after"] == "3"
    assert info.value.code == "rate_limit_exceeded"
    assert info.value.type == "rate_limit_error"
    assert len(upstream.received) == 1  # max_retries=0: the gateway itself does not retry either


@pytest.mark.parametrize("route", ALL_ROUTES)
def test_recorded_openai_400_passes_through(api: httpx.Client, upstream: Upstream, route: str) -> None:
    upstream.handler = reply(fixture_bytes(OPENAI_400), status=400)
    resp = api.post(route, json={"model": "openai/gpt-5.2-proo", "prompt": "x"})
    # The client's own request was at fault: 400 stays 400 and keeps the provider's code and param.
    assert_error(
        resp,
        route,
        status=400,
        type="invalid_request_error",
        param="model",
        code="model_not_found",
        message="openai error (400): The requested model 'gpt-5.2-proo' does not exist.",
        field_error=False,
    )


def test_recorded_tgi_422_passes_through(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes(TGI_422), status=422)
    resp = api.post("/v1/completions", json={"model": "tgi/google/flan-t5-xxl", "prompt": "x", "max_tokens": 10000})
    assert_error(
        resp,
        "/v1/completions",
        status=422,
        type="invalid_request_error",
        message="tgi error (422): Input validation error: `inputs` tokens + `max_new_tokens` must be <= 1512. "
        "Given: 2 `inputs` tokens and 10000 `max_new_tokens`",
        code="upstream_http_422",
    )


@pytest.mark.parametrize(
    ("status", "body", "client_status", "type", "code", "message"),
    [
        pytest.param(
            500,
            openai_error_body("The server had an error while processing your request.", "server_error", None),
            502,
            "upstream_error",
            "server_error",
            "openai error (500): The server had an error while processing your request.",
            id="500-is-502",
        ),
        pytest.param(
            503,
            b"upstream connect error or disconnect/reset before headers",
            502,
            "upstream_error",
            "upstream_http_503",
            "openai error (503): upstream connect error or disconnect/reset before headers",
            id="503-text-body-is-502",
        ),
        pytest.param(
            401,
            openai_error_body(
                "Incorrect API key provided: sk-upstr***e2e.", "invalid_request_error", "invalid_api_key"
            ),
            502,
            "upstream_error",
            "invalid_api_key",
            # The upstream's masked echo of the gateway's key is scrubbed (gateway/upstream/scrub.py).
            "openai error (401): Incorrect API key provided: [redacted]e2e.",
            id="provider-401-is-502-not-the-clients-fault",
        ),
        pytest.param(
            404,
            openai_error_body("Not found", "invalid_request_error", "not_found"),
            404,
            "invalid_request_error",
            "model_not_found",
            "openai error (404): Not found",
            id="404-is-model-not-found",
        ),
        pytest.param(
            504,
            b"",
            504,
            "timeout_error",
            "upstream_http_504",
            "openai error (504): no error body",
            id="504-stays-504",
        ),
    ],
)
def test_upstream_status_mapping(
    api: httpx.Client,
    upstream: Upstream,
    status: int,
    body: bytes,
    client_status: int,
    type: str,
    code: str | None,
    message: str,
) -> None:
    upstream.handler = reply(body, status=status)
    resp = api.post("/v1/completions", json={"model": "openai/davinci-002", "prompt": "x"})
    # An upstream 404 says the target does not serve the model: `param` names it, as for an unknown alias.
    param = "model" if status == 404 else None
    assert_error(resp, "/v1/completions", status=client_status, type=type, code=code, message=message, param=param)
    assert "retry-after" not in resp.headers


def test_upstream_invalid_body_is_502(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(b"<html><body>Bad Gateway</body></html>", headers={"content-type": "text/html"})
    resp = api.post("/v1/completions", json={"model": "openai/davinci-002", "prompt": "x"})
    assert_error(
        resp,
        "/v1/completions",
        status=502,
        type="upstream_error",
        message="Upstream 'openai/davinci-002' sent an invalid response body",
        code="invalid_upstream_response",
    )


@pytest.mark.parametrize("route", ALL_ROUTES)
def test_unreachable_upstream_is_502(api: httpx.Client, route: str) -> None:
    resp = api.post(route, json={"model": "openai-down/davinci-002", "prompt": "x"})
    assert_error(
        resp,
        route,
        status=502,
        type="upstream_error",
        code="upstream_connection_refused",
        message="Upstream 'openai-down/davinci-002' could not be reached: the connection was refused",
    )


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_that_never_answers_is_504(api: httpx.Client, upstream: Upstream, stream: bool) -> None:
    cancelled = threading.Event()
    upstream.handler = hang(cancelled)
    started = time.monotonic()
    resp = api.post("/v1/completions", json={"model": "openai-slow/davinci-002", "prompt": "x", "stream": stream})
    elapsed = time.monotonic() - started
    assert_error(
        resp,
        "/v1/completions",
        status=504,
        type="timeout_error",
        code="upstream_total_timeout",
        message="Upstream 'openai-slow/davinci-002' timed out (timeouts.total_ms or inference_timeout)",
    )
    assert 0.35 <= elapsed < 3, elapsed  # timeouts.total_ms / first_byte_ms is 400 for this provider
    # The gateway hung up on the upstream, it did not leave the request running.
    assert cancelled.wait(5)


def test_upstream_timeout_through_the_sdk(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.handler = hang()
    with pytest.raises(openai.InternalServerError) as info:
        oai.completions.create(model="openai-slow/davinci-002", prompt="x")
    assert info.value.status_code == 504
    assert info.value.type == "timeout_error"


@pytest.mark.parametrize("timeout", [0.3, "0.3"])
def test_inference_timeout_caps_the_deadline_on_the_sgp_route(
    api: httpx.Client, upstream: Upstream, timeout: float | str
) -> None:
    cancelled = threading.Event()
    upstream.handler = hang(cancelled)
    started = time.monotonic()
    # The provider's own deadline is 20 s; the request asks for 0.3 s.
    resp = api.post(SGP_ROUTE, json={"model": "openai/davinci-002", "prompt": "x", "inference_timeout": timeout})
    elapsed = time.monotonic() - started
    assert (resp.status_code, resp.json()) == (
        504,
        {"detail": "Upstream 'openai/davinci-002' timed out (timeouts.total_ms or inference_timeout)"},
    )
    assert 0.25 <= elapsed < 3, elapsed
    assert cancelled.wait(5)
    assert "inference_timeout" not in upstream.only().json()


def test_inference_timeout_cannot_extend_the_deadline(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = hang()
    started = time.monotonic()
    resp = api.post(SGP_ROUTE, json={"model": "openai-slow/davinci-002", "prompt": "x", "inference_timeout": 30})
    elapsed = time.monotonic() - started
    assert (resp.status_code, resp.json()) == (
        504,
        {"detail": "Upstream 'openai-slow/davinci-002' timed out (timeouts.total_ms or inference_timeout)"},
    )
    assert elapsed < 3, elapsed
