"""What an operator sees of batches: `gateway_batches` (batches by status) and `gateway_batch_lines_in_flight`
on /metrics, and a line's access-log entry and trace span (exported to a real OTLP/HTTP receiver) carrying its
batch's id, its request id the result line's."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_tracing import CLIENT, SERVER, Receiver
from tests.helpers.accesslog import listening
from tests.helpers.engine import Engine
from tests.helpers.servers import GatewayThread

from .conftest import ENV, EVAL_KEY, config, line, results, sdk, served, start, upload, wait_batch


def _sample(text: str, name: str, status: str | None = None) -> float | None:
    want = name if status is None else f'{name}{{status="{status}"}}'
    for x in text.splitlines():
        if x.split(" ", 1)[0] == want:
            return float(x.rsplit(" ", 1)[1])
    return None


def test_batches_by_status_and_lines_in_flight(tmp_path: Path) -> None:
    concurrency = 3
    with served(tmp_path, concurrency=concurrency) as (gw, client):
        done = wait_batch(client, start(client, [line("d-1"), line("d-2")]))
        bad = wait_batch(
            client,
            client.batches.create(
                input_file_id=upload(client, b"not json\n"), endpoint="/v1/completions", completion_window="24h"
            ).id,
        )
        cancelled = start(client, [line(f"c-{i}", model="slower") for i in range(20)])
        client.batches.cancel(cancelled)
        wait_batch(client, cancelled)
        running = start(client, [line(f"r-{i}", model="slower", prompt=f"p {i}") for i in range(12)])
        seen: list[tuple[float | None, float | None]] = []
        with httpx.Client(base_url=gw.url) as http:
            deadline = time.monotonic() + 20
            while True:
                text = http.get("/metrics").text
                seen.append(
                    (_sample(text, "gateway_batch_lines_in_flight"), _sample(text, "gateway_batches", "in_progress"))
                )
                if seen[-1] == (concurrency, 1) and _sample(text, "gateway_batches", "cancelled") == 1:
                    break
                assert time.monotonic() < deadline, seen[-5:]
                time.sleep(0.02)
            during = text
            batch = wait_batch(client, running)
            deadline = time.monotonic() + 10
            while _sample(text := http.get("/metrics").text, "gateway_batches", "in_progress") != 0:
                assert time.monotonic() < deadline  # read every batches.poll_ms
                seen.append((_sample(text, "gateway_batch_lines_in_flight"), None))
                time.sleep(0.02)
            after = text
    assert (done.status, bad.status, batch.status) == ("completed", "failed", "completed")
    # Never more lines in flight than batches.concurrency.
    assert max(s[0] or 0 for s in seen) == concurrency
    by_status = {s: _sample(during, "gateway_batches", s) for s in ("completed", "failed", "cancelled", "in_progress")}
    assert by_status == {"completed": 1, "failed": 1, "cancelled": 1, "in_progress": 1}
    assert _sample(during, "gateway_batches", "validating") == 0
    assert _sample(after, "gateway_batches", "completed") == 2 and _sample(after, "gateway_batches", "in_progress") == 0
    assert _sample(after, "gateway_batch_lines_in_flight") == 0


def test_a_lines_log_entry_and_span_carry_its_batch_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    receiver = Receiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.port}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    lines = [line(f"t-{i}", model="engine/m", prompt=f"traced item {i}") for i in range(3)]
    try:
        with Engine() as engine, listening() as log:
            more = f'  engine: {{kind: vllm, base_url: "{engine.url}/v1", discover: false}}\ntracing: {{enabled: true}}'
            path = tmp_path / "config.yaml"
            path.write_text(config(f"sqlite:///{tmp_path / 'ledger.db'}", more=more))
            with GatewayThread(path, ENV) as gw:
                gw.pipeline.log_requests = True  # the suite's config turns the access log off; this test reads it
                client = sdk(gw.url, EVAL_KEY)
                batch = wait_batch(client, start(client, lines))
                out = results(client, batch.output_file_id)
            sent = {r.json()["prompt"]: r.headers.get("traceparent", "") for r in engine.received}
        spans = receiver.wait(6)  # a line's request span and its attempt's, three times
    finally:
        receiver.close()
    assert batch.status == "completed" and len(out) == 3
    entries = {e["request_id"]: e for e in log.lines if e.get("batch_id") == batch.id}
    requests = {s.attributes["gateway.request_id"]: s for s in spans if s.kind == SERVER}
    for o in out:
        request_id = o["response"]["request_id"]
        assert entries[request_id]["status"] == 200 and entries[request_id]["key"] == "eval"
        span = requests[request_id]
        assert span.name == "POST /v1/completions" and span.attributes["gateway.batch_id"] == batch.id
        assert span.attributes["http.response.status_code"] == 200 and span.parent == ""  # a trace of its own
        attempt = next(s for s in spans if s.kind == CLIENT and s.parent == span.span_id)
        assert attempt.trace_id == span.trace_id
        # The engine was sent the line's trace: its traceparent names the attempt's span.
        prompt = next(x["body"]["prompt"] for x in lines if x["custom_id"] == o["custom_id"])
        assert sent[prompt].split("-")[1:3] == [span.trace_id, attempt.span_id]
    assert len({s.trace_id for s in requests.values()}) == 3
