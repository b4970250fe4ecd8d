"""Hostile replicas' `/metrics` over real sockets: bounded while read, independent per replica, lies refused,
and one log line per change, not per read (docs/fleets.md "Engine load")."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import zlib
from collections import Counter
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from gateway.fleet.picker import EngineLoad
from tests.helpers.servers import GatewayProcess, GatewayThread, cli_env, serve_config
from tests.helpers.upstreams import Received, Upstream
from tests.helpers.waiting import wait_until

from .conftest import completion, fleet_config, served

ADMIN = {"authorization": "Bearer admin-fleet-key"}
MiB = 1024 * 1024
GOOD = b'vllm:num_requests_waiting{model_name="m"} 0.0\nvllm:num_requests_running{model_name="m"} 1.0\n'


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """About 0.8 MB of gzip that inflates to 800 MiB."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b"\n" * (8 * MiB)
    out = [c.compress(block) for _ in range(100)]
    return b"".join(out) + c.flush()


def metrics(body: bytes, **headers: str) -> web.Response:
    return web.Response(body=body, headers={"content-type": "text/plain", **headers})


def status(url: str) -> list[dict[str, object]]:
    with httpx.Client(trust_env=False, timeout=5) as c:
        fleets: list[dict[str, object]] = c.get(f"{url}/admin/status", headers=ADMIN).json()["fleets"]["engine"]
        return fleets


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (the peak so far) of a process, in KiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {k: int(fields[k].split()[0]) for k in ("VmRSS", "VmHWM")}


def test_a_400_mib_body_and_a_gzip_bomb_are_cut_while_read(
    tmp_path: Path, replicas: list[Upstream], bomb: bytes
) -> None:
    sent: list[int] = []  # bytes each read of the huge body took before the gateway hung up

    async def huge(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/plain"})
        await resp.prepare(request)
        # A series named like a wanted one all the way (the wanted samples are capped by count: test_exposition.py).
        chunk = b'vllm:num_requests_waiting_total{model_name="m"} 0\n' * (MiB // 50)
        n = 0
        try:
            while n < 400 * MiB:  # generated as it is sent, never held
                await resp.write(chunk)
                n += len(chunk)
            await resp.write_eof()
        finally:
            sent.append(n)
        return resp

    async def gzip_bomb(request: web.Request, received: Received) -> web.StreamResponse:
        return metrics(bomb, **{"content-encoding": "gzip"})

    async def fine(request: web.Request, received: Received) -> web.StreamResponse:
        return metrics(GOOD) if received.path == "/metrics" else web.Response(body=completion())

    for u, h in zip(replicas, (huge, gzip_bomb, fine), strict=True):
        u.handler = h
    config = tmp_path / "hostile.yaml"
    config.write_text(
        fleet_config(replicas, "policy: least_outstanding, engine_metrics: true, metrics_interval_ms: 100")
    )
    gw = GatewayProcess(config, cli_env())
    try:
        gw.wait_ready()
        pid = gw.proc.pid
        wait_until(lambda: status(gw.url)[2]["engine"] is not None, timeout=10)
        base = memory_kib(pid)["VmRSS"]
        slowest = 0.0
        with httpx.Client(trust_env=False, timeout=5) as c:
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                t = time.perf_counter()
                assert c.get(f"{gw.url}/health").status_code == 200
                slowest = max(slowest, time.perf_counter() - t)
                time.sleep(0.02)
        reads = [sum(1 for r in u.received if r.path == "/metrics") for u in replicas]
        peak = memory_kib(pid)["VmHWM"]
        shown = status(gw.url)
        with httpx.Client(trust_env=False, timeout=5) as c:
            exposition = c.get(f"{gw.url}/metrics").text
    finally:
        gw.stop()
    assert min(reads) >= 5, reads  # every replica was read again and again (each on its own schedule)
    assert sent and max(sent) < 64 * MiB, sent  # the gateway hung up near its 4 MiB cap, not at 400 MiB
    # Whole, each body would take hundreds of MiB; read as it arrives, the peak stays near the start's.
    assert peak - base < 48 * 1024, (base, peak)
    assert slowest < 0.2, slowest
    assert shown[0]["engine"] is None and shown[0]["engine_error"] == "larger than 4194304 bytes"
    assert shown[1]["engine"] is None and shown[1]["engine_error"] == "larger than 4194304 bytes"
    assert shown[2]["engine"] == {"waiting": 0.0, "running": 1.0, "kv_usage": None}
    assert shown[2]["engine_error"] is None
    # Every failed read is counted, by replica and cause (the log says it once).
    counted = {
        line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
        for line in exposition.splitlines()
        if line.startswith("gateway_engine_metrics_unreadable_total{")
    }
    assert set(counted) == {'cause="too_large",replica="engine@0"', 'cause="too_large",replica="engine@1"'}, counted
    assert min(counted.values()) >= 5, counted
    log = gw.log.read_text()
    # One WARNING per replica that cannot be read, however many reads failed; no line per read.
    assert log.count("engine@0's engine metrics cannot be read (larger than 4194304 bytes)") == 1, log
    assert log.count("engine@1's engine metrics cannot be read (larger than 4194304 bytes)") == 1, log
    assert "engine@2" not in log and "HTTP Request" not in log and "/metrics" not in log, log


def test_a_slow_replica_delays_no_other_replicas_reading(tmp_path: Path, replicas: list[Upstream]) -> None:
    waiting = [0]

    async def drip(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/plain"})
        await resp.prepare(request)
        for _ in range(600):  # a byte every 50 ms: no read timeout ever fires on its own
            await resp.write(b"#")
            await asyncio.sleep(0.05)
        return resp

    async def counting(request: web.Request, received: Received) -> web.StreamResponse:
        return metrics(f"vllm:num_requests_waiting {waiting[0]}\n".encode())

    replicas[0].handler = drip
    replicas[1].handler = counting
    replicas[2].handler = counting
    routing = "policy: least_outstanding, engine_metrics: true, metrics_interval_ms: 50, metrics_timeout_ms: 1500"
    with serve_config(tmp_path, fleet_config(replicas, routing)) as gw:
        fleet = gw.pipeline.router.fleets["engine"]
        wait_until(lambda: fleet.engine[1] is not None)
        lags = []
        for n in range(1, 6):  # while replica 0's first read drips on (1.5 s), the others follow within 0.3 s
            waiting[0] = n
            t = time.monotonic()
            wait_until(lambda n=n: all(fleet.engine[i] == EngineLoad(n, 0.0) for i in (1, 2)))
            lags.append(time.monotonic() - t)
            time.sleep(0.05)
        assert max(lags) < 0.3, lags
        # The dripping read is dropped at its whole-read timeout, not left open.
        wait_until(lambda: fleet.engine_error[0] == "no whole answer within 1500 ms", timeout=5)
        assert fleet.engine[0] is None


@pytest.mark.parametrize("lie", ["-1e9", "NaN", "-Inf", "1e12"])
def test_a_replica_lying_about_its_queue_draws_no_extra_traffic(
    tmp_path: Path, replicas: list[Upstream], lie: str
) -> None:
    def engine(waiting: str) -> object:
        async def handler(request: web.Request, received: Received) -> web.StreamResponse:
            if received.path == "/metrics":
                return metrics(f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'.encode())
            return web.Response(body=completion(), content_type="application/json")

        return handler

    for u, w in zip(replicas, (lie, "0", "0"), strict=True):
        u.handler = engine(w)  # type: ignore[assignment]
    routing = "policy: least_outstanding, engine_metrics: true, metrics_interval_ms: 50"
    with serve_config(tmp_path, fleet_config(replicas, routing)) as gw:
        fleet = gw.pipeline.router.fleets["engine"]
        wait_until(lambda: fleet.engine[1] is not None and fleet.engine_error[0] is not None)
        assert fleet.engine[0] is None  # its claim is ignored: its load is unknown, routed as the others
        assert "invalid value of vllm:num_requests_waiting" in (fleet.engine_error[0] or "")
        with httpx.Client(trust_env=False, timeout=15) as c:
            for n in range(30):
                assert (
                    c.post(f"{gw.url}/v1/completions", json={"model": "engine/m", "prompt": f"p{n}"}).status_code == 200
                )
    counts = served(replicas)
    assert max(counts) <= 12 and min(counts) >= 8, counts  # 10 each: ties go round


def test_readability_changes_are_logged_once_each(
    tmp_path: Path, replicas: list[Upstream], caplog: pytest.LogCaptureFixture
) -> None:
    up = [True]

    async def flaky(request: web.Request, received: Received) -> web.StreamResponse:
        return metrics(GOOD) if up[0] else web.Response(status=500)

    replicas[0].handler = flaky
    routing = "policy: least_outstanding, engine_metrics: true, metrics_interval_ms: 50"
    caplog.set_level(logging.DEBUG)
    with serve_config(tmp_path, fleet_config(replicas[:1], routing)) as gw:
        fleet = gw.pipeline.router.fleets["engine"]

        def reads() -> int:
            return sum(1 for r in replicas[0].received if r.path == "/metrics")

        def after(n: int) -> None:
            start = reads()
            wait_until(lambda: reads() >= start + n)

        after(5)
        up[0] = False
        after(5)  # failed reads back off: 50, 100, 200, 400 ms apart
        assert fleet.engine[0] is None and fleet.engine_error[0] == "HTTP 500"
        up[0] = True
        after(10)
        assert fleet.engine[0] is not None and fleet.engine_error[0] is None
    lines = Counter(
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.name in ("gateway.fleet", "httpx", "httpcore") and r.levelno >= logging.INFO
    )
    assert lines == Counter(
        {
            (
                "WARNING",
                "fleet: engine@0's engine metrics cannot be read (HTTP 500); it is routed as if its load were "
                "unknown until they can",
            ): 1,
            ("INFO", "fleet: engine@0's engine metrics are read again"): 1,
        }
    ), lines


def test_heavy_reads_are_logged_once_when_they_start_and_once_when_they_end(
    tmp_path: Path, replicas: list[Upstream], caplog: pytest.LogCaptureFixture
) -> None:
    """A read over a quarter of `metrics_max_bytes` (1.1 MB of foreign lines here) gives its load but backs off;
    the operator is told once that the replica's reads are heavy, and once that they are light again."""
    heavy = [True]

    async def bloated(request: web.Request, received: Received) -> web.StreamResponse:
        return metrics(b"a 0\n" * 280_000 + GOOD if heavy[0] else GOOD)

    replicas[0].handler = bloated
    routing = "policy: least_outstanding, engine_metrics: true, metrics_interval_ms: 50"
    caplog.set_level(logging.INFO)
    with serve_config(tmp_path, fleet_config(replicas[:1], routing)) as gw:
        fleet = gw.pipeline.router.fleets["engine"]

        def reads() -> int:
            return sum(1 for r in replicas[0].received if r.path == "/metrics")

        wait_until(lambda: reads() >= 4, timeout=10)  # 50, 100, 200 ms apart: backed off, logged once
        heavy[0] = False
        start = reads()
        wait_until(lambda: reads() >= start + 4, timeout=10)
        assert fleet.engine[0] is not None and fleet.engine_error[0] is None
    lines = [(r.levelname, re.sub(r"\d{7}", "N", r.getMessage())) for r in caplog.records if r.name == "gateway.fleet"]
    assert lines == [
        (
            "WARNING",
            "fleet: engine@0's engine metrics took N bytes to read, over a quarter of metrics_max_bytes; "
            "they are read ever less often while they stay that heavy",
        ),
        ("INFO", "fleet: engine@0's engine metrics are light again"),
    ], lines


def test_a_reload_that_turns_engine_metrics_on_starts_reading(tmp_path: Path, replicas: list[Upstream]) -> None:
    async def engine(request: web.Request, received: Received) -> web.StreamResponse:
        return metrics(GOOD) if received.path == "/metrics" else web.Response(body=completion())

    for u in replicas:
        u.handler = engine
    config = tmp_path / "reloaded.yaml"
    config.write_text(fleet_config(replicas, "policy: least_outstanding"))
    with GatewayThread(config, {}) as gw:
        time.sleep(0.5)
        assert not any(r.path == "/metrics" for u in replicas for r in u.received)  # off: never read
        config.write_text(fleet_config(replicas, "policy: least_outstanding, engine_metrics: true"))
        wait_until(lambda: all(load is not None for load in gw.pipeline.router.fleets["engine"].engine), timeout=15)
