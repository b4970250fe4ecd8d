"""Servers shared by the native adapters' end-to-end tests.

Each test module declares `CONFIG`, a gateway config with `{url}` (the loopback upstream) and, when the
provider takes a key, `{key}` filled from the module's `UPSTREAM_KEY`; `GATEWAY_ENV`, if set, is the
gateway's environment. One upstream (`upstream_server`, tests/conftest.py) and one gateway serve a
module; the upstream's recording and the gateway's target health are reset per test.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.helpers.clients import openai_client
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Upstream


@pytest.fixture(scope="module")
def gateway(
    request: pytest.FixtureRequest, upstream_server: Upstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayThread]:
    module = request.module
    with serve_config(
        tmp_path_factory.mktemp(module.__name__.rsplit(".", 1)[-1]),
        module.CONFIG.format(key=getattr(module, "UPSTREAM_KEY", ""), url=upstream_server.url),
        getattr(module, "GATEWAY_ENV", {}),
    ) as gw:
        yield gw


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
