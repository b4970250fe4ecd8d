"""The fairness benchmark: tenants sharing a saturated engine, with the gateway's queue and without it.

`python -m bench.fairness [--seconds 6] [--markdown docs/benchmarks-fairness.md]` starts a loopback engine
simulator with a bounded running batch (`--batch` requests decode at once, each token taking `--token-ms`;
the rest wait in the engine's own first-come queue, as vLLM's scheduler queues them) and, per scenario, a
gateway in front of it three ways: without `max_concurrency` (every request goes straight to the engine),
with `max_concurrency` equal to the batch (requests wait in the gateway's fair queue), and with the
quiet tenant alone. Tenants are closed loops of lanes (each sends its next request when its last answers).
It reports each tenant's share of the tokens served (prompt plus generated), its latency p50/p99, and the
total tokens per second. Runs are bounded by `--seconds` each (the first second is not counted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

from bench.fleet import serve


class Engine:
    """An engine with a bounded running batch and a first-come waiting queue."""

    def __init__(self, batch: int, token_ms: float, jitter: float) -> None:
        self.slots = asyncio.Semaphore(batch)
        self.token_s = token_ms / 1000
        # A decode step's time varies with what else runs; without it, requests of one length started
        # together end together for ever (a lock-step no engine keeps).
        self.jitter = jitter
        self.rng = random.Random(7)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        tokens = int(body.get("max_tokens") or 16)
        prompt = len(str(body["prompt"]).split())
        async with self.slots:
            await asyncio.sleep(tokens * self.token_s * self.rng.uniform(1 - self.jitter, 1 + self.jitter))
        usage = {"prompt_tokens": prompt, "completion_tokens": tokens, "total_tokens": prompt + tokens}
        answer = {
            "id": "c",
            "object": "text_completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "text": "x" * tokens, "logprobs": None, "finish_reason": "length"}],
            "usage": usage,
        }
        return web.Response(body=json.dumps(answer).encode(), content_type="application/json")

    async def start(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.SockSite(runner, self.sock).start()
        return runner


class Tenant:
    """A tenant: its key, its lanes (concurrent closed loops), its answers' length, weight and priority."""

    def __init__(self, name: str, lanes: int, tokens: int, weight: float = 1.0, priority: str = "normal") -> None:
        self.name, self.lanes, self.tokens, self.weight, self.priority = name, lanes, tokens, weight, priority


SCENARIOS: dict[str, list[Tenant]] = {
    # One tenant opens ten times the concurrency of another (an eval sweep beside interactive use).
    "flood": [Tenant("noisy", 20, 32), Tenant("quiet", 2, 32)],
    # Both backlogged; one asks for long generations, the other for short ones: equal token shares.
    "long-short": [Tenant("long", 8, 256), Tenant("short", 8, 16)],
    # Both backlogged with the same requests; weights 3:1.
    "weights": [Tenant("heavy", 8, 32, weight=3), Tenant("light", 8, 32)],
    # A background batch at `low` under interactive `normal` traffic.
    "low-flood": [Tenant("batch", 20, 32, priority="low"), Tenant("quiet", 2, 32)],
}
# The tenant whose latency each scenario compares with its solo run (None: all are backlogged).
QUIET = {"flood": "quiet", "low-flood": "quiet", "long-short": None, "weights": None}


def config(engine: Engine, tenants: list[Tenant], cap: int | None) -> str:
    keys = "".join(
        f"  - {{name: {t.name}, key: k-{t.name}, weight: {t.weight}, priority: {t.priority}}}\n" for t in tenants
    )
    capped = f"    max_concurrency: {cap}\n" if cap is not None else ""
    return (
        "server: {host: 127.0.0.1}\nlogging: {requests: false}\nretries: {attempts: 1}\n"
        "timeouts: {total_ms: 600000, first_byte_ms: 600000}\n"
        f"keys:\n{keys}"
        "providers:\n  engine:\n    kind: vllm\n    discover: false\n"
        f"    base_url: http://127.0.0.1:{engine.port}/v1\n{capped}"
        "queue: {max_wait_ms: 600000, max_depth: 100000}\n"
    )


async def drive(url: str, tenants: list[Tenant], seconds: float) -> dict[str, Any]:
    """Every tenant's lanes for `seconds`; what each tenant got (answers ended) after the first second."""
    start = time.monotonic()
    counted_from, end = start + 1.0, start + seconds
    got: dict[str, list[tuple[float, int]]] = {t.name: [] for t in tenants}
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits, trust_env=False) as client:

        async def lane(t: Tenant) -> None:
            body = {"model": "engine/m", "prompt": f"{t.name} says hello", "max_tokens": t.tokens}
            headers = {"authorization": f"Bearer k-{t.name}"}
            while time.monotonic() < end:
                sent = time.monotonic()
                resp = await client.post("/v1/completions", json=body, headers=headers)
                done = time.monotonic()
                # Counted by when it ended: counting by when it was sent would leave out the long requests
                # still running at the end, and undercount whoever waits longest.
                if resp.status_code == 200 and counted_from <= done <= end:
                    got[t.name].append((done - sent, resp.json()["usage"]["total_tokens"]))

        await asyncio.gather(*(lane(t) for t in tenants for _ in range(t.lanes)))
    window = seconds - 1.0
    total = sum(tok for rows in got.values() for _, tok in rows)
    out: dict[str, Any] = {"tokens_per_s": total / window, "tenants": {}}
    for name, rows in got.items():
        lat = sorted(s for s, _ in rows)
        out["tenants"][name] = {
            "share": sum(tok for _, tok in rows) / total if total else 0.0,
            "requests": len(rows),
            "p50_ms": 1000 * statistics.median(lat) if lat else float("nan"),
            "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan"),
        }
    return out


async def run(args: argparse.Namespace, tenants: list[Tenant], cap: int | None) -> dict[str, Any]:
    engine = Engine(args.batch, args.token_ms, args.jitter)
    runner = await engine.start()
    url, stop = serve(config(engine, tenants, cap))
    try:
        return await drive(url, tenants, args.seconds)
    finally:
        stop()
        await runner.cleanup()


async def main(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for name in args.scenarios.split(","):
        tenants = SCENARIOS[name]
        runs: dict[str, Any] = {
            "without queue": await run(args, tenants, None),
            "with queue": await run(args, tenants, args.batch),
        }
        quiet = QUIET[name]
        if quiet is not None:
            alone = [t for t in tenants if t.name == quiet]
            runs["alone"] = await run(args, alone, args.batch)
        results[name] = runs
        print(report_one(name, tenants, runs), flush=True)
    return results


def _fair(tenants: list[Tenant]) -> dict[str, float]:
    """Each tenant's weighted share when all are backlogged (the goal for `long-short` and `weights`)."""
    total = sum(t.weight for t in tenants)
    return {t.name: t.weight / total for t in tenants}


def report_one(name: str, tenants: list[Tenant], runs: dict[str, Any]) -> str:
    lines = [
        f"### {name}",
        "",
        ", ".join(
            f"`{t.name}`: {t.lanes} lanes, {t.tokens} tokens"
            + (f", weight {t.weight:g}" if t.weight != 1 else "")
            + (f", {t.priority}" if t.priority != "normal" else "")
            for t in tenants
        ),
        "",
        "| run | tenant | token share | fair share | requests | p50 ms | p99 ms | total tokens/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    # A share to meet only where every tenant is backlogged; a quiet tenant's is bounded by its own demand.
    fair = {n: f"{100 * f:.0f} %" for n, f in _fair(tenants).items()} if QUIET[name] is None else {}
    for run_name, r in runs.items():
        for tenant, t in r["tenants"].items():
            lines.append(
                f"| {run_name} | {tenant} | {100 * t['share']:.1f} % | {fair.get(tenant, '–')} | {t['requests']} "
                f"| {t['p50_ms']:.0f} | {t['p99_ms']:.0f} | {r['tokens_per_s']:.0f} |"
            )
    base, queued = runs["without queue"], runs["with queue"]
    ratio = queued["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else float("nan")
    lines += ["", f"Throughput with the queue: {ratio:.2f}x the run without it."]
    quiet = QUIET[name]
    if quiet is not None and "alone" in runs:
        solo = runs["alone"]["tenants"][quiet]["p50_ms"]
        with_q = queued["tenants"][quiet]["p50_ms"]
        without = base["tenants"][quiet]["p50_ms"]
        lines.append(
            f"`{quiet}` p50: {with_q / solo:.2f}x its solo p50 with the queue, {without / solo:.2f}x without it."
        )
    return "\n".join(lines) + "\n"


def report(args: argparse.Namespace, results: dict[str, dict[str, Any]]) -> str:
    head = [
        "# Fairness benchmark",
        "",
        f"Generated by `python -m bench.fairness --seconds {args.seconds:g} --batch {args.batch} "
        f"--token-ms {args.token_ms:g} --jitter {args.jitter:g}`: one simulated engine (a running batch of "
        f"{args.batch}, {args.token_ms:g} ms per generated token, each request's time varied by up to "
        f"{100 * args.jitter:g} %, a first-come queue for the rest) behind the gateway, "
        f"`max_concurrency: {args.batch}` in the runs with the queue. Each run lasts {args.seconds:g} s; the first "
        "second is not counted. A token share counts prompt plus generated tokens, as the queue does.",
        "",
        f"The machine's load average (1 min) was {args.load[0]:.1f} when the runs started and {args.load[1]:.1f} "
        f"when they ended, on {os.cpu_count()} cores: latencies and throughput move with it.",
        "",
        "",
    ]
    return "\n".join(head) + "\n".join(report_one(n, SCENARIOS[n], r) for n, r in results.items())


def cli() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="each run's length (at most 120)")
    parser.add_argument("--batch", type=int, default=4, help="the engine's running batch")
    parser.add_argument("--token-ms", type=float, default=2.0, help="time per generated token")
    parser.add_argument("--jitter", type=float, default=0.1, help="each request's decode time x U(1-j, 1+j)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--markdown", type=Path, help="also write the report here (docs/benchmarks-fairness.md)")
    args = parser.parse_args()
    args.seconds = min(max(args.seconds, 2.0), 120.0)
    args.jitter = min(max(args.jitter, 0.0), 0.9)
    start = os.getloadavg()[0]
    results = asyncio.run(main(args))
    args.load = (start, os.getloadavg()[0])
    if args.markdown:
        args.markdown.write_text(report(args, results))


if __name__ == "__main__":
    cli()
