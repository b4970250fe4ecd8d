"""The reasoning tests' gateway: one per module, in front of the loopback upstream of upstreams.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.clients.reasoning.upstreams import CONFIG, KEY, handler
from tests.helpers.clients import client as keyed_client
from tests.helpers.clients import openai_client
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        server.handler = handler
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    folder: Path = tmp_path_factory.mktemp("reasoning")
    with serve_config(folder, CONFIG.format(u=upstream.url), {"REASON_KEY": KEY}) as gw:
        yield gw


@pytest.fixture
def received(upstream: Upstream) -> Iterator[list[Received]]:
    upstream.received = []
    yield upstream.received


@pytest.fixture(scope="module")
def client(gateway: GatewayThread) -> Iterator[openai.OpenAI]:
    sdk = openai_client(gateway.url + "/v1", KEY)
    yield sdk
    sdk.close()


@pytest.fixture(scope="module")
def api(gateway: GatewayThread) -> Iterator[httpx.Client]:
    with keyed_client(gateway.url, KEY) as http:
        yield http
