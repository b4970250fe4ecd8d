"""Servers shared by the security suite's client-input and work-bound tests.

Client input (test_input_body, _globs, _headers, _model ask for `client` and `up`): the gateway is
`create_app` served by uvicorn on a real socket; every upstream provider points at one `Recorder` on
127.0.0.1 that records what it received, raw request target included, so a test can prove that a
refused request never left the gateway.

Work bounds (test_work_*.py ask for `gateway`, `api` and the root `upstream`): the upstream answers as Ollama
(guided_regex, n and echo emulated by the gateway) and as Anthropic (guided_json emulated) do, from the
recorded bodies in tests/fixtures with only the generated text replaced. `/health` is polled while a
request runs to show that the worker's event loop keeps answering.

Both sets are module-scoped: every test module gets servers of its own. A module that defines a fixture
of the same name (`gateway`, `api`, `client`, `up`) uses its own. The httpx transport tests
(test_transport_httpx*.py) ask for `proxy` and `pki` (tests/security/httpx_rig.py). The stream tests
(test_stream_idle*.py, test_stream_hostile.py) take the root `upstream`, and `access`: the access log's lines.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from aiohttp import web

from tests.helpers.accesslog import Lines, listening
from tests.helpers.recordings import fixture_bytes, fixture_json
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Handler, Received, Recorder, Upstream
from tests.security.httpx_rig import Pki, Proxy

FULL_KEY = "gk-sec-input-full"
LIMITED_KEY = "gk-sec-input-limited"
SGP_ACCOUNT = "acct-pinned-by-operator"

INPUT_CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
unsupported_params: drop
retries: {{attempts: 1}}
timeouts: {{connect_ms: 2000, first_byte_ms: 5000, total_ms: 8000}}
caps: {{request_body_bytes: 65536, json_depth: 16, prompt_token_ids: 4096, param_token_ids: 1000}}
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


@pytest.fixture
def access() -> Iterator[Lines]:
    """The access log's lines written while the test runs."""
    with listening() as lines:
        yield lines


async def answer(request: web.Request, received: Received) -> web.StreamResponse:
    """A recorded OpenAI completion for every request."""
    return web.Response(body=COMPLETION, content_type="application/json")


@pytest.fixture(scope="module")
def input_upstream() -> Iterator[Recorder]:
    with Recorder() as up:
        yield up


@pytest.fixture(scope="module")
def input_gateway(input_upstream: Recorder, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    config = INPUT_CONFIG.format(u=input_upstream.url, full=FULL_KEY, limited=LIMITED_KEY, account=SGP_ACCOUNT)
    with serve_config(tmp_path_factory.mktemp("sec-input"), config) as gw:
        yield gw


@pytest.fixture
def up(input_upstream: Recorder) -> Recorder:
    input_upstream.reset()
    input_upstream.handler = answer
    return input_upstream


@pytest.fixture
def client(input_gateway: GatewayThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=input_gateway.url, trust_env=False, timeout=10) as c:
        yield c


def post(client: httpx.Client, route: str, body: Any, key: str = FULL_KEY, **kwargs: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}", **kwargs.pop("headers", {})}
    if isinstance(body, bytes):
        return client.post(route, content=body, headers={"content-type": "application/json", **headers}, **kwargs)
    return client.post(route, json=body, headers=headers, **kwargs)


# --------------------------------------------------------------------------------------------------
# Work bounds

KEY = "gk-security-work-5c1e"

WORK_CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
timeouts: {{connect_ms: 2000, first_byte_ms: 20000, total_ms: 60000}}
retries: {{attempts: 1}}
keys:
  - {{name: tester, key: "{key}"}}
providers:
  demo: {{kind: fake, models: [echo, text, long]}}
  ollama: {{kind: ollama, base_url: {u}/ollama}}
  anthropic: {{kind: anthropic, api_key: sk-ant-work-test, base_url: {u}/anthropic}}
"""


def ollama_answer(text: str) -> web.Response:
    body: dict[str, Any] = fixture_json("ollama/generate_nonstream.json")
    body["response"] = text
    return web.json_response(body)


def anthropic_answer(text: str) -> web.Response:
    body: dict[str, Any] = fixture_json("anthropic/messages_end_turn.json")
    body["content"] = [{"type": "text", "text": text}]
    return web.json_response(body)


def answering(text: str) -> Handler:
    """Both upstream kinds answer `text`, whatever was asked."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        if received.path.startswith("/anthropic/"):
            return anthropic_answer(text)
        return ollama_answer(text)

    return handler


@pytest.fixture(scope="module")
def gateway(upstream_server: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("work"), WORK_CONFIG.format(u=upstream_server.url, key=KEY)) as gw:
        yield gw


@pytest.fixture
def api(gateway: GatewayThread, upstream: Upstream) -> Iterator[httpx.Client]:
    """The work key's client; asking for it resets the upstream (`upstream`, tests/conftest.py) too."""
    with httpx.Client(
        base_url=gateway.url, trust_env=False, timeout=30, headers={"authorization": f"Bearer {KEY}"}
    ) as client:
        yield client


class HealthProbe:
    """Polls `/health` on its own connection while a request runs; records the slowest answer."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._stop = threading.Event()
        self.slowest = 0.0
        self.answers = 0
        self._thread = threading.Thread(target=self._run, name="health-probe", daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self._url, trust_env=False, timeout=30) as client:
            while not self._stop.is_set():
                start = time.perf_counter()
                assert client.get("/health").status_code == 200
                self.slowest = max(self.slowest, time.perf_counter() - start)
                self.answers += 1
                time.sleep(0.01)

    def _wait_for(self, answers: int) -> None:
        deadline = time.monotonic() + 60
        while self.answers < answers and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.002)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        self._wait_for(1)
        return self

    def __exit__(self, *exc: object) -> None:
        # At least one more answer after the request, so a loop that was blocked shows in `slowest`.
        self._wait_for(self.answers + 2)
        self._stop.set()
        self._thread.join(60)


def timed_post(client: httpx.Client, route: str, body: dict[str, Any]) -> tuple[httpx.Response, float]:
    start = time.perf_counter()
    resp = client.post(route, content=json.dumps(body), headers={"content-type": "application/json"})
    return resp, time.perf_counter() - start


def rss_bytes() -> int:
    """This process's resident set (the gateway and the upstream run in it, in threads)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.fixture
async def proxy() -> AsyncIterator[Proxy]:
    p = Proxy()
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return Pki(ca, ca_file, server)
