"""``python -m bench.batch``: a batch's throughput against a client's, and interactive latency beside a batch.

Real processes on loopback: the Python upstream (``bench.upstream.server``, ``--latency-ms`` per answer)
and ``python -m gateway serve`` (one worker, a SQLite ledger in a temporary directory, ``batches.concurrency``
= ``--concurrency``). The upstream provider has ``max_concurrency: --max-concurrency``, as an operator
running batches on a shared fleet sets it (the engine's running batch): requests over the cap wait in the
gateway's queue, where a batch's lines are in the ``batch`` class and interactive requests ``normal``, and
``queue.low_share: --low-share`` keeps the rest of the slots free for interactive arrivals. Three
measurements, one after the other, all through the same cap:

- **client**: ``--lines`` requests sent by this process at ``--concurrency`` connections: lines per second;
- **batch**: the same lines as one batch through the Batch API (upload, create, poll until `completed`):
  lines per second from the create to the end, and the ratio to the client's (the goal: at least 0.9x);
- **interactive**: one closed-loop client's p50 and p99 for ``--seconds``, without a batch, then while a
  batch of the same lines runs (the goal: p99 within 1.2x); the batch is cancelled once measured. The
  queue's own counts (``gateway_queue_wait_seconds`` by priority) show the lines waited as ``batch``.

Bounded: the lines, the seconds and the concurrency are flags with small defaults; nothing leaves loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import uvloop
import yaml

from bench import processes
from bench.configs import child_env
from bench.scenarios import REQUEST

KEY = "bench-batch-key"
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
_TERMINAL = ("completed", "failed", "expired", "cancelled")


def _gateway(upstream_port: int, concurrency: int, cap: int, low_share: float, work: Path) -> processes.Service:
    port = processes.free_port()
    upstream = {"kind": "openai", "base_url": f"http://127.0.0.1:{upstream_port}/v1", "api_key": "k"}
    config: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": port},
        "logging": {"requests": False},
        "keys": [{"name": "bench", "key": KEY}],
        "providers": {"up": {**upstream, "max_concurrency": cap}},
        # Batch work waits for the capacity interactive traffic leaves (docs/batches.md).
        # and leaves interactive arrivals slots of their own (docs/fairness.md).
        "queue": {"max_wait_by_priority": {"batch": 600_000}, "low_share": low_share},
        "ledger": {"url": f"sqlite:///{work / 'ledger.db'}"},
        "batches": {"concurrency": concurrency, "poll_ms": 100},
    }
    path = work / "gateway.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", str(port)]
    return processes.start("gateway-batch", argv, port, work, timeout=45.0, env=child_env())


def _bodies(n: int) -> list[bytes]:
    return [msgspec.json.encode({**REQUEST, "prompt": f"item {i}: say hello"}) for i in range(n)]


async def _client(base: str, bodies: list[bytes], concurrency: int) -> dict[str, Any]:
    todo = iter(bodies)
    ok = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=AUTH) as session:

        async def worker() -> None:
            nonlocal ok
            for body in todo:
                async with session.post(base + "/v1/completions", data=body) as resp:
                    await resp.read()
                    ok += resp.status == 200

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        took = time.perf_counter() - started
    return {"lines": len(bodies), "ok": ok, "seconds": round(took, 3), "lines_per_s": round(len(bodies) / took, 1)}


async def _batch(
    base: str, bodies: list[bytes], stop: asyncio.Event | None = None, running: asyncio.Event | None = None
) -> dict[str, Any]:
    lines = b"".join(
        msgspec.json.encode({"custom_id": f"l-{i}", "method": "POST", "url": "/v1/completions", "body": msgspec.Raw(b)})
        + b"\n"
        for i, b in enumerate(bodies)
    )
    async with aiohttp.ClientSession(headers={"Authorization": AUTH["Authorization"]}) as session:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", lines, filename="bench.jsonl", content_type="application/jsonl")
        async with session.post(base + "/v1/files", data=form) as resp:
            file_id = (await resp.json())["id"]
        spec = {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"}
        started = time.perf_counter()
        async with session.post(base + "/v1/batches", json=spec) as resp:
            batch = await resp.json()
        cancelled = False
        while batch["status"] not in _TERMINAL:
            await asyncio.sleep(0.05)
            if running is not None and batch["status"] == "in_progress":
                running.set()
            if stop is not None and stop.is_set() and not cancelled:
                async with session.post(base + f"/v1/batches/{batch['id']}/cancel") as resp:
                    await resp.read()
                cancelled = True
            async with session.get(base + f"/v1/batches/{batch['id']}") as resp:
                batch = await resp.json()
        took = time.perf_counter() - started
    if running is not None:
        running.set()  # ended without running (a failed file): whoever waits for it must not wait forever
    counts = batch["request_counts"]
    return {
        "lines": len(bodies),
        "status": batch["status"],
        "completed": counts["completed"],
        "failed": counts["failed"],
        "seconds": round(took, 3),
        "lines_per_s": round(len(bodies) / took, 1),
    }


async def _interactive(base: str, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    body = msgspec.json.encode({**REQUEST, "prompt": "interactive: say hello"})
    stop = time.perf_counter() + seconds
    async with aiohttp.ClientSession(headers=AUTH) as session:
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            async with session.post(base + "/v1/completions", data=body) as resp:
                await resp.read()
            latencies.append((time.perf_counter() - t0) * 1000)
    cuts = statistics.quantiles(latencies, n=100)
    return {"requests": len(latencies), "p50_ms": round(cuts[49], 3), "p99_ms": round(cuts[98], 3)}


async def _beside_batch(base: str, bodies: list[bytes], seconds: float) -> dict[str, Any]:
    stop, running = asyncio.Event(), asyncio.Event()
    batch = asyncio.ensure_future(_batch(base, bodies, stop, running))
    await running.wait()  # validated: its lines are being sent
    await asyncio.sleep(0.3)
    before = await _queue_waits(base)
    measured = await _interactive(base, seconds)
    after = await _queue_waits(base)
    measured["batch_still_running"] = not batch.done()
    stop.set()
    ran = await batch
    measured["batch_lines_done"] = ran["completed"]
    measured["queue_waits"] = {
        p: {"waits": after[p][0] - before[p][0], "mean_ms": _mean_ms(after[p], before[p])} for p in after
    }
    return measured


async def _queue_waits(base: str) -> dict[str, tuple[float, float]]:
    """`gateway_queue_wait_seconds`: (count, sum) per priority, from the gateway's /metrics."""
    found: dict[str, list[float]] = {p: [0.0, 0.0] for p in ("normal", "batch")}
    async with aiohttp.ClientSession() as session, session.get(base + "/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        for part, at in (("_count{", 0), ("_sum{", 1)):
            if line.startswith("gateway_queue_wait_seconds" + part):
                for p in found:
                    if f'priority="{p}"' in line:
                        found[p][at] += float(line.rsplit(" ", 1)[1])
    return {p: (v[0], v[1]) for p, v in found.items()}


def _mean_ms(after: tuple[float, float], before: tuple[float, float]) -> float:
    n = after[0] - before[0]
    return round((after[1] - before[1]) / n * 1000, 3) if n else 0.0


def _measured(gw: processes.Service, phase: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """The phase's figures, with the gateway's CPU in it and the CPU other processes of the machine took."""
    window = processes.Window(gw)
    out = uvloop.run(phase)
    window.close()
    out["gateway_cpu_s"] = round(window.cpu_s, 2)
    if "lines" in out:
        out["gateway_cpu_ms_per_line"] = round(window.cpu_s * 1000 / out["lines"], 3)
    out["other_load_pct"] = window.other_load_pct()
    return out


def run(
    lines: int, concurrency: int, cap: int, low_share: float, seconds: float, latency_ms: float, work: Path
) -> dict[str, Any]:
    port = processes.free_port()
    argv = [sys.executable, "-m", "bench.upstream.server", "--port", str(port), "--latency-ms", str(latency_ms)]
    upstream = processes.start("batch-upstream", argv, port, work)
    try:
        gw = _gateway(port, concurrency, cap, low_share, work)
        try:
            bodies = _bodies(lines)
            client = _measured(gw, _client(gw.base_url, bodies, concurrency))
            batch = _measured(gw, _batch(gw.base_url, bodies))
            alone = _measured(gw, _interactive(gw.base_url, seconds))
            beside = _measured(gw, _beside_batch(gw.base_url, _bodies(lines * 4), seconds))
        finally:
            gw.stop()
    finally:
        upstream.stop()
    return {
        "settings": {
            "lines": lines,
            "concurrency": concurrency,
            "max_concurrency": cap,
            "low_share": low_share,
            "seconds": seconds,
            "upstream_latency_ms": latency_ms,
        },
        "client": client,
        "batch": batch,
        "batch_vs_client": round(batch["lines_per_s"] / client["lines_per_s"], 2),
        "interactive_alone": alone,
        "interactive_beside_batch": beside,
        "p99_ratio": round(beside["p99_ms"] / alone["p99_ms"], 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batch", description=__doc__)
    parser.add_argument("--lines", type=int, default=2000, help="lines of the measured batch (at most 50,000)")
    parser.add_argument("--concurrency", type=int, default=32, help="the client's connections and batches.concurrency")
    parser.add_argument(
        "--max-concurrency", type=int, default=16, help="the upstream's max_concurrency (both sides meet it)"
    )
    parser.add_argument(
        "--low-share", type=float, default=0.75, help="queue.low_share: the share of the cap batch lines may hold"
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="each interactive measurement")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="the upstream's time per answer")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if not 1 <= args.lines <= 12_500:  # the interactive batch holds four times as many, at most 50,000
        parser.error("--lines must be 1 to 12,500")
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as temp:
        results = run(
            args.lines,
            args.concurrency,
            args.max_concurrency,
            args.low_share,
            args.seconds,
            args.latency_ms,
            Path(temp),
        )
    text = msgspec.json.format(msgspec.json.encode(results)).decode()
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    ok = results["batch"]["status"] == "completed" and results["batch"]["completed"] == args.lines
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
