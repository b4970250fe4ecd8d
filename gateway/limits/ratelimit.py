"""Rate limits that hold exactly across replicas: one atomic Lua script per request.

GCRA for every rate (one value per bucket, O(1), a reservation returned exactly) and expiring leases for
`concurrent`; the script charges every bucket a request touches or none, on Redis's own clock. Without
Redis the same arithmetic runs in process memory (`gcra`, the one Python mirror of the script). The
algorithm, key layout and Cluster hash tags: docs/ratelimits.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Final

import redis.asyncio as aioredis

from gateway.ids import unique_suffix
from gateway.limits.bucketset import BucketSet
from gateway.limits.gcra import (
    LEASE_TTL_MS,
    PERIOD_S,
    TOKEN_KINDS,
    Bucket,
    BucketState,
    Decision,
    Kind,
    _Local,
    _parse_tat,
    gcra,
    peek_state,
)
from gateway.limits.script import script_text
from gateway.limits.scriptchannel import Part, ScriptChannel, Unanswered
from gateway.state import Deadline, Degraded, SharedState

# Where the callers look for them: the arithmetic lives in gateway/limits/gcra.py, the script in
# gateway/limits/script.py, the limiter here.
__all__ = [
    "CLUSTER_PREFIX",
    "LEASE_TTL_MS",
    "PERIOD_S",
    "SCRIPT",
    "TOKEN_KINDS",
    "Bucket",
    "BucketSet",
    "BucketState",
    "Decision",
    "Kind",
    "Limiter",
    "RedisDown",
    "gcra",
    "peek_state",
]


SCRIPT: Final = script_text(LEASE_TTL_MS)
_SHA: Final = hashlib.sha1(SCRIPT.encode()).hexdigest().encode()
# A lease is renewed for at most this long: a request that never settles (a bug) cannot hold a slot forever.
MAX_RENEW_S: Final = 86_400.0
# A call's round trip, queueing included, before Redis counts as down (SharedState's deadline).
_DEADLINE_S: Final = 0.5
# On a Redis Cluster every bucket lives in one hash slot, so that a request's buckets of every scope are
# still checked and charged by one atomic script: the prefix's `{rl}` is the hash tag of every key.
CLUSTER_PREFIX: Final = "{rl}"
# While leases wait to be cancelled, how often to look whether Redis is back (it is retried at most once
# a second, so this bounds the delay after that), and how many cancels go in one write.
_CANCEL_POLL_S: Final = 0.2
_CANCELS_PER_ROUND: Final = 1000
_Held = dict[str, tuple[tuple[Bucket, ...], float]]  # lease -> (its concurrency buckets, a time)
# Leases held: lease -> (its concurrency buckets, renew until, whether Redis holds it rather than this process).
_Live = dict[str, tuple[tuple[Bucket, ...], float, bool]]
# Compiled bucket sets kept (`Limiter.compiled`): far more than a config's scopes combine into.
_SETS_KEPT: Final = 4096


class RedisDown(Exception):
    """Redis is configured but unreachable and `redis.on_failure` is `fail_closed`."""


class Limiter:
    def __init__(
        self,
        shared: SharedState,
        *,
        fail_open: bool = True,
        clock: Callable[[], float] = time.time,
        lease_ttl_ms: int = LEASE_TTL_MS,
    ) -> None:
        self.shared = shared
        self.fail_open = fail_open
        self.lease_ttl_ms = lease_ttl_ms
        self.local = _Local(clock, lease_ttl_ms)
        self._prefix = CLUSTER_PREFIX if shared.cluster else ""
        script = script_text(lease_ttl_ms)
        self._sha = hashlib.sha1(script.encode()).hexdigest().encode()
        self._channel = ScriptChannel(shared, script, self._prefix + "rl:") if shared.client is not None else None
        if self._channel is not None:
            self._channel.dropped = self._dropped
        # Leases of requests still running, by id: renewed every third of the TTL (`_renew`) so that a
        # request longer than the TTL (a long stream) keeps its slot, and the count stays exact; written
        # again at once after the channel's connection drops, in case Redis lost them (`_dropped`).
        self._live: _Live = {}
        self._renewer: asyncio.Task[None] | None = None
        self._woken = asyncio.Event()  # set: renew now
        # Each set of buckets charged together, compiled once (its keys, periods, command bytes).
        self._sets: dict[tuple[Bucket, ...], BucketSet] = {}
        # Leases whose acquire went unanswered but which local state admitted: Redis may hold them too.
        # Value: when to forget (monotonic), so a lease whose request never settles cannot stay forever.
        self._doubtful: dict[str, float] = {}
        # Leases Redis may hold that must go (see `_cancel`): lease -> (its concurrency buckets, give-up time).
        self._cancels: _Held = {}
        self._canceller: asyncio.Task[None] | None = None
        # The limiter of the config that replaced this one: at close it takes the cancels still pending and the
        # leases still live.
        self._successor: Limiter | None = None
        self._closed = False

    def adopt(self, old: Limiter) -> None:
        """Take over the leases a replaced limiter has yet to cancel, when it closes: a reload while Redis
        stalls must not drop them, or they would hold their slots for the lease TTL once Redis is back. So
        too the leases of its requests still running (renewed here, and released through this one)."""
        old._successor = self

    def _take(self, cancels: _Held, live: _Live | None = None) -> None:
        if self._closed and self._successor is not None:
            self._successor._take(cancels, live)
        elif not self._closed and self._channel is not None:  # without Redis now, no Redis lease to cancel
            for lease, (held, until) in cancels.items():
                self._cancels.setdefault(lease, (held, until))
            if cancels and (self._canceller is None or self._canceller.done()):
                self._canceller = asyncio.ensure_future(self._cancel_pending())
            if live:  # a request can outlive the config whose limiter leased its slot (the queue's, a reload)
                self._live.update(live)
                if self._renewer is None:
                    self._renewer = asyncio.ensure_future(self._renew())

    def solo(self, alone: Callable[[], bool]) -> None:
        """`alone()` says whether one request at most is in flight: its calls to Redis then leave at once
        instead of at the end of the loop's tick, where they would wait for others to merge with."""
        if self._channel is not None:
            self._channel.alone = alone

    def compiled(self, buckets: Sequence[Bucket]) -> BucketSet:
        """`buckets` compiled for this limiter (its key prefix and script), once per distinct set."""
        key = tuple(buckets)
        found = self._sets.get(key)
        if found is None:
            if len(self._sets) >= _SETS_KEPT:
                self._sets.clear()  # bounded whatever the callers combine; rebuilt as they come back
            found = self._sets[key] = BucketSet(key, self._prefix, self._sha)
        return found

    def _command(self, mode: str, lease: str, buckets: Sequence[Bucket], costs: Sequence[float]) -> Part:
        return self.compiled(buckets).part(mode, lease, costs)

    def _remote(self, part: Part) -> asyncio.Future[list[int]]:
        """One script call on the channel (merged with this tick's others). The future fails with
        Degraded when the call was not sent, and with Unanswered when Redis did not answer in time."""
        assert self._channel is not None
        return self._channel.call(part)

    async def _run(
        self, mode: str, lease: str, buckets: Sequence[Bucket] | BucketSet, costs: Sequence[float]
    ) -> list[int]:
        bset, plain = (buckets, buckets.buckets) if isinstance(buckets, BucketSet) else (None, buckets)
        if self._channel is not None:
            if not self.shared.degraded:
                try:
                    return await self._remote((bset or self.compiled(plain)).part(mode, lease, costs))
                except Degraded:
                    pass
            if not self.fail_open:
                raise RedisDown
        return self.local.run(mode, lease, plain, costs)

    async def close(self) -> None:
        self._closed = True
        renewer = self._renewer
        if renewer is not None:
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)
        if (self._cancels or self._live) and self._successor is not None:
            pending, live, self._cancels, self._live = self._cancels, self._live, {}, {}
            self._successor._take(pending, live)
        canceller = self._canceller
        if canceller is not None and not canceller.done():
            # One last round for leases still to cancel (bounded); what is left expires with its TTL.
            if self._cancels and not self.shared.degraded:
                with contextlib.suppress(TimeoutError):
                    async with Deadline(_DEADLINE_S * 2):
                        await self._cancel_round()
            canceller.cancel()
            await asyncio.gather(canceller, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()

    # ----------------------------------------------------------------------------------------------
    # Concurrency leases across a Redis outage
    #
    # A lease lives in Redis, in process memory, or (after an acquire that went unanswered) possibly in
    # both. An unanswered acquire may still run in Redis after the request has ended (a stalled Redis
    # runs what was written to it when it resumes), so such a lease is cancelled by id once Redis answers
    # again, and the cancel leaves a marker that makes a later run of that acquire write nothing. A
    # release that does not get through is turned into a cancel too. Every id is unique, so a cancel is
    # idempotent and never touches another request's slot.

    def _cancel(self, lease: str, buckets: Sequence[Bucket]) -> None:
        held = tuple(b for b in buckets if b.kind == "concurrent")
        # Past the lease TTL, whatever Redis holds for it has expired (unless Redis ran the acquire more
        # than a TTL late, and then it expires a TTL later): give up then, so memory stays bounded.
        self._cancels[lease] = (held, time.monotonic() + self.lease_ttl_ms / 1000)
        if self._canceller is None or self._canceller.done():
            self._canceller = asyncio.ensure_future(self._cancel_pending())

    async def _cancel_pending(self) -> None:
        while self._cancels:
            pause = _CANCEL_POLL_S
            if not self.shared.degraded:
                if not await self._cancel_round():
                    pause = 1.0  # Redis answers but refuses (an error reply): do not hammer it
                if not self._cancels:
                    return
            await asyncio.sleep(pause)

    async def _cancel_round(self) -> bool:
        """Send one batch of cancels; whether any got through (or nothing was left to send)."""
        now = time.monotonic()
        for lease, (_, until) in list(self._cancels.items()):
            if until < now:
                del self._cancels[lease]
        batch = list(itertools.islice(self._cancels.items(), _CANCELS_PER_ROUND))
        if not batch:
            return True
        # Queued in one tick: one write, one round trip for the whole batch.
        sent = [self._remote(self._command("cancel", lease, held, [0.0] * len(held))) for lease, (held, _) in batch]
        results = await asyncio.gather(*sent, return_exceptions=True)
        done = [lease for (lease, _), res in zip(batch, results, strict=True) if not isinstance(res, BaseException)]
        for lease in done:
            del self._cancels[lease]
        return bool(done)

    def _doubt(self, lease: str) -> None:
        doubtful = self._doubtful
        now = time.monotonic()
        while doubtful:  # oldest first (insertion order): drop what outlived the TTL
            oldest = next(iter(doubtful))
            if doubtful[oldest] > now:
                break
            del doubtful[oldest]
        doubtful[lease] = now + self.lease_ttl_ms / 1000

    def _fallback(self, lease: str, buckets: Sequence[Bucket], costs: Sequence[float], unanswered: bool) -> list[int]:
        """Redis did not decide: fail closed, or decide on local state. `unanswered`: Redis may yet grant it."""
        unanswered = unanswered and bool(lease)
        if not self.fail_open:
            if unanswered:
                self._cancel(lease, buckets)
            raise RedisDown
        out = self.local.run("acquire", lease, buckets, costs)
        if unanswered:
            if out[0] == 1:
                self._doubt(lease)  # settled by `release`, which cancels it in Redis
            else:
                self._cancel(lease, buckets)  # refused here: nothing will release it
        return out

    async def acquire(self, buckets: Sequence[Bucket] | BucketSet, tokens: int, requests: int = 1) -> Decision:
        """Charge every bucket or none: `tokens` to token buckets, `requests` to request-rate ones (an
        emulated fan-out's further upstream calls); a concurrency bucket takes one lease whatever they are.
        `buckets` may be compiled already (`compiled`), as a caller that charges the same set again keeps it."""
        bset = buckets if isinstance(buckets, BucketSet) else self.compiled(buckets)
        # Only a concurrency lease needs a name; ids are unique across replicas (gateway.ids).
        lease = unique_suffix() if bset.leased else ""
        costs = [tokens if t else requests for t in bset.token_mask]
        channel = self._channel
        remote = False  # whether Redis decided (and holds the lease), rather than this process
        try:
            if channel is None:
                out = self.local.run_specs("acquire", lease, bset.specs, costs)
            elif self.shared.degraded:
                out = self._fallback(lease, bset.buckets, costs, unanswered=False)
            else:
                try:
                    out = await channel.call(bset.part("acquire", lease, costs))
                    remote = True
                except Degraded as exc:
                    out = self._fallback(lease, bset.buckets, costs, unanswered=isinstance(exc, Unanswered))
        except asyncio.CancelledError:
            # The request went away while its acquire was on the wire: Redis may grant it all the same.
            if lease and channel is not None:
                self._cancel(lease, bset.buckets)
            raise
        if lease and out[0] == 1:
            self._hold((lease,), bset.concurrent, remote)
        pairs = zip(bset.buckets, out[2::2], out[3::2], strict=True)
        states = [BucketState(b, remaining, reset) for b, remaining, reset in pairs]
        return Decision(out[0] == 1, out[1], states, lease, channel is not None and not remote)

    def decided(self, bset: BucketSet, tokens: int) -> list[int] | None:
        """`acquire`'s reply decided at once, for a caller on the request path: with no Redis, a set that
        takes no lease is decided in process memory without a coroutine, a BucketState per bucket or a
        Decision. The reply is the script's (allowed, retry ms, then remaining and reset per bucket). None:
        use `acquiring` or `acquire`."""
        if self._channel is not None or bset.leased:
            return None
        return self.local.acquire_rates(bset.specs, bset.token_mask, tokens)

    def adjust_here(self, bset: BucketSet, units: int) -> None:
        """`adjust` of `bset` (rate and token buckets, no concurrency) in this process's own state, at once, for
        a charge made there (without Redis, or while it was away: sent to Redis, it would give back what Redis
        never had)."""
        if units:
            self.local.run_specs("adjust", "", bset.specs, [float(units)] * len(bset.specs))

    async def adjust_shared(self, tset: BucketSet, tokens: int) -> bool:
        """`adjust` of `tset` (rate and token buckets) for a charge Redis holds, sent at most once. False: not sent
        (Redis away, or it refused the call unrun), for the caller to send again once Redis answers; True: sent,
        answered or not (an unanswered one may have run, and must not run twice)."""
        if self._channel is None:
            self.adjust_here(tset, tokens)
            return True
        if self.shared.degraded:
            return False
        try:
            await self._remote(tset.part("adjust", "", [float(tokens)] * len(tset.buckets)))
        except Degraded as exc:
            return isinstance(exc, Unanswered)
        return True

    def acquiring(self, bset: BucketSet, tokens: int) -> asyncio.Future[list[int]] | None:
        """`acquire`'s common case without a coroutine of its own, for a caller on the request path: a set
        that takes no lease, charged one request and `tokens`, while Redis answers. The future's result is
        the script's reply (allowed, retry ms, then remaining and reset per bucket); when it fails with
        Degraded, `refused_call` decides instead. None: use `acquire` (no Redis, Redis failing, a lease)."""
        channel = self._channel
        if channel is None or bset.leased or self.shared.degraded:
            return None
        return channel.call(bset.acquire_part(tokens))

    def refused_call(self, bset: BucketSet, tokens: int) -> list[int]:
        """The decision when `acquiring`'s call got no answer: fail closed (RedisDown), or decide on local
        state. It took no lease, so nothing of it is left to cancel in Redis."""
        return self._fallback("", bset.buckets, [tokens if t else 1 for t in bset.token_mask], unanswered=False)

    async def acquire_block(self, bucket: Bucket, count: int) -> tuple[list[str], int]:
        """`count` leases of the concurrency `bucket` in one call, all or none, and the headroom left; only
        from a Redis that answers (else none, and the caller takes one lease per request, outages and all)."""
        if self._channel is None or self.shared.degraded:
            return [], 0
        base = unique_suffix()
        leases = [f"{base}/{j}" for j in range(1, count + 1)]  # the script's names for them
        try:
            out = await self._remote(self._command("block", base, [bucket], [count]))
        except (Degraded, asyncio.CancelledError) as exc:
            if not isinstance(exc, Degraded) or isinstance(exc, Unanswered):
                for lease in leases:  # Redis may run it yet: each lease's cancel marker undoes the whole block
                    self._cancel(lease, [bucket])
            if isinstance(exc, asyncio.CancelledError):
                raise
            return [], 0
        if out[0] != 1:
            return [], out[2]
        self._hold(leases, (bucket,), True)
        return leases, out[2]

    def _hold(self, leases: Sequence[str], held: tuple[Bucket, ...], remote: bool) -> None:
        """Renew `leases` until they are released (or for MAX_RENEW_S at most); `remote`: Redis holds them."""
        until = time.monotonic() + MAX_RENEW_S
        for lease in leases:
            self._live[lease] = (held, until, remote)
        if self._renewer is None:
            self._renewer = asyncio.ensure_future(self._renew())

    def _dropped(self) -> None:
        """The channel's connection dropped: Redis may have restarted, or failed over to a replica that had
        not got the last writes, and lost leases whose requests still run. Renew (which writes them again)
        as soon as Redis answers, rather than a third of the TTL later: until then other processes may
        take those slots, past the limit."""
        if self._closed or not self._live:
            return
        self._woken.set()
        if self._renewer is None:
            self._renewer = asyncio.ensure_future(self._renew())

    async def _renew(self) -> None:
        """Every third of the lease TTL, while any lease is held: each one's expiry a TTL ahead again (and
        written again where Redis lost it), one script call per lease, all in one write. Off the request
        path; a round that did not get through is tried again as soon as Redis answers."""
        woken, pause = self._woken, self.lease_ttl_ms / 3000
        try:
            while self._live:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await woken.wait()
                woken.clear()
                now = time.monotonic()
                for lease, (_, until, _) in list(self._live.items()):
                    if until < now:
                        del self._live[lease]
                sent, skipped = self._refresh_live()
                results = await asyncio.gather(*sent, return_exceptions=True)
                pause = self.lease_ttl_ms / 3000
                if skipped or any(isinstance(r, BaseException) for r in results):
                    # Redis away: look again soon; Redis refusing (an error reply): not too often.
                    pause = _CANCEL_POLL_S if self.shared.degraded else 1.0
        finally:
            self._renewer = None
            woken.clear()  # nothing held: nothing to write again

    def _refresh_live(self) -> tuple[list[asyncio.Future[list[int]]], bool]:
        """One refresh per lease held, queued now (no await between reading `_live` and queueing: a lease
        released after this has its release queued behind its refresh, never before it). Those of Redis go to
        Redis, those of this process are renewed here; True with them: some of Redis's were not sent."""
        sent: list[asyncio.Future[list[int]]] = []
        away = self._channel is None or self.shared.degraded
        skipped = False
        for lease, (held, _, remote) in self._live.items():
            zeros = [0.0] * len(held)
            if not remote:
                self.local.run("refresh", lease, held, zeros)
            elif away:
                skipped = True
            else:
                sent.append(self._remote(self._command("refresh", lease, held, zeros)))
        return sent, skipped

    async def peek(self, buckets: Sequence[Bucket]) -> list[BucketState]:
        """Every bucket's headroom now, read-only (for the status page): one pipelined read, no script."""
        if self._channel is not None:

            async def read(r: aioredis.Redis) -> list[BucketState]:
                pipe = r.pipeline(transaction=False)
                if not self._prefix:
                    pipe.time()  # a cluster pipeline takes no keyless command: TIME goes alone there
                for b in buckets:
                    if b.kind == "concurrent":
                        pipe.zrange(self._prefix + b.redis_key, 0, -1, withscores=True)
                    else:
                        pipe.get(self._prefix + b.redis_key)
                (sec, usec), *raw = (
                    await pipe.execute() if not self._prefix else [await r.time(), *await pipe.execute()]
                )
                now = int(sec) * 1000 + int(usec) // 1000
                return [
                    peek_state(b, now, held=sum(1 for _, expiry in v if expiry > now))
                    if b.kind == "concurrent"
                    else peek_state(b, now, _parse_tat(v) if v else None)
                    for b, v in zip(buckets, raw, strict=True)
                ]

            try:
                return await self.shared.run(read)
            except Degraded:
                pass
        return self.local.peek(buckets)

    async def adjust(self, buckets: Sequence[Bucket], tokens: int) -> None:
        """Charge (or with a negative count, return) tokens after the fact, without checking, to the token
        buckets among `buckets`, on Redis or, while it is away, on this process's state."""
        token_buckets = [b for b in buckets if b.kind in TOKEN_KINDS]
        if token_buckets and tokens:
            await self._run("adjust", "", token_buckets, [float(tokens)] * len(token_buckets))

    async def release(self, buckets: Sequence[Bucket], lease: str) -> None:
        if self._closed and self._successor is not None:  # its request outlived this config (see `_take`)
            return await self._successor.release(buckets, lease)
        held = [b for b in buckets if b.kind == "concurrent"]
        if not held:
            return
        self._live.pop(lease, None)
        zeros = [0.0] * len(held)
        if self._channel is None:
            self.local.run("release", lease, held, zeros)
            return
        leases = self.local.leases
        if leases and any(lease in leases.get(b.redis_key, ()) for b in held):
            # Admitted on local state during an outage: free the local slot whatever Redis does now.
            self.local.run("release", lease, held, zeros)
            if self._doubtful.pop(lease, None) is not None:
                self._cancel(lease, held)
            return
        if self.shared.degraded:
            self._cancel(lease, held)
            return
        try:
            await self._remote(self._command("release", lease, held, zeros))
        except Degraded:
            self._cancel(lease, held)
