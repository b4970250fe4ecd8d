"""Redis stopped and restarted (same port, empty) under a running gateway: the configured failure mode.

fail_open keeps serving on per-process limits (which are exact too) and says `degraded` on /ready;
fail_closed answers 503 `rate_limiter_unavailable`. Either way, once Redis is back, limiting goes
through it again and the script is loaded into the new, empty server by itself.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from gateway.limits.ratelimit import SCRIPT
from tests.helpers.clients import body, client
from tests.helpers.identity import bucket
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.waiting import wait_until

CONFIG = """
redis: {{url: "{redis}", on_failure: {mode}}}
keys:
  - {{name: four, key: k-four, limits: {{rpm: 4}}}}
  - {{name: bg, key: k-bg, limits: {{rps: 50}}}}
  - {{name: wide, key: k-wide, limits: {{rpm: 100000}}}}
providers:
  demo: {{kind: fake}}
"""


def burst(gw: GatewayThread, n: int = 5) -> tuple[list[int], float]:
    """`n` requests on the rpm-4 key; their statuses and the slowest one's latency."""
    codes: list[int] = []
    slowest = 0.0
    with client(gw.url, "k-four") as c:
        for _ in range(n):
            start = time.monotonic()
            codes.append(c.post("/v1/completions", json=body("demo/long")).status_code)
            slowest = max(slowest, time.monotonic() - start)
    return codes, slowest


def ready(gw: GatewayThread) -> tuple[int, object]:
    with client(gw.url) as c:
        resp = c.get("/ready")
    return resp.status_code, resp.json()


def back_again(gw: GatewayThread) -> None:
    """Wait until the gateway uses Redis again. A background call that began during the outage may still
    fail for up to its 0.5 s deadline after Redis is back (and mark it down for another second); a
    successful /ready ping clears that."""
    time.sleep(0.6)
    wait_until(lambda: ready(gw) == (200, {"status": "ready", "redis": "ok"}), timeout=10, interval=0.1)


def script_loaded(server: RedisServer) -> bool:
    import hashlib

    with server.client() as r:
        return bool(r.script_exists(hashlib.sha1(SCRIPT.encode()).hexdigest())[0])


def bucket_exists(server: RedisServer) -> bool:
    with server.client() as r:
        return bool(r.exists(bucket("k-four", "rpm")))


class Background:
    """A client that keeps sending while Redis goes away and comes back; it records every status."""

    def __init__(self, gw: GatewayThread) -> None:
        self.gw = gw
        self.codes: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="rl-background", daemon=True)

    def _run(self) -> None:
        with client(self.gw.url, "k-bg") as c:
            while not self.stop.is_set():
                try:
                    self.codes.append(c.post("/v1/completions", json=body("demo/long")).status_code)
                except httpx.HTTPError:
                    self.codes.append(-1)
                time.sleep(0.01)

    def __enter__(self) -> Background:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def test_fail_open_serves_on_local_limits_then_returns_to_redis(redis: RedisServer, tmp_path: Path) -> None:
    cfg = CONFIG.format(redis=redis.url, mode="fail_open")
    with serve_config(tmp_path, cfg) as gw, Background(gw) as bg:
        assert ready(gw) == (200, {"status": "ready", "redis": "ok"})
        codes, _ = burst(gw)
        assert codes == [200] * 4 + [429]
        assert bucket_exists(redis) and script_loaded(redis)

        redis.stop()
        # Per-process limits take over, with the same arithmetic: a fresh bucket of exactly 4.
        codes, slowest = burst(gw)
        assert codes == [200] * 4 + [429]
        assert slowest < 1.0, f"a request waited {slowest:.2f} s on a dead Redis"
        assert ready(gw) == (503, {"status": "degraded", "redis": "unreachable"})

        redis.start()  # same port, nothing in it: no bucket, no script
        assert not script_loaded(redis)
        back_again(gw)
        # Through Redis again: its bucket is empty, so 4 pass, although the local one is spent.
        codes, _ = burst(gw)
        assert codes == [200] * 4 + [429]
        assert bucket_exists(redis) and script_loaded(redis)
    assert bg.codes and set(bg.codes) <= {200, 429}, sorted(set(bg.codes))
    assert bg.codes.count(200) > 10


def test_fail_closed_answers_503_then_limits_resume(redis: RedisServer, tmp_path: Path) -> None:
    cfg = CONFIG.format(redis=redis.url, mode="fail_closed")
    with serve_config(tmp_path, cfg) as gw, Background(gw) as bg:
        codes, _ = burst(gw)
        assert codes == [200] * 4 + [429]

        redis.stop()
        with client(gw.url, "k-four") as c:
            start = time.monotonic()
            resp = c.post("/v1/completions", json=body("demo/long"))
            took = time.monotonic() - start
            pais = c.post("/api/v1/compatibility/openai/v1/completions", json=body("demo/long"))
        message = "Rate limiting is unavailable (Redis unreachable) and the gateway is set to fail closed"
        assert resp.status_code == 503
        assert resp.json() == {
            "error": {"message": message, "type": "server_error", "param": None, "code": "rate_limiter_unavailable"}
        }
        assert (pais.status_code, pais.json()) == (503, {"detail": message})
        assert took < 1.0
        assert ready(gw) == (503, {"status": "degraded", "redis": "unreachable"})

        redis.start()
        back_again(gw)
        codes, _ = burst(gw)
        assert codes == [200] * 4 + [429]
        assert bucket_exists(redis) and script_loaded(redis)
    assert 503 in bg.codes and set(bg.codes) <= {200, 429, 503}, sorted(set(bg.codes))
    # The client after the outage was served again.
    assert bg.codes[-1] == 200


def test_restart_recovers_at_once_whatever_the_pool_size(redis: RedisServer, tmp_path: Path) -> None:
    """Connections pooled before a restart are dead; each must be replaced on use, not fail a request.

    (Without a retry on a dropped connection, every stale pooled connection failed one call, and each
    failure meant a second of `degraded`: 503s for a second per connection the pool had grown to.)
    """
    cfg = CONFIG.format(redis=redis.url, mode="fail_closed")
    with serve_config(tmp_path, cfg) as gw:

        def some(_: int) -> set[int]:
            with client(gw.url, "k-wide") as c:
                return {c.post("/v1/completions", json=body("demo/long")).status_code for _ in range(12)}

        with ThreadPoolExecutor(8) as pool:
            assert set().union(*pool.map(some, range(8))) == {200}
        with redis.client() as r:
            pooled = len(r.client_list()) - 1
        # The limit script has its own connection (gateway/limits/scriptchannel.py); health and usage use the pool.
        assert pooled >= 2, "the script connection and at least one pooled connection should be open"

        redis.restart()
        with client(gw.url, "k-wide") as c:
            codes = [c.post("/v1/completions", json=body("demo/long")).status_code for _ in range(2 * pooled + 4)]
        assert codes == [200] * len(codes)
        assert ready(gw) == (200, {"status": "ready", "redis": "ok"})
