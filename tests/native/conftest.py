"""Servers shared by the native adapters' end-to-end tests.

Each test module declares `CONFIG`, a gateway config with `{url}` (the loopback upstream) and, when the
provider takes a key, `{key}` filled from the module's `UPSTREAM_KEY`; `GATEWAY_ENV`, if set, is the
gateway's environment. One upstream and one gateway serve a module; the upstream's recording and the
gateway's target health are reset per test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.harness import GatewayThread, Upstream, openai_client


@pytest.fixture(scope="module")
def upstream_server() -> Iterator[Upstream]:
    server = Upstream()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def upstream(upstream_server: Upstream) -> Iterator[Upstream]:
    upstream_server.reset()
    yield upstream_server
    upstream_server.reset()


@pytest.fixture(scope="module")
def gateway(
    request: pytest.FixtureRequest, upstream_server: Upstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayThread]:
    module = request.module
    path: Path = tmp_path_factory.mktemp(module.__name__.rsplit(".", 1)[-1]) / "config.yaml"
    path.write_text(module.CONFIG.format(key=getattr(module, "UPSTREAM_KEY", ""), url=upstream_server.url))
    gw = GatewayThread(path, getattr(module, "GATEWAY_ENV", {}))
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture
def oai(gateway: GatewayThread) -> Iterator[openai.OpenAI]:
    gateway.pipeline.health.reset()
    with openai_client(gateway.url + "/v1", "unused-no-keys-configured") as client:
        yield client


@pytest.fixture
def api(gateway: GatewayThread) -> Iterator[httpx.Client]:
    gateway.pipeline.health.reset()
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as client:
        yield client
