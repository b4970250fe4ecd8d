"""What an operator sees of a queue: the status page's slots and waiters, the metrics, the access log's
`queue_ms`, and a wait's span (exported to a real OTLP/HTTP receiver)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_tracing import SERVER, Receiver
from tests.helpers.accesslog import listening
from tests.helpers.engine import Engine
from tests.helpers.redis import RedisServer
from tests.helpers.servers import serve_config
from tests.queue.conftest import ask, config, gate, hold_one, until


def _sample(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_status_metrics_and_access_log_show_the_queue(tmp_path: Path, engine: Engine) -> None:
    text = config(engine, 1, queue="max_depth: 2", extra="admin: {key: admin-q}").replace(
        "logging: {requests: false}", "logging: {requests: true}"
    )
    admin = {"authorization": "Bearer admin-q"}
    with serve_config(tmp_path, text) as gw, listening() as access:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            blocker = await hold_one(client, engine, "blocker")
            high = asyncio.ensure_future(ask(client, "boss", x_gateway_priority="high"))
            await until(lambda: gate(gw).order.depth == 1)
            low = asyncio.ensure_future(ask(client, "batch"))
            await until(lambda: gate(gw).order.depth == 2)
            full = await ask(client, "quiet")
            status = (await client.get("/admin/status", headers=admin)).json()
            waiting = (await client.get("/metrics")).text
            await asyncio.sleep(0.1)  # the waiters' wait is measurable
            engine.running.set()
            answers = await asyncio.gather(blocker, high, low)
            metrics = (await client.get("/metrics")).text
    assert full.status_code == 429 and [r.status_code for r in answers] == [200] * 3
    assert status["queues"] == [
        {"server": "engine", "cap": 1, "in_use": 1, "waiting": {"high": 1, "normal": 0, "low": 1, "batch": 0}}
    ]
    assert _sample(waiting, "gateway_queue_waiting", target="engine", priority="high") == 1
    assert _sample(waiting, "gateway_queue_waiting", target="engine", priority="low") == 1
    assert _sample(metrics, "gateway_queue_waiting", target="engine", priority="low") == 0
    assert _sample(metrics, "gateway_queue_wait_seconds_count", target="engine", priority="high") == 1
    assert _sample(metrics, "gateway_queue_wait_seconds_sum", target="engine", priority="low") >= 0.1
    assert _sample(metrics, "gateway_queue_rejected_total", target="engine", reason="queue_full") == 1
    # Service per tenant: each request's prompt (3 words) and generated tokens (1).
    assert _sample(metrics, "gateway_queue_service_tokens_total", target="engine", tenant="boss") == 4
    lines = {line["key"]: line for line in access.lines}
    assert lines["blocker"]["queue_ms"] == 0
    # A slot found free is written as every wait is, a float: the same text whatever path it took.
    blocker_line = next(raw for raw in access.raw if b'"key":"blocker"' in raw)
    assert b'"queue_ms":0.0' in blocker_line
    assert lines["batch"]["queue_ms"] >= 100 and lines["boss"]["queue_ms"] >= 100
    assert engine.order == ["blocker", "boss", "batch"]  # high before low
    assert lines["quiet"]["error"] == "queue_full"
    assert re.search(r'gateway_queue_rejected_total\{reason="queue_full",target="engine"\}', metrics)


async def test_a_wait_is_a_span_of_its_request(tmp_path: Path, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    receiver = Receiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.port}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    try:
        with serve_config(tmp_path, config(engine, 1, extra="tracing: {enabled: true}")) as gw:
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
                blocker = await hold_one(client, engine, "blocker")
                waiting = asyncio.ensure_future(ask(client, "boss", x_gateway_priority="high"))
                await until(lambda: gate(gw).order.depth == 1)
                await asyncio.sleep(0.05)
                engine.running.set()
                assert [r.status_code for r in await asyncio.gather(blocker, waiting)] == [200, 200]
        spans = receiver.wait(5)  # two requests, two attempts, one wait
    finally:
        receiver.close()
    waits = [s for s in spans if s.name == "queue wait"]
    assert len(waits) == 1
    wait = waits[0]
    assert wait.attributes == {"gateway.queue.server": "engine", "gateway.queue.priority": "high"}
    request = next(s for s in spans if s.span_id == wait.parent)
    assert request.kind == SERVER and request.trace_id == wait.trace_id


async def test_with_redis_the_status_page_counts_the_slots_every_gateway_holds(
    tmp_path: Path, engine: Engine, rds: RedisServer
) -> None:
    text = config(engine, 2, extra=f"admin: {{key: admin-q}}\nredis: {{url: '{rds.url}', on_failure: fail_closed}}")
    admin = {"authorization": "Bearer admin-q"}
    with serve_config(tmp_path, text) as a, serve_config(tmp_path, text) as b:
        async with (
            httpx.AsyncClient(base_url=a.url, timeout=30) as ca,
            httpx.AsyncClient(base_url=b.url, timeout=30) as cb,
        ):
            held = await hold_one(ca, engine)  # gateway a holds one of the two slots
            waiting = [asyncio.ensure_future(ask(cb, "quiet")) for _ in range(2)]  # b takes the other; one waits
            await until(lambda: engine.inflight == 2 and gate(b).order.depth == 1)
            seen = [(await c.get("/admin/status", headers=admin)).json()["queues"] for c in (ca, cb)]
            engine.running.set()
            answers = await asyncio.gather(held, *waiting)
    assert [r.status_code for r in answers] == [200] * 3
    # Slots in use are read from Redis (both gateways'); requests waiting are each process's own.
    assert seen[0] == [
        {"server": "engine", "cap": 2, "in_use": 2, "waiting": {"high": 0, "normal": 0, "low": 0, "batch": 0}}
    ]
    assert seen[1] == [
        {"server": "engine", "cap": 2, "in_use": 2, "waiting": {"high": 0, "normal": 1, "low": 0, "batch": 0}}
    ]
