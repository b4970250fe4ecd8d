"""The fleet benchmark: loopback engine simulators behind the gateway, per routing policy and workload.

`python -m bench.fleet [--replicas 4] [--requests 240] [--concurrency 24]` starts N simulated engines, each
with a prefix cache (an LRU of prompt blocks: time to first token grows with the prompt's uncached blocks),
a bounded running batch and a waiting queue exposed as vLLM's `/metrics`; then, for each policy, a gateway
in front of them, driven by three workloads (few-shot evaluation over a few long shared prefixes, multi-turn
sessions, random prompts). It prints throughput and time-to-first-token p50/p99 per policy against round
robin; `--markdown docs/benchmarks-fleet.md` writes the report that file holds.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

BLOCK = 256  # characters per cached block, as the engine's prefix cache sees them
PREFILL_MS_PER_BLOCK = 24.0  # an uncached block's prefill
CACHED_MS_PER_BLOCK = 0.5
DECODE_MS = 20.0  # the rest of the answer after its first token
CACHE_BLOCKS = 80  # each engine's prefix cache, in blocks: less than what all sessions or all few-shot prefixes need
BATCH = 4  # requests running at once per engine; more wait


class Engine:
    def __init__(self) -> None:
        self.cache: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self.slots = asyncio.Semaphore(BATCH)
        self.waiting = 0
        self.running = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]

    def prefill_ms(self, prompt: str) -> float:
        h = hashlib.blake2b(digest_size=8)
        ms = 0.0
        for i in range(0, max(len(prompt), 1), BLOCK):
            h.update(prompt[i : i + BLOCK].encode())
            key = h.digest()
            if key in self.cache:
                self.cache.move_to_end(key)
                ms += CACHED_MS_PER_BLOCK
            else:
                self.cache[key] = None
                if len(self.cache) > CACHE_BLOCKS:
                    self.cache.popitem(last=False)
                ms += PREFILL_MS_PER_BLOCK
        return ms

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.waiting += 1
        async with self.slots:
            self.waiting -= 1
            self.running += 1
            try:
                await asyncio.sleep(self.prefill_ms(body["prompt"]) / 1000)
                resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
                await resp.prepare(request)
                chunk = {"id": "c", "object": "text_completion", "created": 1, "model": "m"}
                chunk["choices"] = [{"index": 0, "text": "x", "logprobs": None, "finish_reason": None}]
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                await asyncio.sleep(DECODE_MS / 1000)
                chunk["choices"] = [{"index": 0, "text": "y", "logprobs": None, "finish_reason": "stop"}]
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n")
                await resp.write_eof()
                return resp
            finally:
                self.running -= 1

    async def metrics(self, request: web.Request) -> web.Response:
        text = f"vllm:num_requests_waiting {self.waiting}\nvllm:num_requests_running {self.running}\n"
        return web.Response(text=text)

    async def start(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/metrics", self.metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.SockSite(runner, self.sock).start()
        return runner


Lane = list[tuple[str, dict[str, str]]]  # requests one client sends one after the other


def workload(kind: str, n: int, lanes: int, rng: random.Random) -> list[Lane]:
    """The requests of one workload, as `lanes` clients send them (a session's turns wait for each other)."""

    def text(chars: str, length: int) -> str:
        return "".join(rng.choice(chars) for _ in range(length))

    if kind == "multi-turn":
        out: list[Lane] = []
        for s in range(lanes):
            history = text("klmnopqrst ", BLOCK * 6)
            lane: Lane = []
            for turn in range(n // lanes):
                history += f" turn {turn}: " + text("uvwxyz ", BLOCK // 2)
                lane.append((history, {"x-session-id": f"s{s}"}))
            out.append(lane)
        return out
    if kind == "few-shot":
        shots = [text("abcdefghij ", BLOCK * 12) for _ in range(12)]
        items: Lane = [(rng.choice(shots) + f" Q{i}?", {}) for i in range(n)]
    else:
        items = [(text("abcdefghijklmnopqrstuvwxyz ", BLOCK * 6), {}) for _ in range(n)]
    return [items[i::lanes] for i in range(lanes)]


async def drive(url: str, lanes: list[Lane]) -> tuple[float, list[float]]:
    ttfts: list[float] = []
    async with httpx.AsyncClient(trust_env=False, timeout=60, limits=httpx.Limits(max_connections=256)) as c:

        async def client(lane: Lane) -> None:
            for prompt, headers in lane:
                started = time.perf_counter()
                body = {"model": "engine/m", "prompt": prompt, "stream": True, "max_tokens": 2}
                async with c.stream("POST", url + "/v1/completions", json=body, headers=headers) as r:
                    first = True
                    async for _ in r.aiter_bytes():
                        if first:
                            ttfts.append((time.perf_counter() - started) * 1000)
                            first = False

        started = time.perf_counter()
        await asyncio.gather(*(client(lane) for lane in lanes))
    return sum(len(lane) for lane in lanes) / (time.perf_counter() - started), ttfts


def serve(config: str) -> tuple[str, Callable[[], None]]:
    """`python -m gateway serve` on the config, as a child process (its own interpreter, not this one's GIL)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    folder = tempfile.mkdtemp(prefix="bench-fleet-")
    path = os.path.join(folder, "fleet.yaml")
    with open(path, "w") as f:
        f.write(config)
    env = {k: v for k, v in os.environ.items() if "PROXY" not in k.upper()}
    cmd = [sys.executable, "-m", "gateway", "serve", "--config", path, "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(url + "/health", trust_env=False, timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the gateway did not start")
        time.sleep(0.05)

    def stop() -> None:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)

    return url, stop


async def run_one(args: argparse.Namespace, kind: str, policy: str) -> tuple[float, list[float]]:
    """One workload through a fresh gateway in front of fresh (cold) engines."""
    engines = [Engine() for _ in range(args.replicas)]
    runners = [await e.start() for e in engines]
    listed = ", ".join(f"http://127.0.0.1:{e.port}/v1" for e in engines)
    config = (
        "server: {host: 127.0.0.1}\nlogging: {requests: false}\nretries: {attempts: 1}\n"
        "providers:\n  engine:\n    kind: vllm\n    discover: false\n"
        f"    replicas: [{listed}]\n    routing: {{policy: {policy}, epsilon: {args.epsilon}}}\n"
    )
    url, stop = serve(config)
    try:
        return await drive(url, workload(kind, args.requests, args.concurrency, random.Random(7)))
    finally:
        stop()
        for r in runners:
            await r.cleanup()


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every policy on every workload, `--repeat` times interleaved (the machine's load drifts); the median
    run's throughput, and TTFT percentiles over all runs' requests."""
    rates: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    ttfts: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for _ in range(args.repeat):
        for kind in args.workloads.split(","):
            for policy in args.policies.split(","):
                rate, times = await run_one(args, kind, policy)
                rates[kind, policy].append(rate)
                ttfts[kind, policy].extend(times)
    rows: list[dict[str, Any]] = []
    for (kind, policy), runs in rates.items():
        times = sorted(ttfts[kind, policy])
        rows.append(
            {
                "workload": kind,
                "policy": policy,
                "rps": statistics.median(runs),
                "p50": statistics.median(times),
                "p99": times[min(len(times) - 1, int(len(times) * 0.99))],
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    base = {r["workload"]: r["rps"] for r in rows if r["policy"] == "round_robin"}
    base = {r["workload"]: base.get(r["workload"], r["rps"]) for r in rows}
    out = [
        "| workload | policy | req/s | vs round robin | TTFT p50 ms | TTFT p99 ms |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        ratio = r["rps"] / base[r["workload"]]
        out.append(
            f"| {r['workload']} | {r['policy']} | {r['rps']:.1f} | {ratio:.2f}x | {r['p50']:.0f} | {r['p99']:.0f} |"
        )
    return "\n".join(out)


REPORT = """# Fleet routing benchmark

Generated by `{command}` on {date}. `make bench` does not run it and does not rewrite this file.

{replicas} loopback engine simulators behind the gateway (the gateway a child process, as `python -m gateway
serve` runs it). Each simulated engine has a prefix cache (an LRU of {cache_blocks} blocks of {block} characters;
an uncached block costs {prefill:g} ms of prefill, a cached one {cached:g} ms), a running batch of {batch} (more
requests wait, and `/metrics` reports them as vLLM's `vllm:num_requests_waiting`), and {decode:g} ms from first
token to the end of the answer; every request is streamed, and time to first token is measured by the client.
{concurrency} clients send {requests} requests per run in three workloads: few-shot evaluation (shared prefixes
of many blocks, a short question each; together more than one engine's cache holds), multi-turn sessions
(`x-session-id` set, a session's turns one after the other, each turn growing the conversation) and random
prompts (nothing shared). Every policy on every workload, {repeat} interleaved runs each on fresh engines;
throughput is the median run, TTFT percentiles are over all runs' requests. On a 2-core machine shared
with other work, differences under about 5 % are noise.

{table}

What the affinity policies buy here: {summary}. docs/fleets.md says what each policy does.
"""


def report(args: argparse.Namespace, rows: list[dict[str, Any]]) -> str:
    """docs/benchmarks-fleet.md: the method, this run's table and its ratios, in one file of its own."""
    rps = {(r["workload"], r["policy"]): r["rps"] for r in rows}
    gains = [
        f"`{policy}` {rps[kind, policy] / rps[kind, 'round_robin']:.2f}x round robin on {kind}"
        for kind in args.workloads.split(",")
        for policy in ("prefix", "session")
        if (kind, policy) in rps and (kind, "round_robin") in rps
    ]
    return REPORT.format(
        command=" ".join(["python -m bench.fleet", *sys.argv[1:]]),
        date=time.strftime("%Y-%m-%d", time.gmtime()),
        replicas=args.replicas,
        cache_blocks=CACHE_BLOCKS,
        block=BLOCK,
        prefill=PREFILL_MS_PER_BLOCK,
        cached=CACHED_MS_PER_BLOCK,
        batch=BATCH,
        decode=DECODE_MS,
        concurrency=args.concurrency,
        requests=args.requests,
        repeat=args.repeat,
        table=table(rows),
        summary="; ".join(gains) or "no affinity policy was run",
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=3, help="runs per policy and workload (median)")
    parser.add_argument("--epsilon", type=float, default=0.25, help="routing.epsilon of the bounded loads")
    parser.add_argument("--workloads", default="few-shot,multi-turn,random")
    parser.add_argument("--policies", default="round_robin,least_outstanding,prefix,session")
    parser.add_argument("--markdown", type=Path, help="also write the report here (docs/benchmarks-fleet.md)")
    args = parser.parse_args()
    rows = asyncio.run(main(args))
    print(table(rows))
    if args.markdown:
        args.markdown.write_text(report(args, rows))
