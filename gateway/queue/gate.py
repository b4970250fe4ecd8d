"""One server's slots and the requests waiting for them.

A slot is held from an attempt's start to its end (a stream's last byte). Without Redis the gate counts its
slots in this process; with `redis:` each slot is a concurrency lease in Redis (gateway/limits/ratelimit.py,
the one used by `limits.concurrent`), so the cap holds across workers and replicas, and a process that dies
holding one gives it back by the lease's expiry. Far below the cap a process takes a block of leases in one
call and hands them out itself (`spare`). Waiters are served in `FairOrder`; with Redis a slot freed by
another process is not announced, so while requests wait the gate asks again every `POLL_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Final

import msgspec

from gateway.limits.gcra import Bucket
from gateway.limits.ratelimit import MAX_RENEW_S, Limiter, RedisDown
from gateway.ops.metrics import Metrics
from gateway.queue.fair import BATCH, PRIORITIES, RANK, FairOrder, Waiter

# With Redis: how often waiters look for a slot another process freed (their own process's wake them at once).
POLL_S: Final = 0.02
# `low` and the classes below it (a batch's lines) hold at most `low_share` of the slots, under the reserve.
LOW: Final = RANK["low"]
# With Redis, a server with a cap of at least BLOCK_MIN takes its leases in blocks of cap // 8 (at most
# BLOCK_MAX) while every process together holds at most half its cap (and one lease per request above
# that); a process's spare leases beyond what it has used at once since the last look, every TRIM_S, go
# back. BLOCK_MAX because every lease held is a member Redis stores, renews and is given back one by one:
# a cap far above the load (100,000) would otherwise move 12,500 leases a second for a few dozen requests.
BLOCK_MIN: Final = 16
BLOCK_MAX: Final = 64
TRIM_S: Final = 1.0


class Slot(msgspec.Struct, eq=False):
    """One slot of one gate, held by one attempt; `done` gives it back once (later calls do nothing).

    A Struct: built in C, without an `__init__` frame, once per attempt."""

    gate: Gate | None
    lease: str
    limiter: Limiter | None  # the limiter that holds its lease (a reload may have swapped the gate's since)
    tenant: str
    weight: float
    cost: int  # the tokens its tenant was charged for it, `prompt` of them for its prompt
    prompt: int
    waited: float  # seconds spent in the queue (0 when a slot was free)
    pooled: bool = False  # its lease is one of a block: it goes back to the gate's spares, not to Redis

    def done(self, used: int | None, prompt: int | None = None) -> None:
        """The attempt ended having used `used` tokens (None: unknown, the estimate stands), `prompt` of them its
        prompt's (None: not reported): the slot goes back to its gate, and its tenant's charge is corrected."""
        gate = self.gate
        if gate is None:
            return
        self.gate = None
        gate.in_use -= 1
        # Nothing to correct, nor to learn, when the answer used what it was charged (the usual case once its
        # tenant's answers are known; a first answer that used all its max_tokens leaves that as the estimate).
        if used is not None and used != self.cost:
            gate.order.settle(self.tenant, self.cost, self.prompt, used, self.weight, prompt)
        if used and gate.metrics is not None:
            served = gate.served
            if not served:  # its first since the tally's last flush, which then calls `Gate.inc`
                gate.metrics.tally.add(gate, 0.0)
            served[self.tenant] = served.get(self.tenant, 0) + used
        if self.limiter is not None:
            gate.give_back(self)
        if gate.order.depth or gate.watchers:
            gate.wake()


# The slot of a server without a cap: nothing to give back.
NO_CAP: Final = Slot(None, "", None, "", 1.0, 0, 0, 0.0)


class Gate:
    """The slots of one server (a provider's base_url, or one of its replicas) and its fair queue."""

    def __init__(
        self,
        name: str,
        cap: int,
        limiter: Limiter | None,
        metrics: Metrics | None,
        low_share: float = 1.0,
        hold_s: float = 2.0,
        lease: str | None = None,
    ) -> None:
        self.name = name
        # What its slots are counted under in Redis: a replica's URL hash, not its name, which is its position.
        self.lease = lease or name
        self.limiter = limiter  # None: slots counted in this process only
        self.seen = -1e9  # when a `normal` or `high` request last asked for a slot here (with a reserve)
        self._cap(cap, low_share, hold_s)
        self.metrics = metrics
        self.order = FairOrder()
        self.in_use = 0  # slots this process holds (in use: spare leases of its blocks are not counted)
        # With Redis: leases of blocks this process holds and no request uses, how many of them it holds in
        # all, the most in use at once since the last trim, and when each was taken (for MAX_RENEW_S).
        self.spare: list[str] = []
        self.pooled = 0
        self.peak = 0
        self.headroom = cap  # free slots across processes, as Redis last said
        self._born: dict[str, float] = {}
        self._stale: set[str] = set()  # pooled leases in use that go back to Redis at their end
        self._reserving = False
        self.blocks = 0  # blocks taken so far (the status of a test, or of a curious operator)
        self._trimmer: asyncio.TimerHandle | None = None
        self.wait_s = 1.0  # a moving average of how long requests that waited here waited, for Retry-After
        self._pump: asyncio.Task[None] | None = None
        self._freed: asyncio.Event | None = None
        self._background: set[asyncio.Task[None]] = set()  # lease releases under way
        self.service: dict[str, Any] = {}  # tenant -> its service counter's child (bounded by the tenants)
        # Tenant -> the tokens its requests used here since the metrics' last flush (`inc` adds them to `service`).
        self.served: dict[str, int] = {}
        # Requests waiting on another server that this one may also serve (another target of their alias):
        # when a slot frees here and nobody waits here, the first of them is told (its future gets None).
        self.watchers: dict[asyncio.Future[Any], None] = {}

    def _cap(self, cap: int, low_share: float, hold_s: float) -> None:
        self.cap = cap
        self.hold_s = hold_s
        # While `normal` or `high` requests came here in the last `hold_s`, a `low` request (or a batch line)
        # starts only while fewer than `low_cap` slots are in use, so the rest stay free for their arrivals
        # (queue.low_share); with none lately, `low` may fill the server (capacity nobody else asks for is not
        # kept). Its lease is checked against the same Redis key with the smaller limit, so the reserve holds
        # across processes as the cap does.
        self.low_cap = cap if low_share >= 1 else max(1, int(cap * low_share))
        self.bucket = Bucket(f"queue:{self.lease}", "concurrent", cap)
        self.low_bucket = (
            self.bucket if self.low_cap == cap else Bucket(f"queue:{self.lease}", "concurrent", self.low_cap)
        )
        # Blocks: taken against half the cap (the same key), so the leases in blocks never pass it.
        self.block = min(cap // 8, BLOCK_MAX) if cap >= BLOCK_MIN else 0
        self.block_bucket = Bucket(f"queue:{self.lease}", "concurrent", cap // 2)

    def resize(
        self,
        cap: int,
        limiter: Limiter | None,
        metrics: Metrics | None,
        low_share: float = 1.0,
        hold_s: float = 2.0,
        name: str | None = None,
    ) -> None:
        """A reload: the same server under the new config (its waiters and held slots stay), and its name
        there (`name`: a replica's `provider@i` follows its place in the new `replicas:`)."""
        self._give_back(list(self.spare))  # the old limiter's; a pooled slot in use goes back to Redis at its end
        self.inc(0.0)  # what was served under the old metrics goes to their series
        if name is not None and name != self.name:
            # The waiters counted under the old name are counted under the new one: each one's end takes
            # it off the series its gate names then.
            for rank, n in enumerate(self.order.counts):
                if n and self.metrics is not None:
                    self.metrics.queue_waiting.labels(self.name, PRIORITIES[rank]).dec(n)
                if n and metrics is not None:
                    metrics.queue_waiting.labels(name, PRIORITIES[rank]).inc(n)
            self.name = name
        self.limiter, self.metrics = limiter, metrics
        self.service = {}  # the new metrics' children
        self._cap(cap, low_share, hold_s)
        self.wake()

    def inc(self, _: float) -> None:
        """The metrics' tally flushing: the tokens served here per tenant since its last flush, into their series
        (counted per request in `served`: a counter's own `inc` per request is four calls and a lock)."""
        served, self.served = self.served, {}
        metrics = self.metrics
        if metrics is None:
            return
        for tenant, used in served.items():
            child = self.service.get(tenant)
            if child is None:  # one labels() lookup per tenant, not per flush
                child = self.service[tenant] = metrics.queue_service.labels(self.name, tenant)
            child.inc(used)

    def low_limit(self) -> tuple[int, Bucket]:
        """The slots `low` requests and batch lines may fill now, and the lease bucket that counts them against it."""
        if self.low_cap < self.cap and time.monotonic() - self.seen < self.hold_s:
            return self.low_cap, self.low_bucket
        return self.cap, self.bucket

    def room(self) -> bool:
        """Whether a request could start here now (as far as this process knows)."""
        return self.in_use < self.cap and not self.order.depth

    async def take(self, w: Waiter) -> Slot | None:
        """A slot at once if one is free and nobody waits for it, else None (the caller then queues)."""
        limit, bucket = self.low_limit() if w.rank >= LOW else (self.cap, self.bucket)
        if self.order.depth or self.in_use >= limit:
            return None
        limiter = self.limiter
        if limiter is None:
            self.in_use += 1
            return self._grant(w, "", None, 0.0)
        if limit == self.cap and self.block:
            if not self.spare and not self._reserving and self.headroom >= self.cap - self.cap // 2 + self.block:
                self.in_use += 1  # the place it takes while the block comes
                try:
                    await self._reserve(limiter)
                finally:
                    self.in_use -= 1
            if self.spare and not self.order.depth and self.in_use < limit:
                return self.from_block(w.tenant, w.weight, w.prompt, w.most)
            if self.order.depth or self.in_use >= limit:  # taken while the block came (or was refused)
                return None
        self.in_use += 1  # counted before the await, so two requests of this process cannot both pass
        try:
            lease = await self._lease(limiter, bucket)
        except BaseException:
            self.in_use -= 1
            raise
        if lease is None:
            self.in_use -= 1
            return None
        return self._grant(w, lease, limiter, 0.0)

    async def _lease(self, limiter: Limiter, bucket: Bucket) -> str | None:
        try:
            decision = await limiter.acquire([bucket], 0)
        except RedisDown:
            return None  # fail closed and Redis away: wait (the queue's max_wait bounds it)
        if bucket is self.bucket and decision.states:
            self.headroom = decision.states[0].remaining
        return decision.lease if decision.allowed else None

    async def _reserve(self, limiter: Limiter) -> None:
        """A block of leases into `spare`, in one Redis call, if all processes together hold few enough."""
        self._reserving = True
        try:
            leases, left = await limiter.acquire_block(self.block_bucket, self.block)
        finally:
            self._reserving = False
        # Free slots across processes, as the answer says (none when refused: one lease a request until a
        # per-request answer says there is room again).
        self.headroom = left + self.cap - self.cap // 2 if leases else 0
        if not leases:
            return
        if limiter is not self.limiter:  # a reload while it came
            for lease in leases:
                self._release_later(limiter, lease)
            return
        born = time.monotonic()
        for lease in leases:
            self._born[lease] = born
        self.spare.extend(leases)
        self.blocks += 1
        self.pooled += len(leases)
        self.peak = max(self.peak, self.in_use + 1)
        if self._trimmer is None:
            self._trimmer = asyncio.get_running_loop().call_later(TRIM_S, self._trim)

    def from_block(self, tenant: str, weight: float, prompt: int, most: int, waited: float = 0.0) -> Slot:
        """A slot on a spare lease of a block (the caller saw one, and that the request may start)."""
        in_use = self.in_use = self.in_use + 1
        if in_use > self.peak:
            self.peak = in_use
        cost = self.order.charge(tenant, prompt, most, weight)
        return Slot(self, self.spare.pop(), self.limiter, tenant, weight, cost, prompt, waited, True)

    def _trim(self) -> None:
        """Every TRIM_S while blocks are held: spare leases beyond the most used at once since the last
        look go back to Redis, and so do leases near their last renewal (MAX_RENEW_S), and every one while
        Redis does not answer (their renewals fail: they would outlive their leases)."""
        self._trimmer = None
        spare = self.spare
        keep = len(spare) if self.order.depth else max(self.peak - self.in_use, 0)
        old = time.monotonic() - MAX_RENEW_S / 2
        if self.limiter is not None and self.limiter.shared.degraded:
            old, keep = float("inf"), 0
        stale = {lease for lease, born in self._born.items() if born < old}
        idle_stale = []
        if stale:
            self._stale |= stale  # those in use go back to Redis at their end
            idle_stale = [lease for lease in spare if lease in stale]
            spare[:] = [lease for lease in spare if lease not in stale]
        give = spare[keep:]
        del spare[keep:]
        self._give_back(give + idle_stale)
        self.peak = self.in_use
        if self.pooled and self.limiter is not None:
            self._trimmer = asyncio.get_running_loop().call_later(TRIM_S, self._trim)

    def _give_back(self, leases: list[str]) -> None:
        """Pooled leases that no request uses, back to Redis (`spare` no longer holds them)."""
        spare = set(self.spare)
        for lease in leases:
            if lease in spare:
                self.spare.remove(lease)
            self._release_later(self.limiter, lease)
            self._born.pop(lease, None)
            self._stale.discard(lease)
        self.pooled -= len(leases)

    async def close(self) -> None:
        """Shutdown: spare leases back to Redis now (not at their expiry), and the releases under way done."""
        if self._trimmer is not None:
            self._trimmer.cancel()
            self._trimmer = None
        self._give_back(list(self.spare))
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    def _release_later(self, limiter: Limiter | None, lease: str) -> None:
        if limiter is not None:
            task = asyncio.ensure_future(_release(limiter, self.bucket, lease))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _grant(self, w: Waiter, lease: str, limiter: Limiter | None, waited: float) -> Slot:
        if waited:
            self.wait_s += (waited - self.wait_s) * 0.1
        return self.grant(w.tenant, w.weight, w.prompt, w.most, lease, limiter, waited)

    def grant(
        self,
        tenant: str,
        weight: float,
        prompt: int,
        most: int,
        lease: str = "",
        limiter: Limiter | None = None,
        waited: float = 0.0,
    ) -> Slot:
        """A slot already counted in `in_use`, its estimated cost charged to its tenant."""
        return Slot(
            self, lease, limiter, tenant, weight, self.order.charge(tenant, prompt, most, weight), prompt, waited
        )

    def enqueue(self, w: Waiter) -> None:
        self.order.push(w)
        if self.metrics is not None:
            self.metrics.queue_waiting.labels(self.name, PRIORITIES[w.rank]).inc()
        self.wake()

    def leave(self, w: Waiter) -> None:
        """A waiter that stopped waiting without a slot: out of the order at once."""
        if self.order.remove(w) and self.metrics is not None:
            self.metrics.queue_waiting.labels(self.name, PRIORITIES[w.rank]).dec()

    def give_back(self, slot: Slot) -> None:
        """The lease of a slot that ended (with Redis): back to the spares, or to Redis."""
        if not slot.pooled:
            self._release_later(slot.limiter, slot.lease)
        elif slot.limiter is self.limiter and not (self._stale and slot.lease in self._stale):
            self.spare.append(slot.lease)  # for the next request, without Redis
        else:  # a reload since, or a lease near its last renewal
            self._release_later(slot.limiter, slot.lease)
            self._born.pop(slot.lease, None)
            self._stale.discard(slot.lease)
            self.pooled -= 1

    def wake(self) -> None:
        if not self.order.depth:
            if self.watchers and self.in_use < self.cap:
                self._call_watcher()
            return
        if self.limiter is None:
            self._dispatch_local()
            return
        if self._freed is not None:
            self._freed.set()
        if self._pump is None:
            self._pump = asyncio.ensure_future(self._run_pump())

    def _call_watcher(self) -> None:
        """Tell one request waiting elsewhere that a slot is free here (it comes and takes it, or not)."""
        watchers = self.watchers
        while watchers:
            future = next(iter(watchers))
            del watchers[future]
            if not future.done():
                future.set_result(None)
                return

    def _dispatch_local(self) -> None:
        while self.in_use < self.cap:
            w = self._next(BATCH if self.in_use < self.low_limit()[0] else LOW - 1)
            if w is None:
                return
            self.in_use += 1
            w.future.set_result(self._grant(w, "", None, time.monotonic() - w.since))

    def _next(self, most: int = BATCH) -> Waiter | None:
        """The next waiter still waiting, of a class up to `most` (one whose future is done was cancelled and
        is skipped)."""
        while True:
            w = self.order.pop(most)
            if w is None:
                return None
            if self.metrics is not None:
                self.metrics.queue_waiting.labels(self.name, PRIORITIES[w.rank]).dec()
            if not w.future.done():
                return w

    async def _run_pump(self) -> None:
        """With Redis: while requests wait, take a lease for the next of them whenever one is free."""
        freed = self._freed = asyncio.Event()
        try:
            while self.order.depth:
                limiter = self.limiter
                if limiter is None:
                    self._dispatch_local()
                    return
                low = (self.order.head() or 0) >= LOW
                limit, bucket = self.low_limit() if low else (self.cap, self.bucket)
                if self.spare and limit == self.cap and self.in_use < limit:
                    w = self._next()
                    if w is not None:
                        waited = time.monotonic() - w.since
                        self.wait_s += (waited - self.wait_s) * 0.1
                        w.future.set_result(self.from_block(w.tenant, w.weight, w.prompt, w.most, waited))
                    continue
                if self.in_use >= limit:
                    lease = None
                else:
                    self.in_use += 1
                    try:
                        lease = await self._lease(limiter, bucket)
                    finally:
                        self.in_use -= 1
                if lease is not None:
                    # A lease checked against the full cap goes to a `normal` or `high` waiter only.
                    w = self._next(BATCH if low else LOW - 1)
                    if w is None:
                        await _release(limiter, self.bucket, lease)
                        continue
                    self.in_use += 1
                    w.future.set_result(self._grant(w, lease, limiter, time.monotonic() - w.since))
                    continue
                freed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(POLL_S):
                        await freed.wait()
        finally:
            self._pump = None
            self._freed = None

    def retry_after(self) -> float:
        """A guess at when room comes back: about as long as the requests that got a slot here lately waited."""
        return min(max(self.wait_s, 1.0), 60.0)


async def _release(limiter: Limiter, bucket: Bucket, lease: str) -> None:
    try:
        await limiter.release([bucket], lease)
    except RedisDown:
        pass  # the limiter cancels it once Redis answers again; at worst it expires with its TTL
