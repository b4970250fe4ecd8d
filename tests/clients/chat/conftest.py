"""The chat tests' gateway: one per module, in front of the loopback upstream of upstreams.py, with a ledger
the tests read and a provider kind that has no chat route."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from providers.openai_compat import OpenAICompatible
from providers.registry import register, unregister
from tests.clients.chat.upstreams import CONFIG, KEY, handler
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
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chat-ledger") / "ledger.db"


class NoChatAdapter(OpenAICompatible):
    """A kind with a completion route only: the gateway speaks no chat route for it."""

    kind = "nochat"
    needs_api_key = False


@pytest.fixture(scope="module")
def nochat() -> Iterator[None]:
    register(NoChatAdapter)
    yield
    unregister("nochat")


@pytest.fixture(scope="module")
def gateway(
    upstream: Upstream, db: Path, tmp_path_factory: pytest.TempPathFactory, nochat: None
) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("chat"), CONFIG.format(u=upstream.url, db=db), {"CHAT_KEY": KEY}) as gw:
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
