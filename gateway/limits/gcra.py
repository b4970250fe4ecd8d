"""The arithmetic of rate limits: GCRA over a bucket's theoretical arrival time, and the script's work
in process memory (`_Local`), for one process or while Redis is away.

The Lua script (gateway/limits/ratelimit.py) and `gcra` here are the one algorithm twice: the script's
comments and docs/ratelimits.md say how they stay the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Final, Literal, NamedTuple

import msgspec

Kind = Literal["rps", "rpm", "tpm", "tpd", "concurrent"]
PERIOD_S: Final[dict[str, float]] = {"rps": 1.0, "rpm": 60.0, "tpm": 60.0, "tpd": 86_400.0}
TOKEN_KINDS: Final = frozenset({"tpm", "tpd"})
# The default of `redis.lease_ttl_ms`: a replica that dies mid-request frees its concurrency lease after this.
# A live request's lease never expires: the limiter renews it every third of the TTL while it is held.
LEASE_TTL_MS: Final = 600_000


class Bucket(msgspec.Struct, frozen=True, cache_hash=True):
    """One limit of one scope: `scope` is e.g. `key:search-team`, `model:fast`, `provider:openai`."""

    scope: str
    kind: Kind
    limit: int
    # What names the bucket in shared state when the scope's name is not unique beyond this config: a key's
    # identity (`key:<ClientKey.ident>`), so that same-named keys of two configs sharing a Redis never share
    # a bucket, while replicas of one config (the same secret) do.
    shared_as: str = ""
    # The part of the bucket a charge through this view of it may fill (the same state, `redis_key`): 1, or
    # a batch line's `batches.quota_share` of a shared scope's bucket, which leaves the rest to interactive
    # requests. Rate buckets admit while q <= `ceiling`, concurrency buckets hold `room` leases at most (both
    # at least one request: a share smaller than that lets one through while the bucket is otherwise empty).
    share: float = 1.0

    @property
    def redis_key(self) -> str:
        return "rl:{" + (self.shared_as or self.scope) + "}:" + self.kind

    @property
    def period_ms(self) -> int:
        return int(PERIOD_S.get(self.kind, 0) * 1000)

    @property
    def ceiling(self) -> int:
        """The most q (the script's (TAT - now) * limit) a charge may leave in a rate bucket: the whole
        burst (period * limit), or `share` of it rounded down, but never less than one unit (one emission
        interval, `period_ms`): a share too small to hold one request still lets one through whenever the
        bucket has drained empty, so a batch goes on, slowly. The share is read as the decimal written in
        the config (0.3 is 3/10, not the float just below it), so 0.3 of 10 is 3 units, on every replica."""
        full = self.period_ms * self.limit
        if self.share >= 1:
            return full
        return min(max(math.floor(Fraction(repr(self.share)) * full), self.period_ms), full)

    @property
    def room(self) -> int:
        """The units a charge through this view can ever find: `limit`, or the share's whole units, at least
        one (a concurrency share too small for one lease holds one while no other is held)."""
        if self.share >= 1:
            return self.limit
        if self.kind == "concurrent":
            return min(max(math.floor(Fraction(repr(self.share)) * self.limit), 1), self.limit)
        return self.ceiling // self.period_ms


class Spec(NamedTuple):
    """What the arithmetic reads of a bucket, looked up once (gateway/limits/bucketset.py), not per call."""

    key: str  # `Bucket.redis_key`: also the in-process state's key
    kind: str
    limit: int  # a concurrency bucket's: the leases this view may hold (`Bucket.room`)
    period_ms: int
    cap: int  # a rate bucket's `Bucket.ceiling`: what "acquire" admits up to (period_ms * limit: all of it)


def spec(b: Bucket) -> Spec:
    period = b.period_ms
    if b.share >= 1:  # the common case, without the share's arithmetic
        return Spec(b.redis_key, b.kind, b.limit, period, period * b.limit)
    if b.kind == "concurrent":
        return Spec(b.redis_key, b.kind, b.room, period, 0)
    return Spec(b.redis_key, b.kind, b.limit, period, b.ceiling)


class BucketState(msgspec.Struct):
    bucket: Bucket
    remaining: int
    reset_ms: int


class Decision(msgspec.Struct):
    allowed: bool
    retry_after_ms: int
    states: list[BucketState]
    lease: str
    away: bool = False  # decided on this process's state while Redis was away (what it charged is here)


class Gcra(NamedTuple):
    """One GCRA step on a rate bucket: what the script computes for it, and what it would store."""

    tat: tuple[float, float]  # the bucket's new TAT as (whole ms, units), stored unless the request is denied
    denied: bool
    retry_ms: int  # when `denied`: how long until the charge fits
    remaining: int  # headroom after the charge, in units
    reset_ms: int  # until the bucket is full again, after the charge
    remaining_now: int  # the same two before the charge: what a denial (or a peek) reports
    reset_now_ms: int


# A Gcra made in C: the named tuple's own constructor is a Python function, a frame on every bucket charged.
_gcra: Final = tuple.__new__


def gcra(
    limit: int, period: int, tat: tuple[float, float] | None, now: int, cost: float, mode: str, cap: int | None = None
) -> Gcra:
    """The script's rate arithmetic (the `else` branch of its bucket loop), line for line, in Python.

    `tat` is the stored (ms, units) (None: never charged, or expired), `now` whole milliseconds on the clock
    that wrote it, `mode` the script's ("acquire" checks, "adjust" charges without checking and clamps a
    refund at empty; anything else, e.g. "peek" with a cost of 0, only reads). TAT = ms + units * period /
    limit, kept as q = (TAT - now) * limit so that the arithmetic is exact (see the script's comment).
    "acquire" admits while the new q is at most `cap` (None: period * limit, the whole burst; less: the
    script's "share" mode). tests/ratelimit/test_script.py holds this to the script, decision by decision.
    """
    tb, tu = tat if tat is not None else (now, 0.0)
    q = (tb - now) * limit + tu * period
    if q < 0:
        tb, tu, q = now, 0.0, 0
    nu, nq = tu + cost, q + cost * period
    if mode == "adjust" and nq < 0:
        tb, nu, nq = now, 0.0, 0
    full = period * limit
    top = full if cap is None else cap
    denied = mode == "acquire" and nq > top
    k = math.floor(nu / limit)
    return _gcra(
        Gcra,
        (
            (tb + k * period, nu - k * limit),  # tat
            denied,
            math.ceil((nq - top) / limit) if denied else 0,  # retry_ms
            max(math.floor((full - nq) / period), 0),  # remaining
            math.ceil(nq / limit),  # reset_ms
            max(math.floor((full - q) / period), 0),  # remaining_now
            math.ceil(q / limit),  # reset_now_ms
        ),
    )


def peek_state(bucket: Bucket, now: int, tat: tuple[float, float] | None = None, held: int = 0) -> BucketState:
    """A bucket's headroom without charging it (`gcra` for a cost of 0).

    `tat` is the stored (ms, units) of a rate bucket (None: never charged or expired), `held` the live
    leases of a concurrency bucket; `now` is in whole milliseconds on the clock that wrote them.
    """
    if bucket.kind == "concurrent":
        return BucketState(bucket=bucket, remaining=max(bucket.limit - held, 0), reset_ms=0)
    step = gcra(bucket.limit, bucket.period_ms, tat, now, 0, "peek")
    return BucketState(bucket=bucket, remaining=step.remaining_now, reset_ms=step.reset_now_ms)


def _parse_tat(raw: bytes | str) -> tuple[float, float]:
    text = raw.decode() if isinstance(raw, bytes) else raw
    base, sep, units = text.partition(":")
    return (float(base), float(units)) if sep else (math.floor(float(base)), 0.0)


class _Local:
    """The script in process memory, for one process (or while Redis is away): `gcra` for rate buckets,
    and the script's leases for concurrency ones."""

    def __init__(self, clock: Callable[[], float], lease_ttl_ms: int = LEASE_TTL_MS) -> None:
        self.clock = clock
        self.lease_ttl_ms = lease_ttl_ms
        # Per rate bucket: the TAT as (whole millisecond, units), TAT = ms + units * period / limit.
        self.tat: dict[str, tuple[float, float]] = {}
        self.leases: dict[str, dict[str, float]] = {}

    def peek(self, buckets: Sequence[Bucket]) -> list[BucketState]:
        now = math.floor(self.clock() * 1000)
        return [
            peek_state(
                b,
                now,
                self.tat.get(b.redis_key),
                sum(1 for expiry in self.leases.get(b.redis_key, {}).values() if expiry > now),
            )
            for b in buckets
        ]

    def run(self, mode: str, lease: str, buckets: Sequence[Bucket], costs: Sequence[float]) -> list[int]:
        return self.run_specs(mode, lease, [spec(b) for b in buckets], costs)

    def acquire_rates(self, specs: Sequence[Spec], token_mask: Sequence[bool], tokens: int) -> list[int]:
        """`run_specs("acquire", "", specs, costs)` for `specs` of rate buckets only (no concurrency bucket, so no
        lease), charged `tokens` where `token_mask` says so and one request elsewhere: the request path's call,
        without the lease's and the other modes' branches. The same arithmetic, the same reply."""
        now = math.floor(self.clock() * 1000)  # whole milliseconds, like the script's TIME
        tats = self.tat
        out = [1, 0]
        news: list[tuple[float, float]] = []
        floor = math.floor
        tb: float
        # `gcra`'s "acquire" step inlined for what an admission reads (the new TAT, the headroom and reset after
        # the charge): no Gcra, no headroom before the charge. The first bucket that refuses sends the whole
        # set to `gcra` below, which works out a refusal's reply.
        for (key, _, limit, period, cap), token in zip(specs, token_mask, strict=True):
            cost = tokens if token else 1
            tat = tats.get(key)
            if tat is None:
                tb, tu, q = now, 0.0, 0.0
            else:
                tb, tu = tat
                q = (tb - now) * limit + tu * period
                if q < 0:
                    tb, tu, q = now, 0.0, 0.0
            nu, nq = tu + cost, q + cost * period
            if nq > cap:
                break
            full = period * limit
            k = floor(nu / limit)
            news.append((tb + k * period, nu - k * limit))
            out.append(floor((full - nq) / period))  # remaining: never below 0 where nq <= cap <= full
            out.append(math.ceil(nq / limit))  # reset_ms
        else:
            for s, new in zip(specs, news, strict=True):
                tats[s[0]] = new
            return out
        # As the script answers a refusal: the longest wait, and every bucket as it stands, uncharged.
        retry = 0
        out = [0, 0]
        for (key, _, limit, period, cap), token in zip(specs, token_mask, strict=True):
            step = gcra(limit, period, tats.get(key), now, tokens if token else 1, "acquire", cap)
            retry = max(retry, step[2])  # retry_ms
            out.append(step[5])  # remaining_now
            out.append(step[6])  # reset_now_ms
        out[1] = retry
        return out

    def run_specs(self, mode: str, lease: str, specs: Sequence[Spec], costs: Sequence[float]) -> list[int]:
        """The script's work on `specs` (with `costs`, one each), in process memory; its reply."""
        now = math.floor(self.clock() * 1000)  # whole milliseconds, like the script's TIME
        out = [1, 0]
        news: list[tuple[float, float] | str | None] = []
        current: dict[int, tuple[int, int]] = {}
        denied = False
        retry = 0
        tats = self.tat
        for (key, kind, limit, period, cap), cost in zip(specs, costs, strict=True):
            if kind == "concurrent":
                held = {k: v for k, v in self.leases.get(key, {}).items() if v > now}
                self.leases[key] = held
                if mode == "release":
                    held.pop(lease, None)
                    news.append(None)
                    out += [0, 0]
                    continue
                if mode == "refresh":  # as the script: a lease still held is written again if it expired
                    held[lease] = now + self.lease_ttl_ms
                    news.append(None)
                    out += [0, 0]
                    continue
                if mode == "acquire" and len(held) + 1 > limit:
                    denied = True
                    wait = max(min(int(min(held.values()) - now), 1000), 1) if held else 1000
                    retry = max(retry, wait)
                news.append("lease")
                out += [max(limit - len(held) - 1, 0), 0]
                continue
            tat, refused, retry_ms, remaining, reset_ms, remaining_now, reset_now_ms = gcra(
                limit, period, tats.get(key), now, cost, mode, cap
            )
            if refused:
                denied = True
                retry = max(retry, retry_ms)
            current[len(news)] = (remaining_now, reset_now_ms)
            news.append(tat)
            out.append(remaining)
            out.append(reset_ms)
        if mode in ("release", "refresh"):
            return out
        if denied:
            for i, (remaining, reset) in current.items():
                out[2 + i * 2], out[3 + i * 2] = remaining, reset
            return [0, retry, *out[2:]]
        for s, v in zip(specs, news, strict=True):
            if v == "lease":
                self.leases.setdefault(s.key, {})[lease] = now + self.lease_ttl_ms
            elif isinstance(v, tuple):
                tats[s.key] = v
        return out
