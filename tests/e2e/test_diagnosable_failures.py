"""Upstream failures an operator can diagnose: each answer, log line and metric names the target and the cause.

Every failure is real: a closed port (refused), a name under `.invalid` (DNS), a TLS server whose trustme
certificate the gateway does not trust, a listening socket whose backlog is full (the SYN is dropped, so
the connect times out), and a server that accepts the request and never answers (first-byte timeout).
The gateway is served by uvicorn on a real socket (tests/e2e/harness.py), through both transports.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trustme

from tests.helpers.accesslog import Lines
from tests.helpers.servers import GatewayThread, free_port

from .test_observability import metric


class _Mute:
    """A TCP server that accepts connections and reads, and never writes a byte."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.tls = tls
        self.conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.tls is not None:
                # The handshake fails on the gateway's side (it does not trust this certificate).
                threading.Thread(target=self._handshake, args=(conn,), daemon=True).start()
            self.conns.append(conn)

    def _handshake(self, conn: socket.socket) -> None:
        assert self.tls is not None
        try:
            self.tls.wrap_socket(conn, server_side=True)
        except (OSError, ssl.SSLError):
            pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()
        for c in self.conns:
            c.close()


class _Blackhole:
    """A listening socket whose accept queue is full: Linux drops further SYNs, so a connect hangs."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(0)
        self.port = int(self.sock.getsockname()[1])
        self.fill: list[socket.socket] = []
        for _ in range(4):
            c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            c.setblocking(False)
            try:
                c.connect(("127.0.0.1", self.port))
            except BlockingIOError:
                pass
            self.fill.append(c)

    def close(self) -> None:
        for c in self.fill:
            c.close()
        self.sock.close()


CONFIG = """
timeouts: {{connect_ms: 300, first_byte_ms: 300, total_ms: 5000}}
retries: {{attempts: 1}}
providers:
  refused: {{kind: openai, api_key: k, base_url: "http://127.0.0.1:{closed}/v1", transport: {transport}}}
  nodns: {{kind: openai, api_key: k, base_url: "http://upstream-{closed}.invalid/v1", transport: {transport}}}
  untrusted: {{kind: openai, api_key: k, base_url: "https://localhost:{tls}/v1", transport: {transport}}}
  blackhole: {{kind: openai, api_key: k, base_url: "http://127.0.0.1:{blackhole}/v1", transport: {transport}}}
  mute: {{kind: openai, api_key: k, base_url: "http://127.0.0.1:{mute}/v1", transport: {transport}}}
models:
  - {{name: smart, targets: [{{model: refused/gpt-x}}]}}
"""

# provider -> (status, code, message after "Upstream 'provider/gpt-x' ", cause)
CASES = {
    "refused": (502, "upstream_connection_refused", "could not be reached: the connection was refused"),
    "nodns": (502, "upstream_dns_failure", "could not be reached: its host name does not resolve"),
    "untrusted": (502, "upstream_tls_verification_failed", "could not be reached: its TLS certificate is not trusted"),
    "blackhole": (504, "upstream_connect_timeout", "timed out connecting (timeouts.connect_ms)"),
    "mute": (504, "upstream_first_byte_timeout", "timed out waiting for its answer (timeouts.first_byte_ms)"),
}


@pytest.fixture(params=["h1", "httpx"])
def gw(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GatewayThread]:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_ctx)
    untrusted, mute, blackhole = _Mute(server_ctx), _Mute(), _Blackhole()
    path = tmp_path / "config.yaml"
    path.write_text(
        CONFIG.format(
            closed=free_port(),
            tls=untrusted.port,
            blackhole=blackhole.port,
            mute=mute.port,
            transport=request.param,
        )
    )
    try:
        with GatewayThread(path, {}) as g:
            yield g
    finally:
        untrusted.close()
        mute.close()
        blackhole.close()


@pytest.mark.parametrize("provider", list(CASES))
def test_each_failure_names_its_target_and_cause(gw: GatewayThread, access: Lines, provider: str) -> None:
    status, code, what = CASES[provider]
    target = f"{provider}/gpt-x"
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as c:
        resp = c.post("/v1/completions", json={"model": target, "prompt": "x"})
        text = c.get("/metrics").text
    assert resp.status_code == status, resp.text
    assert resp.json() == {
        "error": {
            "message": f"Upstream '{target}' {what}",
            "type": "upstream_error" if status == 502 else "timeout_error",
            "param": None,
            "code": code,
        }
    }
    assert resp.headers["x-gateway-model"] == target
    assert resp.headers["x-gateway-provider"] == provider
    [line] = [x for x in access.lines if x["request_id"] == resp.headers["x-request-id"]]
    cause = code.removeprefix("upstream_")
    assert (line["provider"], line["target"], line["status"], line["error"], line["cause"]) == (
        provider,
        target,
        status,
        code,
        cause,
    )
    # Counted under the provider that failed, never under "none", and by cause.
    assert metric(text, "gateway_requests_total", provider=provider, status=str(status)) == 1
    assert metric(text, "gateway_requests_total", provider="none") == 0
    # Target labels fold like `model`: the alias's declared target by name, any other under `<provider>/other`.
    label = target if provider == "refused" else f"{provider}/other"
    assert metric(text, "gateway_upstream_failures_total", provider=provider, target=label) == 1
    assert metric(text, "gateway_upstream_failures_total", provider=provider, cause=cause) == 1


def test_an_alias_names_the_target_that_failed(gw: GatewayThread, access: Lines) -> None:
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as c:
        resp = c.post("/v1/completions", json={"model": "smart", "prompt": "x"})
        text = c.get("/metrics").text
    assert resp.status_code == 502
    assert (
        resp.json()["error"]["message"] == "Upstream 'refused/gpt-x' could not be reached: the connection was refused"
    )
    assert resp.headers["x-gateway-model"] == "refused/gpt-x"
    [line] = [x for x in access.lines if x["request_id"] == resp.headers["x-request-id"]]
    assert (line["model"], line["provider"], line["target"], line["cause"]) == (
        "smart",
        "refused",
        "refused/gpt-x",
        "connection_refused",
    )
    # The alias's own series carries the failing provider; the failure counter names the declared target.
    assert metric(text, "gateway_requests_total", model="smart", provider="refused", status="502") == 1
    assert (
        metric(
            text,
            "gateway_upstream_failures_total",
            provider="refused",
            target="refused/gpt-x",
            cause="connection_refused",
        )
        == 1
    )


BUDGET = """
keys:
  - {name: broke, key: "gk-broke-1", max_cost_per_day: 0}
providers:
  demo: {kind: fake, models: [text]}
models:
  - {name: fast, targets: [{model: demo/text}]}
"""


def test_a_budget_refusal_counts_under_its_model(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(BUDGET)
    with GatewayThread(path, {}) as g, httpx.Client(base_url=g.url, trust_env=False, timeout=10) as c:
        auth = {"authorization": "Bearer gk-broke-1"}
        for model in ("fast", "demo/text"):
            resp = c.post("/v1/completions", json={"model": model, "prompt": "x"}, headers=auth)
            assert (resp.status_code, resp.json()["error"]["code"]) == (429, "budget_exceeded")
        text = c.get("/metrics").text
    for model in ("fast", "demo/text"):
        assert metric(text, "gateway_requests_total", model=model, status="429") == 1
        assert metric(text, "gateway_rate_limited_total", code="budget_exceeded", model=model) == 1
    assert metric(text, "gateway_requests_total", model="unknown") == 0
