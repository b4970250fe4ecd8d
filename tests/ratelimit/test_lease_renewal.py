"""A request longer than the concurrency lease TTL keeps its slot, and the count stays exact.

The TTL (`redis.lease_ttl_ms`) only bounds how long a replica that died mid-request holds a slot; a live
request renews its lease every third of it. Here the TTL is 1 s (configured, as an operator would) and a
stream lasts about 4 s, through the gateway under uvicorn, a loopback upstream that streams slowly and
a real redis-server (and, without Redis, the process's own leases). Before renewal, the lease expired a
second into the stream: the key's one slot looked free, a second stream was admitted beside the first,
and the lease count in Redis read zero while a stream was running; the target's shared in-flight count
expired the same way and read -1 once the stream ended.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.faults import CHUNKS, FaultServer, stream
from tests.helpers.identity import bucket
from tests.helpers.redis import RedisServer
from tests.helpers.servers import serve_config
from tests.helpers.waiting import wait_until

KEY = bucket("k-one", "concurrent")
# The target's in-flight count, shared by every replica; the target goes by its server (`up@<URL hash>`).
INFLIGHT = "gw:{up@*/davinci-002}:in"
TTL_MS = 1_000
BODY = {"model": "busy", "prompt": "Say this is a test", "max_tokens": 7, "stream": True}
AUTH = {"authorization": "Bearer k-one"}


def inflight(rds: RedisServer) -> int | None:
    with rds.client() as r:
        found = r.keys(INFLIGHT)
        assert len(found) <= 1, found
        value = r.get(found[0]) if found else None
        return None if value is None else int(value)


def live_leases(rds: RedisServer) -> int:
    with rds.client() as r:
        sec, usec = r.time()
        now = int(sec) * 1000 + int(usec) // 1000
        return int(r.zcount(KEY, f"({now}", "+inf"))


@pytest.mark.parametrize("shared", [True, False], ids=["redis", "in-process"])
def test_a_stream_longer_than_the_lease_ttl_keeps_its_slot(
    shared: bool, rds: RedisServer, faults: FaultServer, tmp_path: Path
) -> None:
    faults["up"].script(stream(gap=0.25))  # 16 events a quarter second apart: about 4 s, four TTLs
    config = (
        (f"redis: {{url: '{rds.url}', lease_ttl_ms: {TTL_MS}}}\n" if shared else f"redis: {{lease_ttl_ms: {TTL_MS}}}\n")
        + "keys:\n  - {name: one, key: k-one, limits: {concurrent: 1}}\n"
        # least-busy: the gateway counts the target's requests in flight, in Redis when it has one
        + "models:\n  - {name: busy, strategy: least-busy, targets: [{model: up/davinci-002}]}\n"
        + f"providers:\n  up: {{kind: openai, api_key: sk-up, base_url: '{faults['up'].base_url}'}}\n"
    )
    answers: list[httpx.Response] = []
    with serve_config(tmp_path, config) as gw, httpx.Client(trust_env=False, timeout=30) as c:
        long = threading.Thread(
            target=lambda: answers.append(c.post(gw.url + "/v1/completions", json=BODY, headers=AUTH))
        )
        long.start()
        try:
            wait_until(lambda: faults["up"].count == 1, timeout=10)
            started = time.monotonic()
            while time.monotonic() - started < 3 * TTL_MS / 1000:  # three TTLs into the stream
                if shared:
                    assert (live_leases(rds), inflight(rds)) == (1, 1)
                time.sleep(0.1)
            # The slot is still taken: a second stream is refused, and never reaches the upstream.
            second = c.post(gw.url + "/v1/completions", json=BODY, headers=AUTH)
            assert second.status_code == 429, second.text
            assert faults["up"].count == 1
        finally:
            long.join(30)
        (first,) = answers
        assert first.status_code == 200 and first.text.count("data: {") == len(CHUNKS)
        # Released when the stream ended; the slot serves the next request.
        if shared:
            wait_until(lambda: live_leases(rds) == 0, timeout=5)
            assert inflight(rds) == 0  # not -1: the count did not expire under the stream
        faults["up"].script(stream())
        third = c.post(gw.url + "/v1/completions", json=BODY, headers=AUTH)
        assert third.status_code == 200, third.text


def test_a_lease_a_restarted_redis_lost_is_written_again_while_its_stream_runs(
    redis: RedisServer, faults: FaultServer, tmp_path: Path
) -> None:
    """Redis restarts (nothing kept) under a running stream, with the default TTL of ten minutes: the lease
    is back in Redis about a second later (the restart drops the limiter's connection, which renews its
    leases as soon as Redis answers), so a second stream of the key is refused while the first runs.
    Before, the restarted Redis counted no lease for the stream until it ended: the key's one slot looked
    free, and every replica admitted a second stream beside it."""
    faults["up"].script(stream(gap=0.3))  # about 5 s
    config = (
        f"redis: {{url: '{redis.url}'}}\n"
        + "keys:\n  - {name: one, key: k-one, limits: {concurrent: 1}}\n"
        + f"providers:\n  up: {{kind: openai, api_key: sk-up, base_url: '{faults['up'].base_url}'}}\n"
    )
    body = {**BODY, "model": "up/davinci-002"}
    answers: list[httpx.Response] = []
    with serve_config(tmp_path, config) as gw, httpx.Client(trust_env=False, timeout=30) as c:
        long = threading.Thread(
            target=lambda: answers.append(c.post(gw.url + "/v1/completions", json=body, headers=AUTH))
        )
        long.start()
        try:
            wait_until(lambda: faults["up"].count == 1 and live_leases(redis) == 1, timeout=10)
            redis.restart()
            wait_until(lambda: live_leases(redis) == 1, timeout=3)
            second = c.post(gw.url + "/v1/completions", json=body, headers=AUTH)
            assert second.status_code == 429, second.text
            assert faults["up"].count == 1
        finally:
            long.join(30)
        (first,) = answers
        assert first.status_code == 200 and first.text.count("data: {") == len(CHUNKS)
        wait_until(lambda: live_leases(redis) == 0, timeout=5)  # released at its end, not left behind


def test_the_in_flight_count_a_restarted_redis_lost_does_not_go_below_zero(
    redis: RedisServer, faults: FaultServer, tmp_path: Path
) -> None:
    """Redis restarts (nothing kept) under a running stream of a least-busy alias: the stream's end takes the
    target's shared in-flight count down from a count that lost its increment, and it stays at zero, so the
    next stream counts one while it runs. Before, the count read -1 after the stream, and 0 during the next
    one: every replica saw the target one request emptier than it was until the key expired."""
    faults["up"].script(stream(gap=0.2))  # about 3 s
    config = (
        f"redis: {{url: '{redis.url}'}}\n"
        + "models:\n  - {name: busy, strategy: least-busy, targets: [{model: up/davinci-002}]}\n"
        + f"providers:\n  up: {{kind: openai, api_key: sk-up, base_url: '{faults['up'].base_url}'}}\n"
    )
    with serve_config(tmp_path, config) as gw, httpx.Client(trust_env=False, timeout=30) as c:
        answers: list[httpx.Response] = []
        long = threading.Thread(target=lambda: answers.append(c.post(gw.url + "/v1/completions", json=BODY)))
        long.start()
        try:
            wait_until(lambda: faults["up"].count == 1 and inflight(redis) == 1, timeout=10)
            redis.restart()
        finally:
            long.join(30)
        (first,) = answers
        assert first.status_code == 200 and first.text.count("data: {") == len(CHUNKS)
        wait_until(lambda: inflight(redis) is not None, timeout=5)  # the stream's end reached Redis
        assert inflight(redis) == 0
        faults["up"].script(stream(gap=0.2))
        second = threading.Thread(target=lambda: answers.append(c.post(gw.url + "/v1/completions", json=BODY)))
        second.start()
        try:
            wait_until(lambda: faults["up"].count == 2, timeout=10)
            wait_until(lambda: inflight(redis) == 1, timeout=3)
        finally:
            second.join(30)
        wait_until(lambda: inflight(redis) == 0, timeout=5)
