"""Budgets that concurrent requests cannot overshoot: reserve the worst case before the call, settle after.

A budgeted request reserves its worst-case cost on every budget it falls under (its key's and its team's
day and month): its prompt as no tokenizer can exceed, and its `max_tokens` x choices (or
`caps.budget_max_tokens` per choice without one), at the dearest target its plan may call. It is admitted
while `committed + reserved` (before its own) is under the budget, so concurrent requests exceed it by at
most one worst case. When it ends, the reservation is replaced by the real cost, charged in full; a stream
past its reservation is charged the excess as it runs. Counters: Redis hashes (HINCRBY) or process memory.
With a ledger, a counter not known yet is seeded from the rollups (gateway/ledger/budgets.py); without
one, the counters hold only reservations and the booked spend is read at each admission (usage.py).
Docs: docs/ledger.md#budgets.
"""

from __future__ import annotations

import asyncio
import calendar
import datetime as dt
import math
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import redis.asyncio as aioredis

from gateway.config import LoadedConfig, TeamConfig
from gateway.limits import saturating
from gateway.limits.auth import ClientKey
from gateway.limits.prices import CALL_COST_MAX, Prices, served_cost
from gateway.limits.tokens import prompt_bound, prompt_count, unbounded_completion
from gateway.limits.usage import PICO, Counters, UsageStore, day_of, next_month, spend_key, to_midnight, usd
from gateway.ops.metrics import Record
from gateway.state import Degraded, SharedState
from gateway.upstream.plan import Plan
from wire.errors import RateLimitError
from wire.schema import CompletionRequest

_DAY_TTL_S: Final = 3 * 86_400
_MONTH_TTL_S: Final = 33 * 86_400
STREAM_CHECK_EVENTS: Final = 16  # a stream's running cost is looked at every this many events
# A change to a counter (`Budgets._change`): KEYS[1] the counter; ARGV epoch ('' : taken in process, no
# reservation to change), reserved, committed, ttl, fresh (1: the counters hold reservations alone). The spend
# and the reservations stop at the largest 64-bit integer rather than overflow (gateway/limits/saturating.py).
_CHANGE: Final = (
    saturating.ADD_LUA
    + saturating.RESERVE_LUA
    + """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if ARGV[1] ~= '' and epoch == ARGV[1] then
  local reserved = reserve(KEYS[1], ARGV[2])
  if type(reserved) == 'table' then return reserved end
end
if ARGV[3] ~= '0' and (ARGV[5] == '1' or redis.call('HEXISTS', KEYS[1], 'seeded') == 1) then
  local failed = add(KEYS[1], 'committed', ARGV[3])
  if failed then return failed end
end
if epoch then
  redis.call('EXPIRE', KEYS[1], ARGV[4])
end
return 0
"""
)

# What was spent on a budget before this process's counter for it (None: cannot be known now).
Seeder = Callable[["Budget"], Awaitable[int | None]]
# The same for several budgets, asked together (None: cannot be known now).
Reseeder = Callable[[list["Budget"]], Awaitable[list[int] | None]]


def _money(x: float) -> str:
    return f"${x:,.6f}".rstrip("0").rstrip(".")


def budget_refusal(who: str, period: str, limit_pico: int, spent: int, now: float) -> RateLimitError:
    """429 `budget_exceeded` for `who` (`Key 'ci'`, `Team 'red' (key 'ci')`) over its `daily` or `monthly`
    budget, with Retry-After until the period ends (00:00 UTC, or the first of next month)."""
    if period == "daily":
        wait = to_midnight(now)
        when, resume = "today, UTC", f"00:00 UTC, in {wait} s"
    else:
        first = next_month(day_of(now))
        end = dt.datetime(first.year, first.month, 1, tzinfo=dt.UTC).timestamp()
        wait = max(math.ceil(end - now), 1)
        when, resume = "this month, UTC", f"{first.isoformat()} 00:00 UTC, in {wait} s"
    return RateLimitError(
        f"{who} has reached its {period} budget of {_money(usd(limit_pico))} ({_money(usd(spent))} spent {when}); "
        f"requests resume at {resume}",
        code="budget_exceeded",
        retry_after=wait,
    )


class Budget:
    """One budget for one period: the counter's name, the limit, and how to say and seed it. A key's budget
    is counted per key identity (`ClientKey.ident`, column `key_id`), never per name, which a key of another
    config sharing the Redis or the ledger may also hold; `legacy`: the name its rows were booked under
    before rows named their key's identity, still counted."""

    __slots__ = (
        "column",
        "counter",
        "first_day",
        "last_day",
        "legacy",
        "limit_pico",
        "period",
        "who",
        "ttl_s",
        "whose",
    )

    def __init__(
        self, who: str, whose: str, column: str, period: str, first: str, last: str, usd_: float, legacy: str = ""
    ) -> None:
        self.who, self.whose, self.column, self.period = who, whose, column, period
        self.first_day, self.last_day, self.legacy = first, last, legacy
        self.counter = f"budget:{column}:{whose}:{first if period == 'daily' else first[:7]}"
        self.limit_pico = round(usd_ * PICO)
        self.ttl_s = _DAY_TTL_S if period == "daily" else _MONTH_TTL_S


class Hold:
    """What a request reserved: grown while a stream runs past it, settled once with its real cost."""

    __slots__ = ("budgets", "grown", "out_pico", "owner", "prices", "prompt_pico", "settled", "shared", "worst")

    def __init__(
        self,
        owner: Budgets,
        budgets: list[tuple[Budget, str | None]],
        worst: int,
        prices: Prices,
        shared: SharedState,
        prompt_pico: int,
        out_pico: float,
    ) -> None:
        self.owner, self.budgets, self.worst, self.prices, self.shared = owner, budgets, worst, prices, shared
        self.prompt_pico, self.out_pico = prompt_pico, out_pico  # the prompt's worst cost, one output token's
        self.grown = 0  # reserved beyond `worst` by a stream that ran past it
        self.settled = False

    def streamed(self, events: int) -> None:
        """A stream has sent `events` events (at least as many tokens): reserve what it runs past `worst`."""
        if self.settled:
            return
        # No more than the request can be charged in the end (its real cost is capped alike).
        now = min(self.prompt_pico + round(events * self.out_pico), CALL_COST_MAX)
        excess = now - self.worst - self.grown
        if excess > 0:
            self.grown += excess
            self.owner.background(self.owner._grow(self, excess))

    def settle(self, rec: Record) -> None:
        """The request ended: replace the reservation with its real cost (in the background)."""
        if self.settled:
            return
        self.settled = True
        served = bool(rec.provider) and not rec.failed and not rec.cached  # a cached answer costs nothing
        real = served_cost(self.prices, rec) if served else 0
        # This process's own view now, before the request's row is queued for the ledger (`_reseed_due`); Redis's
        # in the background.
        reserved, committed = -(self.worst + self.grown), 0 if self.owner.fresh else real
        self.owner._settle_here(self, reserved, committed)
        self.owner.background(self.owner._settle(self, reserved, committed))


def month_of(day: str) -> tuple[str, str]:
    y, m = int(day[:4]), int(day[5:7])
    return f"{day[:7]}-01", f"{day[:7]}-{calendar.monthrange(y, m)[1]:02d}"


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class Budgets:
    """The budgets of one config; the counters are the process's (shared across a reload)."""

    def __init__(
        self,
        loaded: LoadedConfig,
        counters: Counters,
        seed: Seeder,
        *,
        fresh: bool = False,
        clock: Callable[[], float] = time.time,
        reseed: Reseeder | None = None,
        refresh_s: float = 1.0,
    ) -> None:
        cfg = loaded.config
        self.counters = counters
        self.seed = seed
        # `seed` is read at every admission (the booked spend, kept elsewhere) rather than once, and the
        # counters hold only reservations: without a ledger, the usage counters are what was spent.
        self.fresh = fresh
        self.clock = clock
        # With `reseed`, a counter in process memory is seeded again every `refresh_s` while in use, so that
        # what other processes booked since its seed counts against it; its own spend since then is kept.
        # The counters due are seeded together, one call at a time in the process (`Counters.due`).
        self.reseed = reseed
        self.refresh_ms = round(refresh_s * 1000)
        self.key_day = {k.name: k.max_cost_per_day for k in cfg.keys if k.max_cost_per_day is not None}
        self.key_month = {k.name: k.max_cost_per_month for k in cfg.keys if k.max_cost_per_month is not None}
        self.teams: dict[str, TeamConfig] = dict(cfg.teams)
        self.unbounded_tokens = cfg.caps.budget_max_tokens

    def background(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self.counters.background.add(task)
        task.add_done_callback(self.counters.background.discard)

    def applies(self, key: ClientKey) -> bool:
        name = key.label  # a YAML key's name; never one a runtime key of a team could hold
        team = self.teams.get(key.team or "")  # the key's team now (a runtime key's changes with it)
        return (
            key.max_cost_per_day is not None
            or key.max_cost_per_month is not None
            or name in self.key_day
            or name in self.key_month
            or (team is not None and (team.max_cost_per_day, team.max_cost_per_month) != (None, None))
        )

    def _budgets(self, key: ClientKey, day: str) -> list[Budget]:
        name = key.name
        first, last = month_of(day)
        out = []
        per_day = self.key_day.get(key.label, key.max_cost_per_day)
        if per_day is not None:
            out.append(Budget(f"Key '{name}'", key.ident, "key_id", "daily", day, day, per_day, name))
        per_month = self.key_month.get(key.label, key.max_cost_per_month)
        if per_month is not None:
            out.append(Budget(f"Key '{name}'", key.ident, "key_id", "monthly", first, last, per_month, name))
        team_name = key.team or ""
        team = self.teams.get(team_name)
        if team is not None:
            who = f"Team '{team_name}' (key '{name}')"
            if team.max_cost_per_day is not None:
                out.append(Budget(who, team_name, "team", "daily", day, day, team.max_cost_per_day))
            if team.max_cost_per_month is not None:
                out.append(Budget(who, team_name, "team", "monthly", first, last, team.max_cost_per_month))
        return out

    def worst_case(self, req: CompletionRequest, plan: Plan, prices: Prices) -> tuple[int, int, float]:
        """(worst cost, its prompt's part, one output token's price) over every target the plan may call."""
        n_prompts = prompt_count(req.prompt)
        choices = max(req.n or 1, req.best_of or 1) * n_prompts
        worst = prompt_worst = 0
        out = 0.0
        bounds: dict[tuple[bool, str], int] = {}
        for group in plan.groups:
            for route in group.routes:
                per_choice = req.max_tokens
                if per_choice is None:
                    per_choice = unbounded_completion(route, self.unbounded_tokens)
                bpe = route.adapter.openai_bpe
                counted = (bpe, route.endpoint.model if bpe else "")  # a prompt's bytes are counted once
                prompt = bounds.get(counted)
                if prompt is None:
                    prompt = bounds[counted] = prompt_bound(req.prompt, bpe, route.endpoint.model, req.unrendered)
                cost = prices.cost_pico(route.key, req.model, prompt, per_choice * choices)
                if cost >= worst:
                    worst, prompt_worst = cost, prices.cost_pico(route.key, req.model, prompt, 0)
                out = max(out, float(prices.cost_pico(route.key, req.model, 0, 1)))
        return worst, prompt_worst, out

    async def reserve(
        self, key: ClientKey, req: CompletionRequest, plan: Plan, prices: Prices, shared: SharedState
    ) -> Hold:
        """Reserve the request's worst case on each of its budgets, or raise 429 `budget_exceeded`."""
        now = self.clock()
        budgets = self._budgets(key, day_of(now))
        worst, prompt_pico, out_pico = self.worst_case(req, plan, prices)
        if budgets:
            # More than a whole budget reserves nothing more: admitted only while the counter is under its
            # limit, after it the counter is past it either way. Bounded besides, so that a few of these in
            # flight at once still sum within Redis's 64-bit counters (a `max_tokens` of 2**63 costs more).
            worst = min(worst, max(b.limit_pico for b in budgets), CALL_COST_MAX)
        taken: list[tuple[Budget, str | None]] = []
        try:
            for b in budgets:
                spent, epoch = await self._take(b, worst, shared)
                if spent is not None:
                    raise budget_refusal(b.who, b.period, b.limit_pico, spent, now)
                taken.append((b, epoch))
        except BaseException:
            for b, epoch in taken:
                await self._add(b, -worst, 0, shared, epoch)
            raise
        return Hold(self, taken, worst, prices, shared, prompt_pico, out_pico)

    async def _take(self, b: Budget, worst: int, shared: SharedState) -> tuple[int | None, str | None]:
        """Reserve `worst` on `b`: (None when admitted, else what was committed, the reservation undone;
        the Redis counter's epoch when it was taken there, where it must be given back, None: in process)."""
        if shared.client is not None:
            try:
                return await self._take_redis(b, worst, shared)
            except Degraded:
                pass
        local = self.counters.local
        cell = local.get(b.counter)
        if self.fresh:
            booked = await self.seed(b) or 0
            cell = local.setdefault(b.counter, [0, 0, 1, 0])
            committed = booked
        else:
            if cell is None or not cell[2]:
                seed = await self.seed(b)
                cell = local.setdefault(b.counter, [0, 0, 0, 0])
                if seed is not None and not cell[2]:  # another request may have seeded it meanwhile
                    cell[0] += seed
                    cell[2] = 1
                    cell[3] = _now_ms()
            elif self.reseed is not None and (now := _now_ms()) - cell[3] >= self.refresh_ms:
                cell[3] = now  # due again once this seeding is as old
                counters = self.counters
                counters.due[b.counter] = (b, cell)
                if not counters.reseeding:
                    counters.reseeding = True
                    self.background(self._reseed_due())
            committed = cell[0]
        if committed + cell[1] >= b.limit_pico:
            return committed, None
        cell[1] += worst
        return None, None

    async def _reseed_due(self) -> None:
        """Seed the counters due in process memory again: what the ledger holds now (every process's rows it
        has committed, and this process's still queued), plus what this process settled after it was asked.

        `before` is read in the step that copies this process's queue for the seed (`reseed` runs to its first
        wait before anything else does), and every request's cost reaches the counter before its row is
        queued (`Hold.settle`): each row of this process is then in the seed or in what was settled after
        it, never in both. Counters the ledger cannot seed now keep their value until they are due again."""
        assert self.reseed is not None
        counters = self.counters
        try:
            while counters.due:
                due = list(counters.due.values())
                counters.due.clear()
                before = [cell[0] for _, cell in due]
                seeds = await self.reseed([b for b, _ in due])
                if seeds is None:
                    return
                for (_, cell), was, seed in zip(due, before, seeds, strict=True):
                    cell[0] = seed + (cell[0] - was)
        finally:
            counters.reseeding = False

    async def _take_redis(self, b: Budget, worst: int, shared: SharedState) -> tuple[int | None, str]:
        async def take(r: aioredis.Redis) -> list[Any]:
            # One key, so one node; a Cluster's MULTI broke the request (its connection bound to another loop):
            # there each command is atomic on its own, and the reservation is taken before it is read.
            pipe = r.pipeline(transaction=not shared.cluster)
            # A counter made afresh (first use, or Redis lost it) gets an epoch of its own: changes owed to an
            # earlier one are not applied to it.
            pipe.hsetnx(b.counter, "epoch", os.urandom(8).hex())
            saturating.reserve(pipe, b.counter, worst)  # more than 16 capped reservations in flight pass 64 bits
            pipe.hget(b.counter, "committed")
            pipe.hget(b.counter, "seeded")
            pipe.hget(b.counter, "epoch")
            pipe.expire(b.counter, b.ttl_s)
            out: list[Any] = await pipe.execute()
            return out

        _, after, stored, seeded, raw_epoch, _ = await shared.run(take)
        epoch = raw_epoch.decode() if isinstance(raw_epoch, bytes) else str(raw_epoch)
        await self._pay_owed(b, shared)
        committed = int(stored or 0)
        if self.fresh:
            committed = await self.seed(b) or 0
        elif seeded is None:
            # Redis lost the counter (or never had it): what was spent before is known elsewhere. When it
            # cannot be known now (the ledger is away), the counter stays unseeded and a later request seeds it.
            seed = await self.seed(b)
            if seed is not None:

                async def plant(r: aioredis.Redis) -> int:
                    if await r.hsetnx(b.counter, "seeded", 1):  # a seed of saturated rollups may sum past 64 bits
                        await saturating.add(r, b.counter, "committed", seed)
                    return int(await r.hget(b.counter, "committed") or 0)

                committed = int(await shared.run(plant))
        if committed + int(after) - worst >= b.limit_pico:
            await self._add(b, -worst, 0, shared, epoch)
            return committed, epoch
        return None, epoch

    async def _add(self, b: Budget, reserved: int, committed: int, shared: SharedState, epoch: str | None) -> None:
        """Change a counter: the reservation where it was taken (`epoch`: in Redis, under that epoch), the
        spend in Redis (when its counter has been seeded) and in this process's own view. What Redis cannot
        take now is owed to it and written with the counter's next reservation."""
        self._add_here(b, reserved, committed, epoch)
        await self._add_shared(b, reserved, committed, shared, epoch)

    def _add_here(self, b: Budget, reserved: int, committed: int, epoch: str | None) -> None:
        """`_add`'s change to this process's own view, read while Redis is away (or without it)."""
        cell = self.counters.local.get(b.counter)
        if cell is not None:
            cell[0] += committed
            if epoch is None:
                cell[1] += reserved

    async def _add_shared(
        self, b: Budget, reserved: int, committed: int, shared: SharedState, epoch: str | None
    ) -> None:
        """`_add`'s change to Redis's counter."""
        if epoch is None:
            reserved = 0
        if shared.client is None or not (reserved or committed):
            return
        try:
            await self._change(b, epoch or "", reserved, committed, shared)
        except Degraded:
            owed = self.counters.owed.setdefault(b.counter, {})
            before = owed.get(epoch or "", (b, 0, 0))
            owed[epoch or ""] = (b, before[1] + reserved, before[2] + committed)

    async def _change(self, b: Budget, epoch: str, reserved: int, committed: int, shared: SharedState) -> None:
        """The reservation changes only under the epoch it was taken in (a counter Redis lost and made again
        has lost the reservations with it); the spend only once the counter is seeded (or the counters hold
        reservations alone), since a seed counts it."""
        ttl, fresh = b.ttl_s, int(self.fresh)
        reserved, committed = saturating.bounded(reserved), saturating.bounded(committed)
        await shared.run(lambda r: r.eval(_CHANGE, 1, b.counter, epoch, reserved, committed, ttl, fresh))

    async def _pay_owed(self, b: Budget, shared: SharedState) -> None:
        owed = self.counters.owed.pop(b.counter, None)
        for epoch, (_, reserved, committed) in (owed or {}).items():
            try:
                await self._change(b, epoch, reserved, committed, shared)
            except Degraded:
                self.counters.owed.setdefault(b.counter, {})[epoch] = (b, reserved, committed)

    async def _grow(self, hold: Hold, excess: int) -> None:
        for b, epoch in hold.budgets:
            await self._add(b, excess, 0, hold.shared, epoch)

    def _settle_here(self, hold: Hold, reserved: int, committed: int) -> None:
        for b, epoch in hold.budgets:
            self._add_here(b, reserved, committed, epoch)

    async def _settle(self, hold: Hold, reserved: int, committed: int) -> None:
        for b, epoch in hold.budgets:
            await self._add_shared(b, reserved, committed, hold.shared, epoch)


def usage_budgets(loaded: LoadedConfig, usage: UsageStore) -> Budgets:
    """The budgets of `loaded` without a ledger: seeded from the usage counters (Redis's, or this process's)."""

    async def seeded(b: Budget) -> int | None:
        if b.column == "key_id" and b.period == "daily":
            source = None  # the key's day is its identity's usage hash
        else:
            period = b.first_day if b.period == "daily" else b.first_day[:7]
            source = spend_key(period, "key" if b.column == "key_id" else "team", b.whose)
        return (await usage.spent(b.whose, b.first_day, [source]))[0]

    return Budgets(loaded, usage.counters, seeded, fresh=True, clock=usage.clock)
