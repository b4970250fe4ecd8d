"""Cancelling (and renewing) a concurrency lease by id, in the script itself, against a real redis-server.

A lease whose acquire went unanswered (Redis stalled, the connection dropped) may be written by that
acquire at any later moment, even after the request ended. `cancel` removes it if it is there and
leaves a marker (the id scored by minus its expiry) so that the acquire, run later, writes nothing.
Markers never count as slots, expire on Redis's clock like leases, and cancelling is idempotent.
"""

from __future__ import annotations

import uuid

import redis

from gateway.limits.ratelimit import SCRIPT, Bucket, Limiter
from tests.helpers.redis import RedisServer


def call(r: redis.Redis, mode: str, lease: str, key: str, limit: int = 2) -> list[int]:
    cost = "1" if mode == "acquire" else "0"
    out: list[int] = r.eval(SCRIPT, 1, key, mode, lease, "concurrent", str(limit), "0", cost)
    return out


def key() -> str:
    return "rl:{test:" + uuid.uuid4().hex[:12] + "}:concurrent"


def live(r: redis.Redis, k: str) -> set[str]:
    sec, usec = r.time()
    now = int(sec) * 1000 + int(usec) // 1000
    return {str(m) for m in r.zrangebyscore(k, f"({now}", "+inf")}


def test_a_cancel_before_the_late_acquire_leaves_nothing_behind(rds: RedisServer) -> None:
    with rds.client() as r:
        k = key()
        assert call(r, "cancel", "late", k) == [1, 0, 0, 0]
        # The acquire that sat unread in a dropped connection runs now: refused, nothing written.
        assert call(r, "acquire", "late", k)[0] == 0
        assert live(r, k) == set()
        # Other requests are not affected by the marker: the full limit is free.
        assert call(r, "acquire", "a", k)[:3] == [1, 0, 1]
        assert call(r, "acquire", "b", k)[:3] == [1, 0, 0]
        assert call(r, "acquire", "c", k)[0] == 0
        assert live(r, k) == {"a", "b"}


def test_a_cancel_after_the_late_acquire_frees_the_slot(rds: RedisServer) -> None:
    with rds.client() as r:
        k = key()
        assert call(r, "acquire", "late", k)[0] == 1
        assert call(r, "cancel", "late", k)[0] == 1
        assert call(r, "cancel", "late", k)[0] == 1  # idempotent
        assert live(r, k) == set()
        assert [call(r, "acquire", name, k)[0] for name in ("a", "b", "c")] == [1, 1, 0]


def test_markers_expire_with_the_lease_ttl_and_are_swept(rds: RedisServer) -> None:
    with rds.client() as r:
        k = key()
        call(r, "cancel", "gone", k)
        (marker,) = r.zrange(k, 0, -1, withscores=True)
        sec, usec = r.time()
        now = int(sec) * 1000 + int(usec) // 1000
        assert marker[0] == "gone" and -now - 600_000 <= marker[1] <= -now - 599_000
        assert 599_000 < r.pttl(k) <= 600_000
        # A marker whose time is up (rewritten here as if ten minutes had passed) no longer stops its id,
        # and the next cancel sweeps it (ids are never reused; this only shows that markers expire).
        r.zadd(k, {"gone": -(now - 1)})
        assert call(r, "acquire", "other", k)[0] == 1
        assert call(r, "cancel", "another", k)[0] == 1
        assert r.zscore(k, "gone") is None
        assert call(r, "acquire", "gone", k)[0] == 1
        assert live(r, k) == {"other", "gone"}


async def test_peek_and_release_ignore_markers(limiter: Limiter, rds: RedisServer) -> None:
    b = Bucket("test:" + uuid.uuid4().hex[:12], "concurrent", 3)
    d = await limiter.acquire([b], 0)
    assert d.allowed
    with rds.client() as r:
        call(r, "cancel", "someone-else", b.redis_key, 3)
        assert r.zcard(b.redis_key) == 2
    (state,) = await limiter.peek([b])
    assert state.remaining == 2
    await limiter.release([b], d.lease)
    (state,) = await limiter.peek([b])
    assert state.remaining == 3


def test_a_refresh_writes_again_a_lease_redis_lost_but_never_a_cancelled_one(rds: RedisServer) -> None:
    """Redis restarted, or failed over to a replica that had not got the lease: the request still runs, so its
    renewal writes the lease again. A cancelled lease stays cancelled."""
    with rds.client() as r:
        k = key()
        assert call(r, "acquire", "running", k)[0] == 1
        r.delete(k)  # what a restart without persistence leaves
        assert call(r, "acquire", "newcomer", k)[0] == 1
        assert call(r, "refresh", "running", k)[0] == 1
        assert live(r, k) == {"running", "newcomer"}
        assert call(r, "acquire", "third", k)[0] == 0  # the limit of 2 holds again
        assert call(r, "cancel", "gone", k)[0] == 1
        assert call(r, "refresh", "gone", k)[0] == 1
        marker = r.zscore(k, "gone")
        assert live(r, k) == {"running", "newcomer"} and marker is not None and marker < 0
