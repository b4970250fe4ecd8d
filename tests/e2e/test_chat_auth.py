"""Keys, model patterns, aliases and model resolution errors on the chat routes, over real sockets: each
chat route answers exactly what the completion route of its dialect answers (OpenAI's envelope on
`/v1/chat/completions` and Fireworks' route, FastAPI's shape on SGP's and PAIS's), and nothing reaches an
upstream. So does a body over the limit, which is refused before the endpoint runs.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.helpers.errors import PAIS_ROUTE, SGP_ROUTE, assert_error
from tests.helpers.upstreams import Upstream

from .conftest import FULL_KEY, LIMITED_KEY

# Each chat route, with the completion route of the same dialect whose error shape it speaks.
CHAT_ROUTES = {
    "/v1/chat/completions": "/v1/completions",
    "/inference/v1/chat/completions": "/inference/v1/completions",
    "/v4/beta/chat/completions": SGP_ROUTE,
    "/api/v1/compatibility/openai/v1/chat/completions": PAIS_ROUTE,
}
MESSAGES = [{"role": "user", "content": "hello there"}]


def _body(model: str) -> dict[str, Any]:
    return {"model": model, "messages": MESSAGES}


@pytest.mark.parametrize("route", CHAT_ROUTES)
@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({"authorization": f"Bearer {FULL_KEY}"}, id="bearer"),
        pytest.param({"x-api-key": FULL_KEY}, id="x-api-key"),
        pytest.param({"x-api-key": LIMITED_KEY}, id="limited-key-allowed-model"),
    ],
)
def test_a_key_is_accepted_on_every_chat_route(bare: httpx.Client, route: str, headers: dict[str, str]) -> None:
    resp = bare.post(route, json=_body("demo/echo"), headers=headers)
    assert resp.status_code == 200, resp.text
    assert resp.json()["object"] == "chat.completion"


@pytest.mark.parametrize("route", CHAT_ROUTES)
def test_a_bad_key_is_the_dialects_401(bare: httpx.Client, upstream: Upstream, route: str) -> None:
    resp = bare.post(route, content=b"{not json", headers={"authorization": f"Bearer {FULL_KEY}x"})
    assert_error(
        resp,
        CHAT_ROUTES[route],
        status=401,
        type="authentication_error",
        code="invalid_api_key",
        message="Incorrect API key provided",
    )
    assert upstream.received == []


@pytest.mark.parametrize("route", CHAT_ROUTES)
@pytest.mark.parametrize("model", ["openai/gpt-4o-mini", "davinci", "demo-other/echo"])
def test_a_keys_model_patterns_hold_on_chat(bare: httpx.Client, upstream: Upstream, route: str, model: str) -> None:
    resp = bare.post(route, json=_body(model), headers={"x-api-key": LIMITED_KEY})
    assert_error(
        resp,
        CHAT_ROUTES[route],
        status=403,
        type="permission_error",
        param="model",
        code="model_not_allowed",
        message=f"Key 'limited' may not use model '{model}'",
    )
    assert upstream.received == []


@pytest.mark.parametrize("route", CHAT_ROUTES)
def test_a_limited_key_may_chat_with_its_alias(bare: httpx.Client, route: str) -> None:
    resp = bare.post(route, json=_body("fast"), headers={"authorization": f"Bearer {LIMITED_KEY}"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == "fast"
    assert resp.headers["x-gateway-provider"] == "demo"


def test_the_model_scoped_route_checks_the_key_against_its_model(bare: httpx.Client, upstream: Upstream) -> None:
    allowed = bare.post(
        "/m/demo/echo/v1/chat/completions", json={"messages": MESSAGES}, headers={"x-api-key": LIMITED_KEY}
    )
    assert allowed.status_code == 200 and allowed.json()["model"] == "demo/echo", allowed.text
    refused = bare.post(
        "/m/openai/davinci-002/v1/chat/completions", json={"messages": MESSAGES}, headers={"x-api-key": LIMITED_KEY}
    )
    assert_error(
        refused,
        "/v1/completions",
        status=403,
        type="permission_error",
        param="model",
        code="model_not_allowed",
        message="Key 'limited' may not use model 'openai/davinci-002'",
    )
    assert upstream.received == []


@pytest.mark.parametrize("route", CHAT_ROUTES)
@pytest.mark.parametrize("model", ["nope/some-model", "demo", "openai/"])
def test_an_unknown_model_or_vendor_is_the_dialects_404(
    api: httpx.Client, upstream: Upstream, route: str, model: str
) -> None:
    resp = api.post(route, json=_body(model))
    message = f"The model '{model}' does not exist"
    assert_error(
        resp,
        CHAT_ROUTES[route],
        status=404,
        type="invalid_request_error",
        param="model",
        code="model_not_found",
        message=message,
        field_error=False,
        detail=f"Unknown model endpoint requested. {message}",
    )
    assert upstream.received == []


@pytest.mark.parametrize("route", CHAT_ROUTES)
def test_a_provider_with_an_unset_key_is_the_dialects_400(api: httpx.Client, upstream: Upstream, route: str) -> None:
    resp = api.post(route, json=_body("pais-nokey/llama-3-8b"))
    message = "Provider 'pais-nokey' is unavailable: environment variable E2E_UNSET_PAIS_KEY is not set"
    assert_error(
        resp,
        CHAT_ROUTES[route],
        status=400,
        type="invalid_request_error",
        param="model",
        code="provider_unavailable",
        message=message,
        field_error=False,
        detail=f"Invalid model endpoint specified or model endpoint not ready. {message}",
    )
    assert upstream.received == []


@pytest.mark.parametrize("route", CHAT_ROUTES)
def test_a_body_over_the_limit_is_the_dialects_413(api: httpx.Client, upstream: Upstream, route: str) -> None:
    body = {"model": "demo/echo", "messages": [{"role": "user", "content": "x" * (8 * 1024 * 1024)}]}
    resp = api.post(route, json=body)
    assert_error(
        resp,
        CHAT_ROUTES[route],
        status=413,
        type="invalid_request_error",
        message="The request body is larger than 8388608 bytes",
        code="request_too_large",
    )
    assert upstream.received == []
