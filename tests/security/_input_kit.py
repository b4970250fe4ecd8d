"""A gateway and a loopback upstream for the client-input regression tests (tests/security/test_input_*).

The gateway is `create_app` served by uvicorn on a real socket (tests/e2e/harness.py); every upstream
provider points at one aiohttp server on 127.0.0.1 that records what it received, raw request target
included, so a test can prove that a refused request never left the gateway.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.e2e.errors import ALL_ROUTES, OPENAI_ROUTES
from tests.e2e.harness import GatewayThread, Received, Upstream, fixture_bytes

FULL_KEY = "gk-sec-input-full"
LIMITED_KEY = "gk-sec-input-limited"
SGP_ACCOUNT = "acct-pinned-by-operator"

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
unsupported_params: drop
retries: {{attempts: 1}}
timeouts: {{connect_ms: 2000, first_byte_ms: 5000, total_ms: 8000}}
caps: {{request_body_bytes: 65536, json_depth: 16}}
keys:
  - {{name: full, key: {full}}}
  - {{name: limited, key: {limited}, models: ["up/model*", "demo/*"]}}
providers:
  demo: {{kind: fake}}
  up:
    kind: openai
    api_key: sk-up-main
    base_url: {u}/up/v1
    deployments:
      east: {{base_url: {u}/up-east/v1, api_key: sk-up-east}}
  gem: {{kind: gemini, api_key: gem-key, base_url: {u}/gem}}
  az: {{kind: azure, api_key: az-key, base_url: {u}/az}}
  bed: {{kind: bedrock, api_key: "AKIDEXAMPLE:secret", region: us-east-1, base_url: {u}/bed}}
  sgp:
    kind: sgp
    api_key: sgp-key
    base_url: {u}/sgp
    headers: {{X-Selected-Account-Id: {account}}}
"""

COMPLETION = fixture_bytes("openai/completion_davinci002.json")


class Recorder(Upstream):
    """The loopback upstream, also keeping each request's raw target (`request.raw_path`, undecoded)."""

    def __init__(self) -> None:
        super().__init__()
        self.raw_paths: list[str] = []

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        self.raw_paths.append(request.raw_path)
        return await super()._dispatch(request)

    def reset(self) -> None:
        super().reset()
        self.raw_paths = []


async def answer(request: web.Request, received: Received) -> web.StreamResponse:
    """A recorded OpenAI completion for every request."""
    return web.Response(body=COMPLETION, content_type="application/json")


@pytest.fixture(scope="module")
def upstream() -> Iterator[Recorder]:
    up = Recorder()
    up.start()
    try:
        yield up
    finally:
        up.stop()


@pytest.fixture(scope="module")
def gateway(upstream: Recorder, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    path: Path = tmp_path_factory.mktemp("sec-input") / "config.yaml"
    path.write_text(CONFIG.format(u=upstream.url, full=FULL_KEY, limited=LIMITED_KEY, account=SGP_ACCOUNT))
    gw = GatewayThread(path, {})
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture
def up(upstream: Recorder) -> Recorder:
    upstream.reset()
    upstream.handler = answer
    return upstream


@pytest.fixture
def client(gateway: GatewayThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=10) as c:
        yield c


def post(client: httpx.Client, route: str, body: Any, key: str = FULL_KEY, **kwargs: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}", **kwargs.pop("headers", {})}
    if isinstance(body, bytes):
        return client.post(route, content=body, headers={"content-type": "application/json", **headers}, **kwargs)
    return client.post(route, json=body, headers=headers, **kwargs)


def assert_field_error(resp: httpx.Response, route: str, param: str | None, status: int = 400) -> dict[str, Any]:
    """A 4xx in the route's dialect naming `param`: OpenAI's envelope, or FastAPI's 422 with `loc`."""
    assert resp.headers["content-type"].startswith("application/json"), (resp.status_code, resp.text)
    body: dict[str, Any] = resp.json()
    if route in OPENAI_ROUTES:
        assert resp.status_code == status, body
        assert body["error"]["param"] == param, body
        assert body["error"]["type"] == "invalid_request_error", body
    else:
        assert resp.status_code == (422 if status == 400 else status), body
        if status == 400:
            (item,) = body["detail"]
            assert item["loc"][:2] == (["body", param] if param else ["body"]), body
    return body


__all__ = [
    "ALL_ROUTES",
    "FULL_KEY",
    "LIMITED_KEY",
    "SGP_ACCOUNT",
    "Recorder",
    "assert_field_error",
    "client",
    "gateway",
    "post",
    "up",
    "upstream",
]
