"""Usage accounting: requests, tokens and cost per key, per model and per UTC day.

Every answered request is booked once, when it ends, in the background; cost is kept as integer
picodollars so sums are exact across replicas. With Redis one hash per key and day, else process memory
merged into Redis later. A key's counters are its identity's (`ClientKey.ident`), never its name's: a key
of another config sharing the Redis may be named alike; reports show names. Without a ledger, budgets
(gateway/limits/budgets.py) read the spend booked here and the request's reservation is settled as it is
booked. Rows and storage: docs/operations.md.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol, cast

import msgspec
import redis.asyncio as aioredis

from gateway.config import LoadedConfig
from gateway.limits import saturating
from gateway.limits.auth import fingerprint
from gateway.limits.prices import CALL_COST_MAX, Prices, served_cost
from gateway.ops.metrics import Metrics, ModelLabels, Record
from gateway.state import Degraded, SharedState

ANONYMOUS: Final = "anonymous"  # the key name booked when no keys are configured (the gateway is open)
TTL_S: Final = 40 * 86_400
PICO: Final = 10**12  # picodollars per dollar
_DAY_S: Final = 86_400
_CACHE_LIMIT: Final = 4096
_KINDS: Final = ("requests", "prompt_tokens", "completion_tokens", "cost_pico", "cached")
TOTAL: Final = "cost_pico"  # the key's whole-day spend, the field a budget check reads

Fields = dict[str, int]

_day_cache: tuple[int, str] = (-1, "")


def day_of(now: float) -> str:
    """The UTC day (YYYY-MM-DD) of a Unix time (formatted once per day: it is asked on every request)."""
    global _day_cache
    day = int(now // 86400)
    if _day_cache[0] != day:
        _day_cache = (day, dt.datetime.fromtimestamp(day * 86400, dt.UTC).strftime("%Y-%m-%d"))
    return _day_cache[1]


def to_midnight(now: float) -> int:
    """Whole seconds from `now` until the next 00:00 UTC (Unix time has no leap seconds: days are 86400 s)."""
    return max(math.ceil(_DAY_S - now % _DAY_S), 1)


def usd(pico: int) -> float:
    return pico / PICO


def next_month(day: str) -> dt.date:
    """The first day of the month after `day`'s (YYYY-MM-DD)."""
    y, m = int(day[:4]), int(day[5:7])
    return dt.date(y + m // 12, m % 12 + 1, 1)


class ModelUsage(msgspec.Struct):
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    cached: int = 0  # of `requests`, answered from the response cache (at cost 0)


class KeyUsage(msgspec.Struct):
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    cached: int = 0
    budget: float | None = None  # keys[].max_cost_per_day
    by_model: dict[str, ModelUsage] = msgspec.field(default_factory=dict)


class DayUsage(msgspec.Struct):
    day: str
    keys: dict[str, KeyUsage]


def _summarize(fields: Mapping[str, int], budget: float | None) -> KeyUsage:
    per: dict[str, dict[str, int]] = {}
    for name, value in fields.items():
        kind, sep, model = name.partition(":")
        if sep and kind in _KINDS:
            per.setdefault(model, {})[kind] = value
    out = KeyUsage(budget=budget)
    for model in sorted(per):
        v = per[model]
        m = ModelUsage(
            requests=v.get("requests", 0),
            prompt_tokens=v.get("prompt_tokens", 0),
            completion_tokens=v.get("completion_tokens", 0),
            cost=usd(v.get("cost_pico", 0)),
            cached=v.get("cached", 0),
        )
        out.by_model[model] = m
        out.requests += m.requests
        out.cached += m.cached
        out.prompt_tokens += m.prompt_tokens
        out.completion_tokens += m.completion_tokens
    out.cost = usd(fields.get(TOTAL, 0))
    return out


def _add(into: Fields, fields: Mapping[str, int]) -> None:
    for name, value in fields.items():
        into[name] = into.get(name, 0) + value


def _merge(into: dict[tuple[str, str], Fields], other: Mapping[tuple[str, str], Fields]) -> None:
    for day_key, fields in other.items():
        _add(into.setdefault(day_key, {}), fields)


FLUSH_S = 0.5


def redis_key(day: str, ident: str) -> str:
    return f"usage:{day}:{ident}"


def index_key(day: str) -> str:
    """The day's keys: a hash of each booked key identity to its name (what reports show)."""
    return f"usage-keys:{day}"


def spend_key(period: str, kind: str, name: str) -> str:
    """A period's spend counter (picodollars): `spend:2026-11:key:<key identity>`, `spend:2026-11-27:team:red`."""
    return f"spend:{period}:{kind}:{name}"


def _fields(pipe: Any, name: str, fields: Fields) -> None:
    """Add `fields` to the hash `name`: its spend stopping at 64 bits (`saturating`), its counts as they are."""
    for field, value in fields.items():
        if not value:
            continue
        if field.startswith(TOTAL):
            saturating.add(pipe, name, field, value)
        else:
            pipe.hincrby(name, field, value)


async def _write_per_slot(r: aioredis.Redis, batch: dict[tuple[str, str], Fields], names: Mapping[str, str]) -> None:
    """A Redis Cluster has no transaction across hash slots: the day indexes first (idempotent), then one
    MULTI per hash (one slot), each taken out of `batch` once written, so a failure keeps only the rest."""
    pipe = r.pipeline(transaction=False)
    for d, k in batch:
        pipe.hset(index_key(d), k, names.get(k, k))
        pipe.expire(index_key(d), TTL_S)
    await pipe.execute()
    for (d, k), f in list(batch.items()):
        tx = r.pipeline(transaction=True)
        _fields(tx, redis_key(d, k), f)
        tx.expire(redis_key(d, k), TTL_S)
        await tx.execute()
        del batch[(d, k)]


class Settles(Protocol):
    """A budget reservation (gateway/limits/budgets.py `Hold`), settled when its request is booked."""

    def settle(self, rec: Record) -> None: ...


class Counters:
    """The process's budget counters (gateway/limits/budgets.py) without Redis, or while it is away:
    counter -> [committed, reserved, seeded, when it was last seeded (monotonic ms)]; shared by every config a
    reload builds."""

    def __init__(self) -> None:
        self.local: dict[str, list[int]] = {}
        self.background: set[asyncio.Task[None]] = set()
        # counter -> epoch -> (its budget, reserved, committed) that Redis could not take when they changed:
        # written with the counter's next reservation, so that a Redis outage leaks no reservation.
        self.owed: dict[str, dict[str, tuple[Any, int, int]]] = {}
        # counter -> (its budget, its cell): due to be seeded again from the ledger; one seeding runs at a
        # time in the process (`reseeding`), whichever config's budgets started it, so that two never
        # overlap on one counter.
        self.due: dict[str, tuple[Any, list[int]]] = {}
        self.reseeding = False


class UsageStore:
    def __init__(
        self,
        loaded: LoadedConfig,
        shared: SharedState,
        *,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        cfg = loaded.config
        self.prices = Prices(cfg.prices)
        self.budgets: dict[str, float] = {
            k.name: k.max_cost_per_day for k in cfg.keys if k.max_cost_per_day is not None
        }
        # This config's keys, by identity (a key whose secret is unset, which never books, by its name).
        self.own = {fingerprint(k.key.encode()) if k.key else "-" + k.name: k.name for k in cfg.keys}
        self.key_names = list(self.own.values())
        # Without a ledger, monthly and team budgets (gateway/limits/budgets.py) read these counters, booked
        # like the day's usage (with the ledger its rollups seed them instead and `ledgered` is set).
        self.key_month = {k.name: k.max_cost_per_month for k in cfg.keys if k.max_cost_per_month is not None}
        self.team_of = {k.name: k.team for k in cfg.keys if k.team}
        self.teams = {n: t for n, t in cfg.teams.items() if (t.max_cost_per_day, t.max_cost_per_month) != (None, None)}
        self.guarded = {n for n in self.key_names if n in self.budgets or n in self.key_month}
        self.guarded |= {n for n, team in self.team_of.items() if team in self.teams}
        self.ledgered = False
        self.shared = shared
        self.metrics = metrics
        self.labels = ModelLabels(loaded)
        if metrics is not None:
            # The store of the config in force names the rows, and the metrics' labels with them.
            metrics.bind(self.labels)
        self.clock = clock
        # (day, key) -> fields. Without Redis this is the store; with Redis, bookings that could not reach it yet.
        # Only ever mutated in place, so that a reloaded config's store can share it (`adopt`).
        self.local: dict[tuple[str, str], Fields] = {}
        # spend_key -> picodollars: without Redis the counters themselves, with it what has not reached it yet.
        # Shared with a reloaded config's store, like `local`.
        self.spend: dict[str, int] = {}
        self.names: dict[str, str] = {}  # per key identity booked in `local`: its name (shared like `local`)
        # Batches on their way to Redis: still read here, or a read meanwhile finds them nowhere (shared too).
        self.writing: list[tuple[dict[tuple[str, str], Fields], dict[str, int]]] = []
        self._counters: dict[str, tuple[str, tuple[str, ...]]] = {}  # ident -> (day, its counters that day)
        self._background: set[asyncio.Task[None]] = set()
        self.counters = Counters()  # without a ledger, the budgets' (gateway/limits/budgets.py)
        self._timer: asyncio.TimerHandle | None = None
        self._cost: dict[tuple[str, str], Any] = {}  # per (model label, key): its cost series
        self._names: dict[str, tuple[str, ...]] = {}  # per model label: its booking's field names, as `_KINDS`

    def adopt(self, previous: UsageStore) -> None:
        """Take over the in-process bookings of the store this one replaces (a config reload), sharing them
        with it, so that requests still finishing on the old config book into the same place."""
        _merge(previous.local, self.local)
        self.local = previous.local
        for name, pico in self.spend.items():
            previous.spend[name] = previous.spend.get(name, 0) + pico
        self.spend = previous.spend
        self.writing = previous.writing
        # In place: the budgets of this config already hold `self.counters`.
        self.counters.local, self.counters.background = previous.counters.local, previous.counters.background
        self.counters.owed = previous.counters.owed
        previous.names.update(self.names)
        self.names = previous.names

    def today(self) -> str:
        return day_of(self.clock())

    def book(self, rec: Record) -> None:
        """Book a finished request (off the request path). Requests no target served book nothing."""
        hold = rec.hold
        if hold is not None:  # a budgeted request: its reservation becomes its real cost, served or not
            rec.hold = None
            cast(Settles, hold).settle(rec)
        if not rec.provider or rec.failed:  # a failed request names the target that failed; none served it
            return
        key = rec.key or ANONYMOUS
        ident = (rec.key_id or key) if rec.key is not None else ANONYMOUS
        prompt = rec.usage.prompt_tokens if rec.usage is not None else 0
        completion = rec.usage.completion_tokens if rec.usage is not None else 0
        # A cached answer cost no upstream tokens: booked as a request, with its stored usage, at cost 0.
        if rec.cached:
            pico = 0
        elif rec.parts is None and rec.lost is None:  # no call more than the price's on every request
            pico = self.prices.cost_pico(rec.target, rec.model, prompt, completion)
            if pico == CALL_COST_MAX:
                pico = self.prices.capped(rec.target, pico, prompt, completion)  # said once
        else:
            pico = served_cost(self.prices, rec)
        # The request's own cost (its ledger row's); the calls it did not use are rows of their own. Capped
        # (`CALL_COST_MAX`), the calls it did not use may take it all.
        rec.cost_pico = pico
        if rec.lost is not None:
            rec.cost_pico = max(pico - sum(call.cost_pico for call in rec.lost), 0)
            prompt += sum(call.prompt_tokens for call in rec.lost)
            completion += sum(call.completion_tokens for call in rec.lost)
        model = rec.label
        if model is None:
            model = rec.label = self.labels.fold(rec.model)
        metrics = self.metrics
        if metrics is not None:
            # The series exists from the key's first request on; adding nothing (a cached answer, no prices)
            # is skipped: `labels()` and `inc` are a lock and several calls each.
            cost = self._cost.get((model, ident))
            if cost is None:
                if len(self._cost) >= _CACHE_LIMIT:
                    self._cost.clear()
                # Two teams' runtime keys of one name are two series (`team/name`), as in the operator's reports.
                cost = self._cost[(model, ident)] = metrics.cost.labels(model, rec.key_label or key)
            if pico:
                cost.inc(usd(pico))
        names = self._names.get(model)
        if names is None:
            if len(self._names) >= _CACHE_LIMIT:
                self._names.clear()
            names = self._names[model] = tuple(f"{kind}:{model}" for kind in _KINDS)
        day = day_of(self.clock())
        into = self.local.get((day, ident))
        if into is None:
            self._keep(day, ident, {})  # a new day or key: yesterday's leftovers pruned first
            into = self.local[(day, ident)]
            if len(self.names) >= _CACHE_LIMIT:
                self.names.clear()
            self.names[ident] = key
        # `_add` inlined, with the field names made once per model: this runs on every request.
        requests, prompt_tokens, completion_tokens, cost_pico, cached = names
        get = into.get
        into[requests] = get(requests, 0) + 1
        into[prompt_tokens] = get(prompt_tokens, 0) + prompt
        into[completion_tokens] = get(completion_tokens, 0) + completion
        into[cost_pico] = get(cost_pico, 0) + pico
        into[TOTAL] = get(TOTAL, 0) + pico
        if rec.cached:
            into[cached] = get(cached, 0) + 1
        if pico and rec.key is not None and not self.ledgered:
            spend = self.spend
            for counter in self._spend_counters(rec.key, ident, day):
                spend[counter] = spend.get(counter, 0) + pico
        if self.shared.client is not None and self._timer is None:
            # Bookings gather here and reach Redis in one transaction every FLUSH_S: a round trip per
            # request cost a saturated worker about 15 % of its time. Reads add what is still waiting.
            self._timer = asyncio.get_running_loop().call_later(FLUSH_S, self._flush_soon)

    def _spend_counters(self, key: str, ident: str, day: str) -> tuple[str, ...]:
        """The counters a booking of `key` (identity `ident`) adds to: its month, and its team's day and month
        (whether or not a budget is set now, so one a reload sets later counts what was spent before it)."""
        known = self._counters.get(ident)
        if known is not None and known[0] == day:
            return known[1]
        month = day[:7]
        team = self.team_of.get(key)
        counters: tuple[str, ...] = (spend_key(month, "key", ident),)
        if team is not None:
            counters += (spend_key(day, "team", team), spend_key(month, "team", team))
        self._counters[ident] = (day, counters)
        # A new day: counters of past periods no longer decide anything.
        for stale in [c for c in self.spend if c.split(":", 2)[1] not in (day, month)]:
            del self.spend[stale]
        return counters

    def _flush_soon(self) -> None:
        self._timer = None
        task = asyncio.ensure_future(self._flush())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _keep(self, day: str, key: str, fields: Mapping[str, int]) -> None:
        if (day, key) not in self.local:
            oldest = day_of(self.clock() - TTL_S)
            for stale in [dk for dk in self.local if dk[0] < oldest]:
                del self.local[stale]
        _add(self.local.setdefault((day, key), {}), fields)

    async def _flush(self) -> None:
        if not self.local and not self.spend:
            return
        batch: dict[tuple[str, str], Fields] = {}
        _merge(batch, self.local)
        self.local.clear()
        spend = dict(self.spend)
        self.spend.clear()
        names = dict(self.names)
        self.writing.append(flight := (batch, spend))

        async def write(r: aioredis.Redis) -> None:
            if self.shared.cluster:
                await _write_per_slot(r, batch, names)
                for name, pico in list(spend.items()):  # one key each: atomic on its own
                    tx = r.pipeline(transaction=True)
                    saturating.add(tx, name, "", pico)
                    tx.expire(name, TTL_S)
                    await tx.execute()
                    del spend[name]
                return
            pipe = r.pipeline(transaction=True)
            for (d, k), f in batch.items():
                _fields(pipe, redis_key(d, k), f)
                pipe.expire(redis_key(d, k), TTL_S)
                pipe.hset(index_key(d), k, names.get(k, k))
                pipe.expire(index_key(d), TTL_S)
            for name, pico in spend.items():
                saturating.add(pipe, name, "", pico)
                pipe.expire(name, TTL_S)
            await pipe.execute()

        try:
            await self.shared.run(write)
        except Degraded:
            for (d, k), f in batch.items():
                self._keep(d, k, f)
            for name, pico in spend.items():
                self.spend[name] = self.spend.get(name, 0) + pico
        finally:
            self.writing.remove(flight)

    def _waiting(self, day: str, ident: str, source: str | None = None) -> int:
        """What this process booked on `day` for `ident` (or for the spend counter `source`) not yet in Redis."""
        if source is not None:
            return self.spend.get(source, 0) + sum(spend.get(source, 0) for _, spend in self.writing)
        return sum(f.get((day, ident), {}).get(TOTAL, 0) for f in [self.local, *(b for b, _ in self.writing)])

    async def drain(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            if self.shared.client is not None:
                await self._flush()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    # ---------------------------------------------------------------------------------------- reading

    async def spent_pico(self, ident: str, day: str) -> int:
        """What the key `ident` has spent on `day`, in picodollars: one HGET (plus anything not yet in Redis)."""
        waiting = self._waiting(day, ident)
        if self.shared.client is None:
            return waiting
        try:
            raw = await self.shared.run(lambda r: r.hget(redis_key(day, ident), TOTAL))
        except Degraded:
            return waiting
        return int(raw or 0) + waiting

    async def report(self, day: str) -> DayUsage:
        """Every key's usage on `day` by name: configured keys (zero when unused) and any other key booked that
        day; a key named like one listed before it (another config's, sharing the Redis) as `name (identity)`."""
        merged: dict[str, Fields] = {ident: {} for ident in self.own}
        names = dict(self.own)
        if self.shared.client is not None:

            async def read(r: aioredis.Redis) -> tuple[dict[Any, Any], list[dict[Any, Any]]]:
                index = await r.hgetall(index_key(day))
                pipe = r.pipeline(transaction=False)
                for ident in index:
                    pipe.hgetall(redis_key(day, _text(ident)))
                return index, await pipe.execute()

            try:
                index, hashes = await self.shared.run(read)
                for (ident, name), fields in zip(index.items(), hashes, strict=True):
                    names.setdefault(_text(ident), _text(name))
                    _add(merged.setdefault(_text(ident), {}), {_text(k): int(v) for k, v in fields.items()})
            except Degraded:
                pass
        for (d, ident), fields in [*self.local.items(), *(kv for b, _ in self.writing for kv in b.items())]:
            if d == day:
                names.setdefault(ident, self.names.get(ident, ident))
                _add(merged.setdefault(ident, {}), fields)
        keys: dict[str, KeyUsage] = {}
        for ident in sorted(merged, key=lambda i: (i not in self.own, names[i], i)):
            name = names[ident]
            budget = self.budgets.get(name) if ident in self.own else None
            keys[name if name not in keys else f"{name} ({ident})"] = _summarize(merged[ident], budget)
        return DayUsage(day=day, keys=keys)

    # ---------------------------------------------------------------------------------------- budgets

    async def spent(self, ident: str, day: str, sources: list[str | None]) -> list[int]:
        """Each source's spend: Redis's (one round trip) plus what this process has not written there yet."""
        waiting = [self._waiting(day, ident, s) for s in sources]
        if self.shared.client is None:
            return waiting

        async def read(r: aioredis.Redis) -> list[bytes | str | None]:
            pipe = r.pipeline(transaction=False)  # a Cluster sends each key to its node
            for s in sources:
                if s is None:
                    pipe.hget(redis_key(day, ident), TOTAL)
                else:
                    pipe.get(s)
            out: list[bytes | str | None] = await pipe.execute()
            return out

        try:
            stored = await self.shared.run(read)
        except Degraded:
            return waiting
        return [int(v or 0) + w for v, w in zip(stored, waiting, strict=True)]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
