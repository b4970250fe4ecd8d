"""What the failover loop costs a request answered at its first attempt, against a tenacity loop.

Both sides do the same per-request work and differ only in what drives the attempt: `Run.go` or a
per-request `AsyncRetrying`; `bare` calls `Run.attempt` once with no loop. ``python -m bench.loopcost``;
how to count instructions under callgrind: docs/bench-harness.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from gateway.config import parse_config
from gateway.path.routing import Router
from gateway.resilience.balancer import Selector
from gateway.resilience.failover import Failover, Run
from gateway.resilience.health import Health
from gateway.state import SharedState
from gateway.upstream.plan import Plan, Route
from gateway.upstream.transport import Timeouts
from wire.errors import GatewayError

CONFIG = """
providers:
  alpha: {kind: openai, api_key: sk-alpha, base_url: 'http://127.0.0.1:9/v1'}
models:
  - name: smart
    targets: [{model: alpha/davinci-002}]
"""


async def answer(route: Route, timeouts: Timeouts) -> str:
    return "ok"


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, GatewayError) and exc.retryable


async def _start(failover: Failover, plan: Plan) -> Run[str]:
    """What `Failover.run` does before its loop, for every mode alike."""
    t = plan.policy.timeouts
    total = t.total_ms / 1000
    states = await failover.health.snapshot(plan.keys)
    selector = Selector(plan, states, failover.health, probe_ttl_ms=t.first_byte_ms)
    first = await selector.first()
    run = Run(failover, plan, answer, None, failover.clock() + total, total)
    run.selector, run.route = selector, first
    return run


async def loop(failover: Failover, plan: Plan) -> str:
    run = await _start(failover, plan)
    return (await run.go()).value


def _retrying(failover: Failover, plan: Plan) -> AsyncRetrying:
    r = plan.policy.retries
    return AsyncRetrying(
        stop=stop_after_attempt(r.attempts),
        wait=wait_random_exponential(multiplier=r.initial_backoff_ms / 1000, max=r.max_backoff_ms / 1000),
        retry=retry_if_exception(_retryable),
        sleep=failover.sleep,
        reraise=True,
    )


async def tenacity(failover: Failover, plan: Plan) -> str:
    run = await _start(failover, plan)
    value: str = await _retrying(failover, plan)(run.attempt, run.route, run._timeouts())
    return value


async def tenacity_for(failover: Failover, plan: Plan) -> str:
    """tenacity's other idiom: `async for attempt in AsyncRetrying(...)`, the block in `with attempt`."""
    run = await _start(failover, plan)
    async for attempt in _retrying(failover, plan):
        with attempt:
            return await run.attempt(run.route, run._timeouts())
    raise AssertionError("reraise=True: the last failure is raised, the loop never ends without one")


async def bare(failover: Failover, plan: Plan) -> str:
    run = await _start(failover, plan)
    return await run.attempt(run.route, run._timeouts())


MODES: dict[str, Callable[[Failover, Plan], Awaitable[str]]] = {
    "bare": bare,
    "loop": loop,
    "tenacity": tenacity,
    "tenacity-for": tenacity_for,
}


async def _batch(mode: str, n: int, failover: Failover, plan: Plan) -> float:
    fn = MODES[mode]
    started = time.perf_counter()
    for _ in range(n):
        await fn(failover, plan)
    return (time.perf_counter() - started) / n if n else 0.0


async def main(modes: list[str], n: int, rounds: int) -> None:
    loaded = parse_config(CONFIG, "loopcost.yaml", env={})
    plan = Router(loaded).plan("smart")
    failover = Failover(Health(SharedState(""), loaded.config.cooldown))
    for mode in modes:
        await _batch(mode, 200, failover, plan)  # warm-up: caches, the first plan and route lookups
    per: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(rounds):
        for mode in modes:  # interleaved, so the machine's load drifts over every mode alike
            per[mode].append(await _batch(mode, n, failover, plan))
    if rounds:
        for mode in modes:
            print(f"{mode:12} {statistics.median(per[mode]) * 1e6:7.2f} µs/request (median of {rounds} x {n})")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=[*MODES, "all"], default="all")
    ap.add_argument("-n", type=int, default=5000, help="requests per batch")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved batches per mode")
    args = ap.parse_args()
    chosen = list(MODES) if args.mode == "all" else [args.mode]
    asyncio.run(main(chosen, args.n, args.rounds))
