"""OpenTelemetry traces, exported over real sockets to a real OTLP/HTTP receiver.

The receiver is a plain HTTP server on a free loopback port that decodes each export request with
opentelemetry-proto (the messages the collector itself reads). The gateway is served by uvicorn
(tests/e2e/harness.py) and configured only by `tracing.enabled` and the standard `OTEL_*` variables; the
loopback upstream records the `traceparent` it was sent.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.helpers.recordings import REPO, fixture_bytes, sse_events
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Received, Upstream, reply, reply_sse

DAVINCI = fixture_bytes("openai/completion_davinci002.json")
STREAM = "openai/completion_stream_davinci002.sse.txt"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
SERVER, CLIENT = 2, 3  # opentelemetry.proto.trace.v1.Span.SpanKind


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent: str
    kind: int
    attributes: dict[str, Any]
    status: int
    resource: dict[str, Any] = field(default_factory=dict)
    links: list[tuple[str, str]] = field(default_factory=list)  # (trace id, span id) of each linked span


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


class Receiver:
    """An OTLP/HTTP receiver (`POST /v1/traces`, protobuf) that keeps every span it is sent."""

    def __init__(self) -> None:
        spans = self.spans = []  # type: list[Span]
        lock = self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the http.server API)
                body = self.rfile.read(int(self.headers["content-length"]))
                assert self.path == "/v1/traces", self.path
                assert self.headers["content-type"] == "application/x-protobuf"
                msg = ExportTraceServiceRequest()
                msg.ParseFromString(body)
                for rs in msg.resource_spans:
                    resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            with lock:
                                spans.append(
                                    Span(
                                        name=s.name,
                                        trace_id=s.trace_id.hex(),
                                        span_id=s.span_id.hex(),
                                        parent=s.parent_span_id.hex(),
                                        kind=s.kind,
                                        attributes={a.key: _value(a.value) for a in s.attributes},
                                        status=s.status.code,
                                        resource=resource,
                                        links=[(x.trace_id.hex(), x.span_id.hex()) for x in s.links],
                                    )
                                )
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait(self, count: int, trace_id: str | None = None, timeout: float = 10) -> list[Span]:
        """The spans of one trace (or all), once at least `count` have arrived."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                got = [s for s in self.spans if trace_id is None or s.trace_id == trace_id]
            if len(got) >= count or time.monotonic() > deadline:
                return got
            time.sleep(0.02)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


CONFIG = """
tracing: {{enabled: true}}
retries: {{attempts: 3, same_target: 1, initial_backoff_ms: 1, max_backoff_ms: 2}}
providers:
  up: {{kind: openai, api_key: k, base_url: "{u}/up/v1", models: [davinci-002]}}
  down: {{kind: openai, api_key: k, base_url: "{u}/down/v1", models: [davinci-002]}}
  pinned: {{kind: openai, api_key: k, base_url: "{u}/up/v1", headers: {{traceparent: "{pinned}"}}}}
  sgp: {{kind: sgp, api_key: k, base_url: "{u}/up"}}
  demo: {{kind: fake}}
  slow: {{kind: openai, api_key: k, base_url: "{u}/slow/v1"}}
  cut: {{kind: openai, api_key: k, base_url: "{u}/cut/v1"}}
models:
  - {{name: sturdy, targets: [{{model: down/davinci-002}}], fallbacks: [up/davinci-002]}}
  - name: hedged
    strategy: ordered
    hedge_after_ms: 100
    targets: [{{model: slow/davinci-002}}, {{model: up/davinci-002}}]
  - name: resumed
    strategy: ordered
    resume_streams: true
    targets: [{{model: cut/davinci-002}}, {{model: up/davinci-002}}]
"""
PINNED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def up() -> Iterator[Upstream]:
    server = Upstream()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def gw(receiver: Receiver, up: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[GatewayThread]:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.port}")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-under-test")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")

    async def route(request: web.Request, received: Received) -> web.StreamResponse:
        if received.path.startswith("/down/"):
            return web.Response(status=503, text='{"error": {"message": "overloaded", "type": "server_error"}}')
        if received.path.startswith("/slow/"):
            await asyncio.sleep(2)  # the hedge wins long before; the gateway then cancels this one
        if received.path.startswith("/cut/"):
            # Two events, then the connection drops mid-stream: a resumable stream continues elsewhere.
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(request)
            for event in sse_events(fixture_bytes(STREAM))[:2]:
                await resp.write(event + b"\n\n")
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.abort()
            return resp
        if received.json().get("stream"):
            return await reply_sse(sse_events(fixture_bytes(STREAM)))(request, received)
        return await reply(DAVINCI)(request, received)

    up.handler = route
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(u=up.url, pinned=PINNED))
    with GatewayThread(path, {}) as g:
        yield g


def test_a_request_is_a_server_span_with_an_attempt_child_and_propagates_its_traceparent(
    gw: GatewayThread, receiver: Receiver, up: Upstream
) -> None:
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as c:
        resp = c.post(
            "/v1/completions",
            json={"model": "up/davinci-002", "prompt": "x", "max_tokens": 16},
            headers={"traceparent": TRACEPARENT},
        )
    assert resp.status_code == 200, resp.text
    spans = receiver.wait(2, CLIENT_TRACE)
    [server] = [s for s in spans if s.kind == SERVER]
    [attempt] = [s for s in spans if s.kind == CLIENT]
    # The client's traceparent is the server span's parent; the attempt is the server span's child.
    assert (server.trace_id, server.parent) == (CLIENT_TRACE, CLIENT_SPAN)
    assert (attempt.trace_id, attempt.parent) == (CLIENT_TRACE, server.span_id)
    assert server.name == "POST /v1/completions"
    assert server.resource["service.name"] == "gateway-under-test"
    assert server.attributes == {
        "http.request.method": "POST",
        "url.path": "/v1/completions",
        "http.response.status_code": 200,
        "gen_ai.operation.name": "text_completion",
        "gen_ai.request.model": "up/davinci-002",
        "gen_ai.usage.input_tokens": 8,
        "gen_ai.usage.output_tokens": 16,
        "gen_ai.response.finish_reasons": ["length"],
        "gateway.dialect": "openai",
        "gateway.provider": "up",
        "gateway.target": "up/davinci-002",
        "gateway.attempts": 1,
        "gateway.stream": False,
        "gateway.request_id": resp.headers["x-request-id"],
    }
    assert attempt.name == "text_completion davinci-002"
    attrs = attempt.attributes
    assert attrs["gen_ai.provider.name"] == "openai"
    assert attrs["gen_ai.request.model"] == "davinci-002"
    assert (attrs["server.address"], attrs["server.port"]) == ("127.0.0.1", up.port)
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (8, 16)
    assert attrs["gen_ai.response.finish_reasons"] == ["length"]
    assert (attrs["gateway.attempt"], attrs["gateway.attempt.kind"]) == (1, "first")
    # What went upstream is the attempt's own context, in the client's trace.
    assert up.received[-1].headers["traceparent"] == f"00-{CLIENT_TRACE}-{attempt.span_id}-01"


def test_retries_and_failover_are_sibling_attempt_spans(gw: GatewayThread, receiver: Receiver, up: Upstream) -> None:
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as c:
        resp = c.post("/v1/completions", json={"model": "sturdy", "prompt": "x"}, headers={"traceparent": TRACEPARENT})
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-gateway-attempts"] == "3"
    spans = receiver.wait(4, CLIENT_TRACE)
    [server] = [s for s in spans if s.kind == SERVER]
    attempts = sorted((s for s in spans if s.kind == CLIENT), key=lambda s: s.attributes["gateway.attempt"])
    assert [(s.attributes["gateway.target"], s.attributes["gateway.attempt.kind"]) for s in attempts] == [
        ("down/davinci-002", "first"),
        ("down/davinci-002", "retry"),
        ("up/davinci-002", "failover"),
    ]
    assert all(s.parent == server.span_id for s in attempts)
    for failed in attempts[:2]:
        assert failed.status == 2  # STATUS_CODE_ERROR
        assert failed.attributes["gateway.failure.cause"] == "http_503"
        assert "error.type" in failed.attributes
    assert attempts[2].status != 2
    # Each upstream call carried its own attempt's span id.
    sent = [r.headers["traceparent"] for r in up.received]
    assert sent == [f"00-{CLIENT_TRACE}-{s.span_id}-01" for s in attempts]
    assert server.attributes["gateway.attempts"] == 3
    assert server.attributes["gen_ai.request.model"] == "sturdy"


@pytest.mark.parametrize("model", ["up/davinci-002", "demo/text"])
def test_a_stream_span_ends_with_the_stream(gw: GatewayThread, receiver: Receiver, up: Upstream, model: str) -> None:
    body = {"model": model, "prompt": "x", "stream": True, "stream_options": {"include_usage": True}}
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as c:
        resp = c.post("/v1/completions", json=body, headers={"traceparent": TRACEPARENT})
    assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")
    spans = receiver.wait(2, CLIENT_TRACE)
    [server] = [s for s in spans if s.kind == SERVER]
    [attempt] = [s for s in spans if s.kind == CLIENT]
    assert attempt.parent == server.span_id
    assert server.attributes["gateway.stream"] is True
    if model == "demo/text":
        # The usage arrives with the stream's last event, long after the attempt span (ended at the first one).
        assert server.attributes["gen_ai.usage.output_tokens"] > 0
        assert attempt.attributes["gen_ai.provider.name"] == "fake"
    else:  # the recorded OpenAI stream carries no usage
        assert up.received[-1].headers["traceparent"] == f"00-{CLIENT_TRACE}-{attempt.span_id}-01"


def test_a_hedge_and_a_resume_are_attempt_spans_of_their_own(gw: GatewayThread, receiver: Receiver) -> None:
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as c:
        hedged = c.post(
            "/v1/completions", json={"model": "hedged", "prompt": "x"}, headers={"traceparent": TRACEPARENT}
        )
        assert hedged.status_code == 200, hedged.text
        assert hedged.headers["x-gateway-model"] == "up/davinci-002"
        other = "0af7651916cd43dd8448eb211c80319d"
        resumed = c.post(
            "/v1/completions",
            json={"model": "resumed", "prompt": "x", "stream": True, "max_tokens": 16},
            headers={"traceparent": f"00-{other}-{CLIENT_SPAN}-01"},
        )
        assert resumed.status_code == 200 and '"error"' not in resumed.text, resumed.text

    def attempts(trace: str, count: int) -> list[Span]:
        spans = receiver.wait(count, trace)
        [server] = [s for s in spans if s.kind == SERVER]
        found = sorted((s for s in spans if s.kind == CLIENT), key=lambda s: s.attributes["gateway.attempt"])
        assert all(s.parent == server.span_id for s in found)
        return found

    slow, hedge = attempts(CLIENT_TRACE, 3)
    assert (slow.attributes["gateway.target"], slow.attributes["gateway.attempt.kind"]) == ("slow/davinci-002", "first")
    assert (hedge.attributes["gateway.target"], hedge.attributes["gateway.attempt.kind"]) == ("up/davinci-002", "hedge")
    assert hedge.status != 2
    # The loser was cancelled when the hedge answered: a failed span that says so.
    assert (slow.status, slow.attributes["error.type"]) == (2, "CancelledError")
    broken, resume = attempts(other, 3)
    assert (broken.attributes["gateway.target"], broken.attributes["gateway.attempt.kind"]) == (
        "cut/davinci-002",
        "first",
    )
    assert (resume.attributes["gateway.target"], resume.attributes["gateway.attempt.kind"]) == (
        "up/davinci-002",
        "resume",
    )


def test_a_failed_request_records_its_cause(gw: GatewayThread, receiver: Receiver) -> None:
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as c:
        resp = c.post("/v1/completions", json={"model": "down/davinci-002", "prompt": "x"})
    assert resp.status_code == 502
    [server] = [s for s in receiver.wait(3) if s.kind == SERVER]
    assert server.status == 2
    assert server.attributes["http.response.status_code"] == 502
    assert server.attributes["gateway.failure.cause"] == "http_503"
    assert server.attributes["gateway.target"] == "down/davinci-002"
    # No client traceparent: the gateway starts the trace.
    assert server.parent == ""


def test_operator_headers_win_and_client_extra_headers_do_not(
    gw: GatewayThread, receiver: Receiver, up: Upstream
) -> None:
    forged = "00-11111111111111111111111111111111-2222222222222222-01"
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as c:
        pinned = c.post("/v1/completions", json={"model": "pinned/davinci-002", "prompt": "x"})
        assert pinned.status_code == 200, pinned.text
        assert up.received[-1].headers["traceparent"] == PINNED
        sgp = c.post(
            "/v4/beta/completions",
            json={"model": "sgp/davinci-002", "prompt": "x", "inference_extra_headers": {"traceparent": forged}},
            headers={"traceparent": TRACEPARENT},
        )
        assert sgp.status_code == 200, sgp.text
    sent = up.received[-1].headers["traceparent"]
    assert sent != forged
    [attempt] = [s for s in receiver.wait(2, CLIENT_TRACE) if s.kind == CLIENT]
    assert sent == f"00-{CLIENT_TRACE}-{attempt.span_id}-01"


def test_an_invalid_traceparent_starts_a_new_trace(gw: GatewayThread, receiver: Receiver, up: Upstream) -> None:
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as c:
        resp = c.post(
            "/v1/completions",
            json={"model": "up/davinci-002", "prompt": "x"},
            headers={"traceparent": "00-zz-not-a-trace-01"},
        )
    assert resp.status_code == 200
    [server] = [s for s in receiver.wait(2) if s.kind == SERVER]
    assert server.parent == "" and len(server.trace_id) == 32


# opentelemetry made unimportable, as on an install without the `otel` extra: a gateway with tracing off must
# neither need nor try it. (redis-py probes for opentelemetry's metrics API on its own; that is not ours.)
OFF = """
import json, sys
sys.modules["opentelemetry"] = None
import httpx
from tests.helpers.servers import GatewayThread
from pathlib import Path
with GatewayThread(Path(sys.argv[1]), {}) as gw:
    r = httpx.post(gw.url + "/v1/completions", json={"model": "demo/text", "prompt": "x"}, trust_env=False)
    assert r.status_code == 200, r.text
print(json.dumps(sorted(m for m in sys.modules if m.startswith("opentelemetry") and sys.modules[m] is not None)))
"""


def test_tracing_off_needs_no_opentelemetry(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("providers:\n  demo: {kind: fake}\n")
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-c", OFF, str(path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("flags", ["01", "00"])
def test_client_context_link_starts_the_gateways_own_trace_linked_to_the_clients(
    receiver: Receiver, up: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: str
) -> None:
    """`tracing.client_context: link`: a client's traceparent (even an unsampled one) neither turns the gateway's
    spans off nor goes upstream; the request span is a new root that links to the client's span."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.port}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    up.handler = reply(DAVINCI)
    path = tmp_path / "config.yaml"
    path.write_text(
        "tracing: {enabled: true, client_context: link}\n"
        f"providers: {{up: {{kind: openai, api_key: k, base_url: '{up.url}/up/v1', models: [davinci-002]}}}}\n"
    )
    with GatewayThread(path, {}) as gw, httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as c:
        resp = c.post(
            "/v1/completions",
            json={"model": "up/davinci-002", "prompt": "x"},
            headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-{flags}"},
        )
        assert resp.status_code == 200, resp.text
        spans = receiver.wait(2)
    [server] = [s for s in spans if s.kind == SERVER]
    [attempt] = [s for s in spans if s.kind == CLIENT]
    assert server.trace_id != CLIENT_TRACE and server.parent == ""
    assert server.links == [(CLIENT_TRACE, CLIENT_SPAN)]
    assert (attempt.trace_id, attempt.parent) == (server.trace_id, server.span_id)
    # Upstream sees the gateway's trace, sampled by the gateway, and nothing of the client's.
    sent = up.received[-1].headers["traceparent"]
    assert sent.startswith(f"00-{server.trace_id}-{attempt.span_id}-") and int(sent[-2:], 16) & 1  # sampled
    assert CLIENT_TRACE not in str(up.received[-1].headers)
