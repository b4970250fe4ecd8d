"""Budgets that concurrent requests cannot overshoot: reserve the worst case before the call, settle after.

A budgeted request reserves its worst-case cost (prompt tokens plus max_tokens x choices, at the dearest
target its plan may call) on every budget it falls under: its key's day and month, its team's day and
month. It is admitted while `committed + reserved` (before its own reservation) is under the budget, so
N concurrent first requests together exceed a budget by at most one request's worst case. When it ends,
the reservation is replaced by the real cost. The counters live in Redis (one hash per budget and
period, each changed by atomic HINCRBY) or, without Redis, in process memory; a counter Redis does not
have (a Redis restart, a new process) is first seeded from the ledger's rollups.
"""

from __future__ import annotations

import asyncio
import calendar
import time
from typing import Any, Final

import redis.asyncio as aioredis

from gateway.config import LoadedConfig
from gateway.ledger.book import Ledger
from gateway.ledger.engine import Cursor, LedgerDown
from gateway.limits.auth import ClientKey
from gateway.limits.prices import Prices
from gateway.limits.tokens import reservation
from gateway.limits.usage import PICO, budget_refusal, day_of
from gateway.ops.metrics import Record
from gateway.state import Degraded, SharedState
from gateway.upstream.plan import Plan
from wire.schema import CompletionRequest

_DAY_TTL_S: Final = 3 * 86_400
_MONTH_TTL_S: Final = 33 * 86_400


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
    """What a request reserved: settled once, with its real cost, when it ends."""

    __slots__ = ("budgets", "owner", "prices", "shared", "worst")

    def __init__(self, owner: Budgets, budgets: list[Budget], worst: int, prices: Prices, shared: SharedState) -> None:
        self.owner, self.budgets, self.worst, self.prices, self.shared = owner, budgets, worst, prices, shared

    def settle(self, rec: Record) -> None:
        """The request ended: replace the reservation with its real cost (in the background)."""
        served = bool(rec.provider) and not rec.failed and not rec.cached  # a cached answer costs nothing
        prompt = rec.usage.prompt_tokens if rec.usage is not None else 0
        completion = rec.usage.completion_tokens if rec.usage is not None else 0
        real = self.prices.cost_pico(rec.target, rec.model, prompt, completion) if served else 0
        background = self.owner.counters.background
        task = asyncio.ensure_future(self.owner._settle(self, real, self.shared))
        background.add(task)
        task.add_done_callback(background.discard)


class Counters:
    """The process's counters without Redis (or while Redis is away): counter -> [committed, reserved]."""

    def __init__(self) -> None:
        self.local: dict[str, list[int]] = {}
        self.background: set[asyncio.Task[None]] = set()


def _month(day: str) -> tuple[str, str]:
    y, m = int(day[:4]), int(day[5:7])
    return f"{day[:7]}-01", f"{day[:7]}-{calendar.monthrange(y, m)[1]:02d}"


def _seed(cur: Cursor, b: Budget) -> int:
    sums = "SELECT coalesce(sum(cost_pico), 0) FROM daily WHERE day >= ? AND day <= ?"
    if b.legacy:
        found = cur.rows(
            f"{sums} AND ({b.column} = ? OR ({b.column} = '' AND key_name = ?))",
            (b.first_day, b.last_day, b.whose, b.legacy),
        )
    else:
        found = cur.rows(f"{sums} AND {b.column} = ?", (b.first_day, b.last_day, b.whose))
    return int(found[0][0])


class Budgets:
    """The budgets of one config; the counters are the process's (shared across a reload)."""

    def __init__(self, loaded: LoadedConfig, ledger: Ledger, counters: Counters) -> None:
        cfg = loaded.config
        self.ledger = ledger
        self.counters = counters
        self.key_day = {k.name: k.max_cost_per_day for k in cfg.keys if k.max_cost_per_day is not None}
        self.key_month = {k.name: k.max_cost_per_month for k in cfg.keys if k.max_cost_per_month is not None}
        self.teams = dict(cfg.teams)

    def applies(self, key: ClientKey) -> bool:
        name = key.name
        return (
            key.max_cost_per_day is not None
            or key.max_cost_per_month is not None
            or name in self.key_day
            or name in self.key_month
            or (key.team or "") in self.teams
        )

    def _budgets(self, key: ClientKey, day: str) -> list[Budget]:
        name = key.name
        first, last = _month(day)
        out = []
        per_day = self.key_day.get(name, key.max_cost_per_day)
        if per_day is not None:
            out.append(Budget(f"Key '{name}'", key.ident, "key_id", "daily", day, day, per_day, name))
        per_month = self.key_month.get(name, key.max_cost_per_month)
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

    async def reserve(
        self, key: ClientKey, req: CompletionRequest, plan: Plan, prices: Prices, shared: SharedState
    ) -> Hold:
        """Reserve the request's worst case on each of its budgets, or raise 429 `budget_exceeded`."""
        now = time.time()
        budgets = self._budgets(key, day_of(now))
        worst = 0
        for group in plan.groups:
            for route in group.routes:
                default = route.endpoint.default_max_tokens or route.adapter.default_max_tokens
                prompt, total = reservation(req, route.adapter.openai_bpe, route.endpoint.model, default)
                worst = max(worst, prices.cost_pico(route.key, req.model, prompt, total - prompt))
        taken: list[Budget] = []
        try:
            for b in budgets:
                spent = await self._take(b, worst, shared)
                if spent is not None:
                    raise budget_refusal(b.who, b.period, b.limit_pico, spent, now)
                taken.append(b)
        except BaseException:
            for b in taken:
                await self._add(b, -worst, 0, shared)
            raise
        return Hold(self, budgets, worst, prices, shared)

    async def _seeded(self, b: Budget) -> int:
        try:
            value: int = await self.ledger.call(self.ledger.db.transaction, lambda cur: _seed(cur, b))
        except LedgerDown:
            return 0  # the ledger is away too: count from zero rather than refuse every request
        return value

    async def _take(self, b: Budget, worst: int, shared: SharedState) -> int | None:
        """Reserve `worst` on `b`; None when admitted, else what was committed (the reservation undone)."""
        if shared.client is not None:
            try:
                return await self._take_redis(b, worst, shared)
            except Degraded:
                pass
        local = self.counters.local
        if b.counter not in local:
            seed = await self._seeded(b)
            local.setdefault(b.counter, [seed, 0])
        cell = local[b.counter]
        if cell[0] + cell[1] >= b.limit_pico:
            return cell[0]
        cell[1] += worst
        return None

    async def _take_redis(self, b: Budget, worst: int, shared: SharedState) -> int | None:
        async def take(r: aioredis.Redis) -> list[Any]:
            pipe = r.pipeline(transaction=True)
            pipe.hincrby(b.counter, "reserved", worst)
            pipe.hget(b.counter, "committed")
            pipe.hget(b.counter, "seeded")
            pipe.expire(b.counter, b.ttl_s)
            out: list[Any] = await pipe.execute()
            return out

        after, stored, seeded, _ = await shared.run(take)
        committed = int(stored or 0)
        if seeded is None:
            # Redis lost the counter (or never had it): the ledger knows what was spent.
            seed = await self._seeded(b)

            async def plant(r: aioredis.Redis) -> int:
                if await r.hsetnx(b.counter, "seeded", 1):
                    return int(await r.hincrby(b.counter, "committed", seed))
                return int(await r.hget(b.counter, "committed") or 0)

            committed = int(await shared.run(plant))
        if committed + int(after) - worst >= b.limit_pico:
            await shared.run(lambda r: r.hincrby(b.counter, "reserved", -worst))
            return committed
        return None

    async def _add(self, b: Budget, reserved: int, committed: int, shared: SharedState) -> None:
        if shared.client is not None:

            async def add(r: aioredis.Redis) -> None:
                pipe = r.pipeline(transaction=True)
                pipe.hincrby(b.counter, "reserved", reserved)
                pipe.hincrby(b.counter, "committed", committed)
                pipe.expire(b.counter, b.ttl_s)
                await pipe.execute()

            try:
                await shared.run(add)
                return
            except Degraded:
                pass
        cell = self.counters.local.get(b.counter)
        if cell is not None:
            cell[0] += committed
            cell[1] += reserved

    async def _settle(self, hold: Hold, real: int, shared: SharedState) -> None:
        for b in hold.budgets:
            await self._add(b, -hold.worst, real, shared)
