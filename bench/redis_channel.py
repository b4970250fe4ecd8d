"""The rate-limit path's Redis client, measured: the gateway's channel against redis-py's asyncio client.

`python -m bench.redis_channel [--seconds S] [--rounds N]` starts a redis-server on a free loopback port
and drives one acquire (three buckets, as a key with rpm+tpm behind an alias with rps) from C
concurrent tasks in one uvloop event loop, for each client in turn, interleaved round by round, and
prints calls per second, the client process's CPU per call (what a saturated gateway worker pays) and
the redis-server's CPU per call (its INFO: what the Redis a fleet shares pays).
The variants: the gateway's `Limiter` (its channel), redis-py `evalsha` per call (pooled connections,
hiredis parser), and redis-py with the same per-tick batching through a non-transactional pipeline.
Figures and the decision they support are in docs/ratelimits.md ("The Redis channel").
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import redis.asyncio as aioredis
import uvloop

from gateway.limits.ratelimit import SCRIPT, Bucket, Limiter
from gateway.state import SharedState

BUCKETS = [
    Bucket(scope="key:bench", kind="rpm", limit=10**9),
    Bucket(scope="key:bench", kind="tpm", limit=10**12),
    Bucket(scope="model:bench", kind="rps", limit=10**9),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def argv(lease: str) -> list[Any]:
    out: list[Any] = ["acquire", lease]
    for b in BUCKETS:
        out += [b.kind, b.limit, b.period_ms, 10 if b.kind == "tpm" else 1]
    return out


def redis_cpu_s(url: str) -> float:
    """The redis-server's own CPU seconds so far (user + system, its INFO)."""
    with redis.Redis.from_url(url) as r:
        info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def drive(
    call: Callable[[], Awaitable[Any]], concurrency: int, seconds: float, url: str
) -> tuple[float, float, float]:
    """Calls per second, client CPU microseconds per call and the redis-server's CPU microseconds per call."""
    done = 0
    stop = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal done
        while time.monotonic() < stop:
            await call()
            done += 1

    await call()  # connect, load the script
    server = redis_cpu_s(url)
    cpu, wall = time.process_time(), time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    server = redis_cpu_s(url) - server
    return done / wall, cpu / done * 1e6, server / done * 1e6


async def variant(name: str, url: str, concurrency: int, seconds: float) -> tuple[float, float, float]:
    keys = [b.redis_key for b in BUCKETS]
    if name == "channel":
        shared = SharedState(url)
        limiter = Limiter(shared, fail_open=False)
        try:
            return await drive(lambda: limiter.acquire(BUCKETS, 10), concurrency, seconds, url)
        finally:
            await limiter.close()
            await shared.close()
    client = aioredis.Redis.from_url(url, max_connections=concurrency + 1)
    script = client.register_script(SCRIPT)
    try:
        if name == "redis-py":
            return await drive(lambda: script(keys=keys, args=argv("")), concurrency, seconds, url)
        # redis-py with the channel's batching: every call of one loop tick in one pipeline.
        queue: list[asyncio.Future[Any]] = []

        async def flush() -> None:
            batch = queue[:]
            queue.clear()
            pipe = client.pipeline(transaction=False)
            for _ in batch:
                pipe.evalsha(script.sha, len(keys), *keys, *argv(""))
            for fut, res in zip(batch, await pipe.execute(), strict=True):
                fut.set_result(res)

        def call() -> asyncio.Future[Any]:
            fut = asyncio.get_running_loop().create_future()
            queue.append(fut)
            if len(queue) == 1:
                asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(flush()))
            return fut

        return await drive(call, concurrency, seconds, url)
    finally:
        await client.aclose()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    args = ap.parse_args()
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.3)
        url = f"redis://127.0.0.1:{port}/0"
        names = ["channel", "redis-py", "redis-py-batched"]
        results: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
        for _ in range(args.rounds):
            for c in args.concurrency:
                for name in names:
                    results.setdefault((name, c), []).append(uvloop.run(variant(name, url, c, args.seconds)))
        print(f"{'client':18} {'tasks':>5} {'calls/s (median)':>17} {'CPU µs/call':>12} {'Redis µs/call':>14}")
        for c in args.concurrency:
            for name in names:
                rows = results[(name, c)]
                rate = statistics.median(r for r, _, _ in rows)
                cpu = statistics.median(u for _, u, _ in rows)
                server = statistics.median(s for _, _, s in rows)
                print(f"{name:18} {c:5d} {rate:17.0f} {cpu:12.1f} {server:14.1f}")
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
