"""Real servers for the work-bound regression tests (tests/security/test_work_*.py).

The gateway is `create_app` served by uvicorn on a real socket (tests/e2e/harness.py `GatewayThread`);
the upstreams are one real aiohttp server on loopback (`Upstream`) answering as Ollama (guided_regex,
n and echo emulated by the gateway) and as Anthropic (guided_json emulated) do, from the recorded bodies
in tests/fixtures with only the generated text replaced. `/health` is polled while a request runs to
show that the worker's event loop keeps answering.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.e2e.harness import GatewayThread, Handler, Received, Upstream, fixture_json

KEY = "gk-security-work-5c1e"

CONFIG = """
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
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    path: Path = tmp_path_factory.mktemp("work") / "config.yaml"
    path.write_text(CONFIG.format(u=upstream.url, key=KEY))
    gw = GatewayThread(path, {})
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture
def api(gateway: GatewayThread, upstream: Upstream) -> Iterator[httpx.Client]:
    upstream.reset()
    with httpx.Client(
        base_url=gateway.url, trust_env=False, timeout=30, headers={"authorization": f"Bearer {KEY}"}
    ) as client:
        yield client
    upstream.reset()


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
