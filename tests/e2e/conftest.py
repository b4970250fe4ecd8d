"""Session-wide servers for the end-to-end suite.

One loopback upstream serves every upstream provider of the main config under its own path prefix;
each test sets the upstream's handler and reads back what it received (reset before every test).
One gateway serves the main config for the whole session; tests that need another config (Redis,
the CLI) start their own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.helpers.accesslog import Lines, listening
from tests.helpers.clients import openai_client
from tests.helpers.servers import GatewayThread, free_port, serve_config
from tests.helpers.upstreams import Upstream

FULL_KEY = "gk-e2e-full-6b1f0c"
LIMITED_KEY = "gk-e2e-limited-93d2aa"
# What the gateway sends upstream; the client never sees these.
OPENAI_UPSTREAM_KEY = "sk-upstream-openai-e2e"
SGP_UPSTREAM_KEY = "sgp-upstream-e2e"
AZURE_US_KEY = "az-us-e2e"
AZURE_EU_KEY = "az-eu-e2e"

GATEWAY_ENV = {"E2E_FULL_KEY": FULL_KEY, "E2E_LIMITED_KEY": LIMITED_KEY}

MAIN_CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
unsupported_params: error
timeouts: {{connect_ms: 2000, first_byte_ms: 10000, total_ms: 20000}}
# The core suite asserts what one upstream call produces; retries and failover have their own suite.
retries: {{attempts: 1}}
keys:
  - {{name: full, key: "${{E2E_FULL_KEY}}"}}
  - {{name: limited, key: "${{E2E_LIMITED_KEY}}", models: ["demo/*", "fast"]}}
  - {{name: ghost, key: "${{E2E_UNSET_GHOST_KEY}}"}}
providers:
  demo: {{kind: fake, models: [echo, text]}}
  openai:
    kind: openai
    api_key: {openai_key}
    base_url: {u}/openai/v1
    models: [davinci-002]
  openai-slow:
    kind: openai
    api_key: {openai_key}
    base_url: {u}/openai-slow/v1
    timeouts: {{connect_ms: 400, first_byte_ms: 400, total_ms: 400}}
  openai-down: {{kind: openai, api_key: {openai_key}, base_url: "http://127.0.0.1:{closed_port}/v1"}}
  together: {{kind: together, api_key: together-e2e, base_url: {u}/together/v1}}
  together-drop: {{kind: together, api_key: together-e2e, base_url: {u}/together/v1, unsupported_params: drop}}
  vllm: {{kind: vllm, base_url: {u}/vllm/v1}}
  # TGI's Messages API serves an OpenAI-compatible /v1/completions; it is configured like a local vLLM, less
  # the per-key prefix-cache salt (TGI takes none).
  tgi: {{kind: vllm, base_url: {u}/tgi/v1, prefix_scope: shared}}
  fireworks: {{kind: fireworks, api_key: fw-e2e, base_url: {u}/fireworks/inference/v1}}
  deepseek: {{kind: deepseek, api_key: ds-e2e, base_url: {u}/deepseek/beta}}
  azure:
    kind: azure
    api_key: {az_us}
    base_url: {u}/azure-us
    api_version: "2024-02-01"
    deployments:
      eu: {{base_url: {u}/azure-eu, api_key: {az_eu}, api_version: "2024-06-01"}}
  sgp:
    kind: sgp
    api_key: {sgp_key}
    base_url: {u}/sgp
    headers: {{x-selected-account-id: acct-e2e}}
  pais: {{kind: pais, base_url: {u}/pais/api/v1/compatibility/openai/v1}}
  pais-nokey: {{kind: pais, api_key: "${{E2E_UNSET_PAIS_KEY}}", base_url: {u}/pais/api/v1/compatibility/openai/v1}}
models:
  - name: fast
    targets: [{{model: demo/text}}]
  - name: davinci
    targets: [{{model: openai/davinci-002}}]
"""


def unsalted(body: dict[str, Any]) -> dict[str, Any]:
    """A body a vLLM provider was sent for a keyed request, less the prefix-cache salt the gateway adds for the
    calling key (`prefix_scope: key`, the default; docs/fleets.md): 32 hex digits, never the key itself."""
    salt = body.pop("cache_salt")
    assert isinstance(salt, str) and re.fullmatch(r"[0-9a-f]{32}", salt), salt
    return body


def main_config(upstream_url: str) -> str:
    return MAIN_CONFIG.format(
        u=upstream_url,
        closed_port=free_port(),
        openai_key=OPENAI_UPSTREAM_KEY,
        sgp_key=SGP_UPSTREAM_KEY,
        az_us=AZURE_US_KEY,
        az_eu=AZURE_EU_KEY,
    )


@pytest.fixture(scope="session")
def upstream_server() -> Iterator[Upstream]:
    with Upstream() as server:
        yield server


@pytest.fixture(scope="session")
def gateway(upstream_server: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("gateway"), main_config(upstream_server.url), GATEWAY_ENV) as gw:
        yield gw


@pytest.fixture(autouse=True)
def fresh_target_health(request: pytest.FixtureRequest) -> None:
    """Cooldowns earned by one test's failing upstream must not make the next test's target cool."""
    if "gateway" in request.fixturenames:
        gw: GatewayThread = request.getfixturevalue("gateway")
        gw.pipeline.health.reset()


@pytest.fixture(scope="session")
def api(gateway: GatewayThread) -> Iterator[httpx.Client]:
    """A raw HTTP client presenting the full-access key."""
    with httpx.Client(
        base_url=gateway.url, trust_env=False, timeout=15, headers={"authorization": f"Bearer {FULL_KEY}"}
    ) as client:
        yield client


@pytest.fixture(scope="session")
def bare(gateway: GatewayThread) -> Iterator[httpx.Client]:
    """A raw HTTP client presenting no key."""
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as client:
        yield client


@pytest.fixture(scope="session")
def oai(gateway: GatewayThread) -> Iterator[openai.OpenAI]:
    """The official OpenAI SDK (sync) against the gateway's /v1 with the full-access key."""
    with openai_client(gateway.url + "/v1", FULL_KEY) as client:
        yield client


@pytest.fixture
def access() -> Iterator[Lines]:
    """The access log's lines written while the test runs."""
    with listening() as lines:
        yield lines
