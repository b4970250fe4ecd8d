"""Concurrency leases survive a Redis stall without leaking (issue 11, item 4).

A real `redis-server` on a free port is frozen with SIGSTOP while requests holding `concurrent` leases
are in flight through the gateway (uvicorn in a thread, real sockets, slow loopback upstreams), then
thawed with SIGCONT. Redis then runs every script call that was already sent to it, including the
acquires the gateway gave up on after their deadline. Before the fix those late acquires wrote leases
that nobody released: the scope stayed short of slots for the lease TTL (ten minutes). Now every lease
whose fate Redis did not confirm is cancelled by id once Redis answers again, and the cancel leaves a
marker that stops a late acquire from writing it.

Every test thaws and stops its redis-server in a `finally`, whatever happens.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.helpers.clients import client
from tests.helpers.faults import FaultServer, good, slow
from tests.helpers.identity import bucket
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.waiting import wait_until

MODEL = "davinci-002"
KEY = bucket("k-lim", "concurrent")


def config(redis: RedisServer, faults: FaultServer, mode: str, limit: int, targets: tuple[str, ...]) -> str:
    lines = [
        f'redis: {{url: "{redis.url}", on_failure: {mode}}}',
        "retries: {attempts: 1}",
        "keys:",
        f"  - {{name: lim, key: k-lim, limits: {{concurrent: {limit}}}}}",
        "providers:",
    ]
    for name in targets:
        lines.append(f"  {name}: {{kind: openai, api_key: sk-{name}, base_url: {faults[name].base_url}}}")
    return "\n".join(lines) + "\n"


def thaw(server: RedisServer) -> None:
    if server.proc is not None and server.proc.poll() is None:
        os.kill(server.proc.pid, signal.SIGCONT)


@contextmanager
def stalled(server: RedisServer) -> Iterator[None]:
    """Redis frozen: connections are accepted by the kernel and commands pile up unread until SIGCONT."""
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        thaw(server)


def live_leases(server: RedisServer) -> int:
    """Leases in the scope's sorted set that have not expired, on Redis's own clock."""
    with server.client() as r:
        sec, usec = r.time()
        now = int(sec) * 1000 + int(usec) // 1000
        return int(r.zcount(KEY, f"({now}", "+inf"))


def post(gw: GatewayThread, provider: str) -> int:
    with client(gw.url, "k-lim", timeout=20) as c:
        body = {"model": f"{provider}/{MODEL}", "prompt": "Say this is a test", "max_tokens": 7}
        try:
            return c.post("/v1/completions", json=body).status_code
        except httpx.HTTPError:
            return -1


def redis_answers(gw: GatewayThread) -> bool:
    with client(gw.url) as c:
        return bool(c.get("/ready").json() == {"status": "ready", "redis": "ok"})


def warm(gw: GatewayThread, faults: FaultServer, server: RedisServer) -> None:
    """One request through the limiter before the stall, as on any gateway that has been serving: the
    script channel is open and Redis knows the script (a first EVALSHA would only get NOSCRIPT)."""
    faults["warm"].script(then=good())
    assert post(gw, "warm") == 200
    wait_until(lambda: live_leases(server) == 0, timeout=5)


def full_burst(gw: GatewayThread, faults: FaultServer, pool: ThreadPoolExecutor, limit: int) -> None:
    """`limit` requests in flight at once are all admitted through Redis, and one more is refused."""
    faults["burst"].script(then=slow(1.5))
    held = [pool.submit(post, gw, "burst") for _ in range(limit)]
    wait_until(lambda: faults["burst"].count == limit or any(f.done() for f in held), timeout=10)
    extra = post(gw, "burst")
    assert [f.result() for f in held] == [200] * limit, "a leaked lease refused a request of the burst"
    assert extra == 429, "the burst over the limit must be refused: Redis is enforcing the limit again"


def test_fail_open_leases_taken_during_a_stall_are_gone_once_redis_answers(
    redis: RedisServer, faults: FaultServer, tmp_path: Path
) -> None:
    limit = 5
    faults["pre"].script(then=slow(1.0))  # admitted through Redis, ends during the stall
    faults["short"].script(then=slow(0.2))  # admitted on local state, ends during the stall
    faults["long"].script(then=slow(2.5))  # admitted on local state, ends after Redis is back
    cfg = config(redis, faults, "fail_open", limit, ("warm", "pre", "short", "long", "burst"))
    with serve_config(tmp_path, cfg) as gw, ThreadPoolExecutor(16) as pool:
        assert redis_answers(gw)
        warm(gw, faults, redis)
        pre = pool.submit(post, gw, "pre")
        wait_until(lambda: faults["pre"].count == 1, timeout=10)
        assert live_leases(redis) == 1
        inflight: list[Future[int]] = []
        with stalled(redis):
            inflight += [pool.submit(post, gw, "short") for _ in range(2)]
            inflight += [pool.submit(post, gw, "long") for _ in range(2)]
            wait_until(lambda: pre.done() and all(f.done() for f in inflight[:2]), timeout=10)
            time.sleep(0.3)
        assert [pre.result(), *(f.result() for f in inflight)] == [200] * 5, "fail_open serves during the stall"
        # Within a short bound after the last request ended, Redis holds no lease any more.
        wait_until(lambda: live_leases(redis) == 0, timeout=5, interval=0.05)
        wait_until(lambda: redis_answers(gw), timeout=5, interval=0.1)
        full_burst(gw, faults, pool, limit)
        wait_until(lambda: live_leases(redis) == 0, timeout=5, interval=0.05)


def test_fail_closed_refusals_during_a_stall_leave_no_lease(
    redis: RedisServer, faults: FaultServer, tmp_path: Path
) -> None:
    limit = 3
    cfg = config(redis, faults, "fail_closed", limit, ("warm", "burst"))
    with serve_config(tmp_path, cfg) as gw, ThreadPoolExecutor(8) as pool:
        assert redis_answers(gw)
        warm(gw, faults, redis)
        with stalled(redis):
            refused = [pool.submit(post, gw, "burst") for _ in range(limit)]
            assert [f.result() for f in refused] == [503] * limit
        assert faults["burst"].count == 0
        wait_until(lambda: live_leases(redis) == 0, timeout=5, interval=0.05)
        wait_until(lambda: redis_answers(gw), timeout=5, interval=0.1)
        full_burst(gw, faults, pool, limit)


def test_local_leases_of_an_outage_are_released_even_when_redis_answers_the_release(
    redis: RedisServer, faults: FaultServer, tmp_path: Path
) -> None:
    """Requests admitted on per-process limits during one stall and ending after it must free their
    per-process slots too, or the next stall starts with those slots taken."""
    limit = 2
    faults["long"].script(then=slow(2.0))
    faults["short"].script(then=good())
    cfg = config(redis, faults, "fail_open", limit, ("warm", "long", "short", "burst"))
    with serve_config(tmp_path, cfg) as gw, ThreadPoolExecutor(8) as pool:
        assert redis_answers(gw)
        warm(gw, faults, redis)
        with stalled(redis):
            first = [pool.submit(post, gw, "long") for _ in range(limit)]
            wait_until(lambda: faults["long"].count == limit, timeout=10)
        assert [f.result() for f in first] == [200] * limit
        wait_until(lambda: live_leases(redis) == 0, timeout=5, interval=0.05)
        wait_until(lambda: redis_answers(gw), timeout=5, interval=0.1)
        with stalled(redis):
            second = [pool.submit(post, gw, "short") for _ in range(limit)]
            codes = [f.result() for f in second]
        assert codes == [200] * limit, "the per-process limiter still counted the first stall's requests"
        wait_until(lambda: live_leases(redis) == 0, timeout=5, interval=0.05)


def test_a_client_that_hangs_up_during_the_stall_leaves_no_lease(
    redis: RedisServer, faults: FaultServer, tmp_path: Path
) -> None:
    """The request is gone while its acquire is still on the wire; Redis grants it when it resumes."""
    limit = 3
    faults["gone"].script(then=slow(3.0))
    cfg = config(redis, faults, "fail_open", limit, ("warm", "gone", "burst"))
    with serve_config(tmp_path, cfg) as gw, ThreadPoolExecutor(8) as pool:
        assert redis_answers(gw)
        warm(gw, faults, redis)
        body = {"model": f"gone/{MODEL}", "prompt": "Say this is a test", "max_tokens": 7}
        with stalled(redis):
            for _ in range(limit):
                with client(gw.url, "k-lim", timeout=0.2) as c, pytest.raises(httpx.TimeoutException):
                    c.post("/v1/completions", json=body)
            time.sleep(1.0)
        wait_until(lambda: live_leases(redis) == 0, timeout=8, interval=0.05)
        wait_until(lambda: redis_answers(gw), timeout=5, interval=0.1)
        full_burst(gw, faults, pool, limit)
