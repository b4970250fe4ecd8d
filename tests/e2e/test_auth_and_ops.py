"""Keys, model resolution errors, GET /v1/models, /health and /ready (with a real redis-server)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.helpers.errors import ALL_ROUTES, FASTAPI_ROUTES, assert_error
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread, free_port
from tests.helpers.upstreams import Upstream

from .conftest import FULL_KEY, LIMITED_KEY

ECHO = {"model": "demo/echo", "prompt": "hello there"}
MISSING_KEY = "Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"


@pytest.mark.parametrize("route", ALL_ROUTES)
@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({"authorization": f"Bearer {FULL_KEY}"}, id="bearer"),
        pytest.param({"authorization": f"bearer   {FULL_KEY}"}, id="bearer-lowercase-padded"),
        pytest.param({"x-api-key": FULL_KEY}, id="x-api-key"),
        pytest.param({"x-api-key": LIMITED_KEY}, id="limited-key-allowed-model"),
    ],
)
def test_key_accepted_on_every_route(bare: httpx.Client, route: str, headers: dict[str, str]) -> None:
    resp = bare.post(route, json=ECHO, headers=headers)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["text"] == "hello there"


@pytest.mark.parametrize("route", ALL_ROUTES)
@pytest.mark.parametrize(
    ("headers", "code", "message"),
    [
        pytest.param({}, "missing_api_key", MISSING_KEY, id="no-key"),
        pytest.param({"authorization": "Basic dXNlcjpwYXNz"}, "missing_api_key", MISSING_KEY, id="basic-auth"),
        pytest.param({"authorization": "Bearer"}, "missing_api_key", MISSING_KEY, id="empty-bearer"),
        pytest.param(
            {"authorization": f"Bearer {FULL_KEY}x"}, "invalid_api_key", "Incorrect API key provided", id="bad-bearer"
        ),
        pytest.param({"x-api-key": "nope"}, "invalid_api_key", "Incorrect API key provided", id="bad-x-api-key"),
        pytest.param(
            # The disabled key's ${VAR} is unset: it resolves to nothing and must match nothing.
            {"x-api-key": "${E2E_UNSET_GHOST_KEY}"},
            "invalid_api_key",
            "Incorrect API key provided",
            id="disabled-key-reference",
        ),
    ],
)
def test_bad_key_is_401(
    bare: httpx.Client, upstream: Upstream, route: str, headers: dict[str, str], code: str, message: str
) -> None:
    # Even a body that would fail validation is refused for the key first.
    resp = bare.post(route, content=b"{not json", headers=headers)
    assert_error(resp, route, status=401, type="authentication_error", code=code, message=message)
    assert upstream.received == []


@pytest.mark.parametrize("route", ALL_ROUTES)
@pytest.mark.parametrize("model", ["openai/davinci-002", "davinci", "demo-other/echo"])
def test_limited_key_is_403_on_other_models(bare: httpx.Client, upstream: Upstream, route: str, model: str) -> None:
    resp = bare.post(route, json={"model": model, "prompt": "x"}, headers={"x-api-key": LIMITED_KEY})
    assert_error(
        resp,
        route,
        status=403,
        type="permission_error",
        param="model",
        code="model_not_allowed",
        message=f"Key 'limited' may not use model '{model}'",
    )
    assert upstream.received == []


@pytest.mark.parametrize("route", ALL_ROUTES)
def test_limited_key_may_use_its_alias(bare: httpx.Client, route: str) -> None:
    resp = bare.post(route, json={"model": "fast", "prompt": "x"}, headers={"authorization": f"Bearer {LIMITED_KEY}"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == "fast"
    assert resp.headers["x-gateway-provider"] == "demo"


@pytest.mark.parametrize("route", ALL_ROUTES)
@pytest.mark.parametrize("model", ["nope/some-model", "demo", "openai", "gpt-3.5-turbo-instruct", "openai/"])
def test_unknown_model_or_vendor_is_404(api: httpx.Client, upstream: Upstream, route: str, model: str) -> None:
    resp = api.post(route, json={"model": model, "prompt": "x"})
    message = f"The model '{model}' does not exist"
    assert_error(
        resp,
        route,
        status=404,
        type="invalid_request_error",
        param="model",
        code="model_not_found",
        message=message,
        field_error=False,
        detail=f"Unknown model endpoint requested. {message}",
    )
    assert upstream.received == []


@pytest.mark.parametrize("route", ALL_ROUTES)
def test_provider_with_unset_key_variable_is_not_ready(api: httpx.Client, upstream: Upstream, route: str) -> None:
    resp = api.post(route, json={"model": "pais-nokey/llama-3-8b", "prompt": "x"})
    message = "Provider 'pais-nokey' is unavailable: environment variable E2E_UNSET_PAIS_KEY is not set"
    assert_error(
        resp,
        route,
        status=400,
        type="invalid_request_error",
        param="model",
        code="provider_unavailable",
        message=message,
        field_error=False,
        detail=f"Invalid model endpoint specified or model endpoint not ready. {message}",
    )
    assert upstream.received == []


def _ids(resp: httpx.Response) -> list[tuple[str, str]]:
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "list"
    for card in body["data"]:
        assert card["object"] == "model"
        assert card["created"] == 0
    return [(card["id"], card["owned_by"]) for card in body["data"]]


def test_models_lists_aliases_targets_and_advertised_models(api: httpx.Client) -> None:
    assert _ids(api.get("/v1/models")) == [
        ("fast", "gateway"),
        ("davinci", "gateway"),
        ("demo/text", "demo"),
        ("openai/davinci-002", "openai"),
        ("demo/echo", "demo"),
    ]


@pytest.mark.parametrize("header", ["authorization", "x-api-key"])
def test_models_filtered_by_key_patterns(bare: httpx.Client, header: str) -> None:
    value = f"Bearer {LIMITED_KEY}" if header == "authorization" else LIMITED_KEY
    assert _ids(bare.get("/v1/models", headers={header: value})) == [
        ("fast", "gateway"),
        ("demo/text", "demo"),
        ("demo/echo", "demo"),
    ]


def test_models_requires_a_key(bare: httpx.Client) -> None:
    assert_error(
        bare.get("/v1/models"),
        "/v1/completions",
        status=401,
        type="authentication_error",
        code="missing_api_key",
        message=MISSING_KEY,
    )


def test_health_needs_no_key(bare: httpx.Client) -> None:
    resp = bare.get("/health")
    assert (resp.status_code, resp.json()) == (200, {"status": "ok"})


def test_ready_without_redis(bare: httpx.Client) -> None:
    resp = bare.get("/ready")
    assert (resp.status_code, resp.json()) == (200, {"status": "ready", "redis": "disabled"})


MINIMAL = """
redis: {{url: "{redis}"}}
providers:
  demo: {{kind: fake}}
"""


def test_ready_with_real_redis_then_redis_gone(redis: RedisServer, tmp_path: Path) -> None:
    path = tmp_path / "redis.yaml"
    path.write_text(MINIMAL.format(redis=redis.url))
    with GatewayThread(path, {}) as gw, httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as client:
        resp = client.get("/ready")
        assert (resp.status_code, resp.json()) == (200, {"status": "ready", "redis": "ok"})
        # Completions do not depend on Redis being reachable.
        assert client.post("/v1/completions", json=ECHO).status_code == 200
        redis.stop()
        resp = client.get("/ready")
        assert (resp.status_code, resp.json()) == (503, {"status": "degraded", "redis": "unreachable"})


def test_ready_503_when_redis_port_is_closed(tmp_path: Path) -> None:
    path = tmp_path / "closed.yaml"
    path.write_text(MINIMAL.format(redis=f"redis://127.0.0.1:{free_port()}/0"))
    with GatewayThread(path, {}) as gw, httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as client:
        resp = client.get("/ready")
        assert (resp.status_code, resp.json()) == (503, {"status": "degraded", "redis": "unreachable"})
        health = client.get("/health")
        assert (health.status_code, health.json()) == (200, {"status": "ok"})


@pytest.mark.parametrize("route", ALL_ROUTES)
def test_gateway_without_keys_is_open(tmp_path: Path, route: str) -> None:
    path = tmp_path / "open.yaml"
    path.write_text(MINIMAL.format(redis=""))
    with GatewayThread(path, {}) as gw, httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as client:
        resp = client.post(route, json=ECHO)
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["text"] == "hello there"
        # A key nobody configured is not an error on an open gateway either.
        assert client.post(route, json=ECHO, headers={"x-api-key": "anything"}).status_code == 200
        assert _ids(client.get("/v1/models")) == []


def test_only_disabled_keys_keep_the_gateway_closed(tmp_path: Path) -> None:
    path = tmp_path / "closed-keys.yaml"
    path.write_text('keys: [{name: ops, key: "${E2E_UNSET_OPS_KEY}"}]\nproviders: {demo: {kind: fake}}\n')
    with GatewayThread(path, {}) as gw, httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as client:
        for route in FASTAPI_ROUTES:
            resp = client.post(route, json=ECHO)
            assert (resp.status_code, resp.json()) == (401, {"detail": MISSING_KEY})
        resp = client.post("/v1/completions", json=ECHO, headers={"authorization": "Bearer"})
        assert resp.status_code == 401
