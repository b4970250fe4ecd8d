"""The cache's counts per model, gathered between two flushes of the metrics' `Tally` (gateway/ops/metrics.py).

A lookup adds to plain numbers on its model's `Series`; the tally, which holds the series among its
pending ones, calls `inc` at most a second later (and before every render), and only then are the
labelled series and the cache's totals (`Cache.counts`, what `/admin/status` shows) added to.
"""

from __future__ import annotations

from typing import Any

from gateway.cache.policy import COALESCED, HIT, MISS
from gateway.ops.metrics import Metrics


class Series:
    """One model's cache counts not yet added to its labelled series: the lookups per state and the bytes
    stored. The metrics' `Tally` holds it among its pending series and calls `inc` when it flushes, so a
    lookup adds to plain numbers here; the totals (`Cache.counts`, shared across reloads) are added then too."""

    __slots__ = ("label", "metrics", "totals", "lookups", "stored")

    def __init__(self, label: str, metrics: Metrics, totals: dict[str, int]) -> None:
        self.label = label  # `Record.model` folded into its label value, once
        self.metrics = metrics
        self.totals = totals
        self.lookups: dict[str, int] = {}  # per state (hit, miss, coalesced, bypass)
        self.stored = 0

    def inc(self, _: float) -> None:
        lookups, stored, totals, metrics = self.lookups, self.stored, self.totals, self.metrics
        self.lookups, self.stored = {}, 0
        for state, count in lookups.items():
            totals[state] += count
            metrics.cache_requests.labels(state, self.label).inc(count)
        if stored:
            metrics.cache_stored_bytes.labels(self.label).inc(stored)


def stats(cache: Any) -> dict[str, Any]:
    """What `/admin/status` shows of the cache (service.py `Cache`): its totals, hit rate and stores."""
    if cache.metrics is not None:
        cache.metrics.tally.flush()  # the lookups counted since the last flush reach `counts`
    counts = cache.counts
    served = counts[HIT] + counts[COALESCED]
    looked = served + counts[MISS]
    entries, size = cache.memory.size()
    return {
        **counts,
        "hit_rate": round(served / looked, 4) if looked else 0.0,
        "memory_entries": entries,
        "memory_bytes": size,
        "memory_max_bytes": cache.memory.max_bytes,
        "evictions": cache.memory.evictions,
        "redis_not_entries": cache.redis.corrupt if cache.redis is not None else 0,
        "redis_refused_writes": cache.redis.refused if cache.redis is not None else 0,
    }


__all__ = ["Series", "stats"]
