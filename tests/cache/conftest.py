"""The response cache over real sockets: the gateway (uvicorn in a thread) in front of the loopback vLLM
server of tests/clients (`VLLMLike`), which counts every request it gets, so a test can say exactly how
many upstream calls a cached request made. Every test uses prompts of its own, so entries one test
stored never answer another's requests."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.clients.conftest import VLLMLike
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Upstream

ALICE = "gk-cache-alice-71b3"
BOB = "gk-cache-bob-0c5e"
ADMIN = "gk-cache-admin-55aa"
MODEL = "local/facebook/opt-125m"

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
timeouts: {{connect_ms: 2000, first_byte_ms: 10000, total_ms: 20000}}
retries: {{attempts: 1}}
admin: {{key: "{admin}"}}
keys:
  - {{name: alice, key: "{alice}"}}
  - {{name: bob, key: "{bob}"}}
providers:
  local: {{kind: vllm, base_url: {u}/v1}}
models:
  - name: everyone
    targets: [{{model: {model}}}]
    cache: {{mode: always, scope: shared}}
  - name: uncached
    targets: [{{model: {model}}}]
    cache: {{mode: off}}  # unquoted: YAML reads it as false, which means off
cache: {{mode: deterministic}}
{extra}
"""


def config(upstream: Upstream, extra: str = "") -> str:
    return CONFIG.format(u=upstream.url, alice=ALICE, bob=BOB, admin=ADMIN, model=MODEL, extra=extra)


@pytest.fixture(scope="session")
def vllm() -> Iterator[tuple[VLLMLike, Upstream]]:
    like = VLLMLike()
    with Upstream() as server:
        server.handler = like.handler
        yield like, server


@pytest.fixture
def upstream(vllm: tuple[VLLMLike, Upstream]) -> Iterator[Upstream]:
    like, server = vllm
    server.reset()
    server.handler = like.handler
    yield server
    server.handler = like.handler


@pytest.fixture(scope="module")
def gateway(vllm: tuple[VLLMLike, Upstream], tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("cache"), config(vllm[1])) as gw:
        yield gw


def client(gw_url: str, key: str = ALICE) -> httpx.Client:
    return httpx.Client(base_url=gw_url, headers={"authorization": f"Bearer {key}"}, timeout=20, trust_env=False)


@pytest.fixture
def alice(gateway: GatewayThread) -> Iterator[httpx.Client]:
    with client(gateway.url, ALICE) as c:
        yield c


@pytest.fixture
def bob(gateway: GatewayThread) -> Iterator[httpx.Client]:
    with client(gateway.url, BOB) as c:
        yield c
