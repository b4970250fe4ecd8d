"""Corrections off the request path: a reservation replaced by the usage it reported, and request units
given back for an emulated fan-out's calls never made.

Corrections are summed per set of buckets and applied every SETTLE_S, one script call per set. Each
goes where its charge is: Redis's in Redis, one this process made while Redis was away
(`Ticket.away`) in this process's state. One Redis cannot take now (away, or refusing) is owed, per bucket, and
sent once it answers, within that bucket's period (by then the reservation it corrects has drained);
one sent without an answer may have run, so it is never sent again. Docs: docs/ratelimits.md#tokens.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

from gateway.limits.ratelimit import BucketSet, Limiter

SETTLE_S: Final = 0.05
# While corrections are owed, how often to look whether Redis answers again (it is retried at most once a
# second), and how long to wait after Redis refused them (an error reply) before sending them again.
_POLL_S: Final = 0.2
_REFUSED_S: Final = 1.0


class Corrections:
    """The corrections of one limiter's charges (tokens, request units), batched, and those Redis could not
    take yet."""

    def __init__(self, limiter: Limiter) -> None:
        self.limiter = limiter
        # Per set: a request's token buckets (`BucketSet.tokens_only`), or a route's request-rate ones.
        self._pending: dict[BucketSet, int] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._owed: dict[BucketSet, list[float]] = {}  # per bucket (a set of one): [tokens, give up at]
        self._payer: asyncio.Task[None] | None = None
        self._sending: set[asyncio.Task[None]] = set()

    def add(self, tset: BucketSet, delta: int, away: bool) -> None:
        """`delta` units (tokens, or requests) to the buckets `tset`, none a concurrency one (negative: given
        back); `away`: this process holds the charge (made on its own state while Redis was away), so the
        correction goes there."""
        if away:
            self.limiter.adjust_here(tset, delta)
            return
        self._pending[tset] = self._pending.get(tset, 0) + delta
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(SETTLE_S, self._flush_soon)

    async def at_once(self, tset: BucketSet, delta: int, away: bool) -> None:
        """`add`, sent now rather than batched, for a caller that answers once it is done; owed as `add`'s are
        when Redis cannot take it."""
        if away:
            self.limiter.adjust_here(tset, delta)
        elif not await self.limiter.adjust_shared(tset, delta):
            self._owe(tset, delta)

    def _flush_soon(self) -> None:
        self._timer = None
        pending, self._pending = self._pending, {}
        if not self.limiter.shared.configured:
            # In process memory the corrections are applied here: nothing to wait for, so no task, no coroutine.
            for tset, delta in pending.items():
                self.limiter.adjust_here(tset, delta)
            return
        task = asyncio.ensure_future(self._send({tset: delta for tset, delta in pending.items() if delta}))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, pending: dict[BucketSet, int]) -> None:
        """One round trip for every set's correction; what Redis did not take is owed."""
        sets = list(pending)
        taken = await asyncio.gather(*(self.limiter.adjust_shared(tset, pending[tset]) for tset in sets))
        for tset, ok in zip(sets, taken, strict=True):
            if not ok:
                self._owe(tset, pending[tset])

    def _owe(self, tset: BucketSet, delta: float) -> None:
        now = time.monotonic()
        for b in tset.buckets:
            one = self.limiter.compiled([b])
            entry = self._owed.get(one)
            if entry is None:
                self._owed[one] = [delta, now + b.period_ms / 1000]
            else:
                entry[0] += delta
        if self._payer is None or self._payer.done():
            self._payer = asyncio.ensure_future(self._pay())

    async def _pay(self) -> None:
        """Send what is owed as soon as Redis answers; drop what outlived its bucket's period."""
        pause = _POLL_S
        while self._owed:
            await asyncio.sleep(pause)
            pause = _POLL_S
            if self.limiter.shared.degraded:
                continue
            now = time.monotonic()
            due = [(one, tokens) for one, (tokens, until) in self._owed.items() if until > now and tokens]
            left = {one: until for one, (_, until) in self._owed.items() if until > now}
            self._owed = {}
            taken = await asyncio.gather(*(self.limiter.adjust_shared(one, round(tokens)) for one, tokens in due))
            for (one, tokens), ok in zip(due, taken, strict=True):
                if not ok:
                    entry = self._owed.setdefault(one, [0, left[one]])  # with what was owed meanwhile
                    entry[0] += tokens
                    pause = _POLL_S if self.limiter.shared.degraded else _REFUSED_S

    async def drain(self) -> None:
        """At close: what is batched is sent, and what is owed gets one more try (then it is dropped)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            pending, self._pending = self._pending, {}
            await self._send({tset: delta for tset, delta in pending.items() if delta})
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)
        payer = self._payer
        if payer is not None:
            payer.cancel()
            await asyncio.gather(payer, return_exceptions=True)
        owed, self._owed = self._owed, {}
        if owed and not self.limiter.shared.degraded:
            await asyncio.gather(*(self.limiter.adjust_shared(one, round(t)) for one, (t, _) in owed.items()))
