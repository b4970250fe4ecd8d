"""Usage accounting and daily budgets: requests, tokens and cost per key, per model and per UTC day.

Every answered request is booked once, when it ends, in the background; cost is kept as integer
picodollars so sums are exact across replicas. With Redis one hash per key and day, else process memory
merged into Redis later. Budgets are checked after authorization against today's booked spend. Rows,
storage and the overshoot rule: docs/operations.md.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import fnmatch
import math
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import msgspec
import redis.asyncio as aioredis

from gateway.config import LoadedConfig, PriceConfig
from gateway.ops.metrics import Metrics, ModelLabels, Record
from gateway.state import Degraded, SharedState
from wire.errors import RateLimitError

ANONYMOUS: Final = "anonymous"  # the key name booked when no keys are configured (the gateway is open)
TTL_S: Final = 40 * 86_400
PICO: Final = 10**12  # picodollars per dollar
_DAY_S: Final = 86_400
_CACHE_LIMIT: Final = 4096
_CACHED_CHARS: Final = 512  # longer (target, model) pairs are priced without being remembered
_GLOB: Final = re.compile(r"[*?\[]")
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


def _money(x: float) -> str:
    return f"${x:,.6f}".rstrip("0").rstrip(".")


class Prices:
    """Price lookup: the served target (`provider/model[/deployment]`) and then the model the request
    was booked under (an alias), each by exact key first; only then glob keys, in config order."""

    def __init__(self, prices: Mapping[str, PriceConfig]) -> None:
        self.exact = dict(prices)
        self.globs = [(re.compile(fnmatch.translate(k)), p) for k, p in prices.items() if _GLOB.search(k)]
        self._cache: dict[tuple[str, str], PriceConfig | None] = {}

    def find(self, target: str, model: str) -> PriceConfig | None:
        cache_key = (target, model)
        if cache_key in self._cache:
            return self._cache[cache_key]
        found = self.exact.get(target) or self.exact.get(model)
        if found is None:
            found = next((p for pattern, p in self.globs for m in (target, model) if pattern.match(m)), None)
        if len(target) + len(model) > _CACHED_CHARS:
            return found  # the names are the client's: long ones would make the bounded cache large anyway
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[cache_key] = found
        return found

    def cost_pico(self, target: str, model: str, prompt_tokens: int, completion_tokens: int) -> int:
        price = self.find(target, model)
        if price is None:
            return 0
        # USD per 1M tokens = 1e6 picodollars per token.
        return round(prompt_tokens * price.prompt_per_1m * 1e6 + completion_tokens * price.completion_per_1m * 1e6)


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


def redis_key(day: str, key: str) -> str:
    return f"usage:{day}:{key}"


def index_key(day: str) -> str:
    return f"usage:{day}"


async def _write_per_slot(r: aioredis.Redis, batch: dict[tuple[str, str], Fields]) -> None:
    """A Redis Cluster has no transaction across hash slots: the day indexes first (idempotent), then one
    MULTI per hash (one slot), each taken out of `batch` once written, so a failure keeps only the rest."""
    pipe = r.pipeline(transaction=False)
    for d, k in batch:
        pipe.sadd(index_key(d), k)
        pipe.expire(index_key(d), TTL_S)
    await pipe.execute()
    for (d, k), f in list(batch.items()):
        tx = r.pipeline(transaction=True)
        for name, value in f.items():
            if value:
                tx.hincrby(redis_key(d, k), name, value)
        tx.expire(redis_key(d, k), TTL_S)
        await tx.execute()
        del batch[(d, k)]


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
        self.key_names = [k.name for k in cfg.keys]
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
        self._background: set[asyncio.Task[None]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._cost: dict[tuple[str, str], Any] = {}  # per (model label, key): its cost series
        self._names: dict[str, tuple[str, ...]] = {}  # per model label: its booking's field names, as `_KINDS`

    def adopt(self, previous: UsageStore) -> None:
        """Take over the in-process bookings of the store this one replaces (a config reload), sharing them
        with it, so that requests still finishing on the old config book into the same place."""
        _merge(previous.local, self.local)
        self.local = previous.local

    def today(self) -> str:
        return day_of(self.clock())

    # ---------------------------------------------------------------------------------------- booking

    def book(self, rec: Record) -> None:
        """Book a finished request (off the request path). Requests no target served book nothing."""
        if not rec.provider or rec.failed:  # a failed request names the target that failed; none served it
            return
        key = rec.key or ANONYMOUS
        prompt = rec.usage.prompt_tokens if rec.usage is not None else 0
        completion = rec.usage.completion_tokens if rec.usage is not None else 0
        # A cached answer cost no upstream tokens: booked as a request, with its stored usage, at cost 0.
        pico = 0 if rec.cached else self.prices.cost_pico(rec.target, rec.model, prompt, completion)
        rec.cost_pico = pico
        model = rec.label
        if model is None:
            model = rec.label = self.labels.fold(rec.model)
        metrics = self.metrics
        if metrics is not None:
            # The series exists from the key's first request on; adding nothing (a cached answer, no prices)
            # is skipped: `labels()` and `inc` are a lock and several calls each.
            cost = self._cost.get((model, key))
            if cost is None:
                if len(self._cost) >= _CACHE_LIMIT:
                    self._cost.clear()
                cost = self._cost[(model, key)] = metrics.cost.labels(model, key)
            if pico:
                cost.inc(usd(pico))
        names = self._names.get(model)
        if names is None:
            if len(self._names) >= _CACHE_LIMIT:
                self._names.clear()
            names = self._names[model] = tuple(f"{kind}:{model}" for kind in _KINDS)
        day = day_of(self.clock())
        into = self.local.get((day, key))
        if into is None:
            self._keep(day, key, {})  # a new day or key: yesterday's leftovers pruned first
            into = self.local[(day, key)]
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
        if self.shared.client is not None and self._timer is None:
            # Bookings gather here and reach Redis in one transaction every FLUSH_S: a round trip per
            # request cost a saturated worker about 15 % of its time. Reads add what is still waiting.
            self._timer = asyncio.get_running_loop().call_later(FLUSH_S, self._flush_soon)

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
        if not self.local:
            return
        batch: dict[tuple[str, str], Fields] = {}
        _merge(batch, self.local)
        self.local.clear()

        async def write(r: aioredis.Redis) -> None:
            if self.shared.cluster:
                await _write_per_slot(r, batch)
                return
            pipe = r.pipeline(transaction=True)
            for (d, k), f in batch.items():
                for name, value in f.items():
                    if value:
                        pipe.hincrby(redis_key(d, k), name, value)
                pipe.expire(redis_key(d, k), TTL_S)
                pipe.sadd(index_key(d), k)
                pipe.expire(index_key(d), TTL_S)
            await pipe.execute()

        try:
            await self.shared.run(write)
        except Degraded:
            for (d, k), f in batch.items():
                self._keep(d, k, f)

    async def drain(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            if self.shared.client is not None:
                await self._flush()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    # ---------------------------------------------------------------------------------------- reading

    async def spent_pico(self, key: str, day: str) -> int:
        """What `key` has spent on `day`, in picodollars: one HGET (plus anything not yet in Redis)."""
        waiting = self.local.get((day, key), {}).get(TOTAL, 0)
        if self.shared.client is None:
            return waiting
        try:
            raw = await self.shared.run(lambda r: r.hget(redis_key(day, key), TOTAL))
        except Degraded:
            return waiting
        return int(raw or 0) + waiting

    async def report(self, day: str) -> DayUsage:
        """Every key's usage on `day`: configured keys (zero when unused) and any other key booked that day."""
        merged: dict[str, Fields] = {name: {} for name in self.key_names}
        if self.shared.client is not None:

            async def read(r: aioredis.Redis) -> dict[str, Fields]:
                names = sorted(n.decode() if isinstance(n, bytes) else n for n in await r.smembers(index_key(day)))
                pipe = r.pipeline(transaction=False)
                for name in names:
                    pipe.hgetall(redis_key(day, name))
                hashes = await pipe.execute()
                return {n: {k.decode(): int(v) for k, v in h.items()} for n, h in zip(names, hashes, strict=True)}

            try:
                for name, fields in (await self.shared.run(read)).items():
                    _add(merged.setdefault(name, {}), fields)
            except Degraded:
                pass
        for (d, name), fields in self.local.items():
            if d == day:
                _add(merged.setdefault(name, {}), fields)
        return DayUsage(day=day, keys={n: _summarize(f, self.budgets.get(n)) for n, f in merged.items()})

    # ---------------------------------------------------------------------------------------- budgets

    async def check(self, key: str, runtime_budget: float | None = None) -> None:
        """Refuse a key at or over today's budget (429 `budget_exceeded`, Retry-After: next 00:00 UTC).
        `runtime_budget`: a runtime key's own (gateway/ledger/keys.py)."""
        budget = self.budgets.get(key, runtime_budget)
        if budget is None:
            return
        now = self.clock()
        spent = await self.spent_pico(key, day_of(now))
        if spent < round(budget * PICO):
            return
        wait = to_midnight(now)
        raise RateLimitError(
            f"Key '{key}' has reached its daily budget of {_money(budget)} ({_money(usd(spent))} spent today, "
            f"UTC); requests resume at 00:00 UTC, in {wait} s",
            code="budget_exceeded",
            retry_after=wait,
        )
