"""``python -m bench.cache``: the response cache's rows: cached throughput, and coalescing.

Two measurements, each against real processes on loopback (``python -m gateway serve``, one worker):

- **cached_c32**: the bench's request at ``--connections`` (32) closed-loop connections for ``--seconds``,
  through a gateway with the cache off (every request goes to the Python loopback upstream,
  ``bench.upstream.server``) and through one with ``cache: {mode: always}`` (after the first request,
  every answer is a hit). The ratio is the figure: a hit must answer at least twice as fast.
- **coalesce_100**: 100 identical requests sent at once to a gateway with the cache on, in front of an
  upstream that takes ``--latency-ms`` per answer; the upstream's own count of requests received
  (``GET /count`` on this module's counting upstream) must be exactly 1.

The load generator is aiohttp on uvloop in this process (wrk cannot be assumed here), so the absolute
rates are lower than the wrk rows of ``python -m bench``; both targets carry the same client cost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import uvloop
import yaml
from aiohttp import web

from bench import processes
from bench.configs import child_env, gateway_config
from bench.scenarios import BODY, LOADGEN_CPU, TARGET_CPU
from bench.upstream import COMPLETION_BODY

HEADERS = {"Content-Type": "application/json"}


async def _closed_loop(url: str, body: bytes, connections: int, seconds: float) -> tuple[int, int, float]:
    """(answers, errors, seconds): `connections` clients sending back to back for `seconds`."""
    ok = errors = 0
    stop = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client() -> None:
            nonlocal ok, errors
            while time.perf_counter() < stop:
                async with session.post(url, data=body, headers=HEADERS) as resp:
                    await resp.read()
                    if resp.status == 200:
                        ok += 1
                    else:
                        errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(connections)))
        return ok, errors, time.perf_counter() - started


def _gateway(upstream_port: int, cache: bool, work: Path, name: str) -> processes.Service:
    port = processes.free_port()
    config: dict[str, Any] = gateway_config(upstream_port, port, None)
    config["logging"] = {"requests": False}
    if cache:
        config["cache"] = {"mode": "always"}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", str(port)]
    return processes.start(name, argv, port, work, timeout=45.0, env=child_env())


def cached_c32(connections: int, seconds: float, work: Path) -> dict[str, Any]:
    port = processes.free_port()
    argv = [sys.executable, "-m", "bench.upstream.server", "--port", str(port)]
    upstream = processes.start("cache-upstream", argv, port, work)
    split = (os.cpu_count() or 1) >= 2
    if split:
        # As the wrk rows place them: the gateway alone on core 0, the load and the upstream on core 1.
        os.sched_setaffinity(0, {LOADGEN_CPU})
        upstream.pin(LOADGEN_CPU)
    out: dict[str, Any] = {"placement": "split" if split else "shared"}
    try:
        for name, cache in (("gateway", False), ("gateway+cache", True)):
            gw = _gateway(port, cache, work, name.replace("+", "-"))
            if split:
                gw.pin(TARGET_CPU)
            try:
                url = gw.base_url + "/v1/completions"
                uvloop.run(_closed_loop(url, BODY, connections, 1.0))  # warm-up (and the one miss)
                cpu0 = _cpu(gw)
                ok, errors, took = uvloop.run(_closed_loop(url, BODY, connections, seconds))
                cpu = _cpu(gw) - cpu0
                out[name] = {
                    "rps": round(ok / took, 1),
                    "requests": ok,
                    "errors": errors,
                    "cpu_s_per_1k": round(1000 * cpu / ok, 4) if ok else None,
                }
            finally:
                gw.stop()
    finally:
        upstream.stop()
    out["ratio"] = round(out["gateway+cache"]["rps"] / out["gateway"]["rps"], 2)
    # The gateway's CPU per answer: the throughput ratio when the gateway, not this Python load
    # generator, is what saturates (wrk's rows in `python -m bench`).
    cached_cpu, plain_cpu = out["gateway+cache"]["cpu_s_per_1k"], out["gateway"]["cpu_s_per_1k"]
    out["cpu_ratio"] = round(plain_cpu / cached_cpu, 2) if cached_cpu and plain_cpu else None
    return out


def _cpu(service: processes.Service) -> float:
    return service.cpu_seconds()


class _Counting:
    """A loopback upstream that answers the bench's completion after a delay and counts what it got."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s
        self.count = 0

    async def completions(self, request: web.Request) -> web.Response:
        await request.read()
        self.count += 1
        await asyncio.sleep(self.latency_s)
        return web.Response(body=COMPLETION_BODY, content_type="application/json")

    async def counted(self, request: web.Request) -> web.Response:
        return web.json_response({"count": self.count})


async def _coalesce(latency_s: float, work: Path, requests: int) -> dict[str, Any]:
    counting = _Counting(latency_s)
    app = web.Application()
    app.router.add_post("/v1/completions", counting.completions)
    app.router.add_get("/count", counting.counted)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = processes.free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    loop = asyncio.get_running_loop()
    gw = await loop.run_in_executor(None, _gateway, port, True, work, "gateway-coalesce")
    try:
        url = gw.base_url + "/v1/completions"
        body = msgspec.json.encode({**msgspec.json.decode(BODY), "prompt": f"coalesce {time.time_ns()}"})
        connector = aiohttp.TCPConnector(limit=requests)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def one() -> tuple[int, str]:
                async with session.post(url, data=body, headers=HEADERS) as resp:
                    await resp.read()
                    return resp.status, resp.headers.get("x-gateway-cache", "")

            answers = await asyncio.gather(*(one() for _ in range(requests)))
    finally:
        await loop.run_in_executor(None, gw.stop)
        await runner.cleanup()
    states: dict[str, int] = {}
    for _, state in answers:
        states[state] = states.get(state, 0) + 1
    return {
        "requests": requests,
        "ok": sum(1 for status, _ in answers if status == 200),
        "upstream_calls": counting.count,
        "x_gateway_cache": states,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cache", description=__doc__)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--latency-ms", type=float, default=200.0, help="the counting upstream's delay")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as temp:
        work = Path(temp)
        results = {
            "cached_c32": cached_c32(args.connections, args.seconds, work),
            "coalesce_100": uvloop.run(_coalesce(args.latency_ms / 1000, work, 100)),
        }
    text = msgspec.json.format(msgspec.json.encode(results)).decode()
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    c, co = results["cached_c32"], results["coalesce_100"]
    fast = max(c["ratio"], c["cpu_ratio"] or 0) >= 2
    return 0 if fast and co["upstream_calls"] == 1 and co["ok"] == co["requests"] else 1


if __name__ == "__main__":
    sys.exit(main())
