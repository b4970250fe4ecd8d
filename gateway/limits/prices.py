"""Prices: what an answer cost, from the config's `prices` (USD per million prompt and completion tokens).

A cost is integer picodollars, kept in 64-bit columns (the ledger's BIGINT) and counters (Redis). The config
bounds a price (a dollar a token at most), but the token counts are the upstream's: one call's cost is
therefore capped at `CALL_COST_MAX` (about $576,000), logged once per target when it binds, so that its row
and its budget charge always fit, many of them to a counter. Docs: docs/operations.md#prices.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from collections.abc import Mapping
from typing import Final

from gateway.config import PriceConfig
from gateway.ops.metrics import Record

_CACHE_LIMIT: Final = 4096
_CACHED_CHARS: Final = 512  # longer (target, model) pairs are priced without being remembered
_GLOB: Final = re.compile(r"[*?\[]")
# The most one call (and one request, its calls together) costs, in picodollars: 2**59, about $576,000, as a
# budget's largest reservation, so that 16 of them still sum within a signed 64-bit counter.
CALL_COST_MAX: Final = 2**59
_CAPPED_NAMED: Final = 64  # targets whose capped cost was logged, at most (the rest are not named again)

log = logging.getLogger("gateway")


class Prices:
    """Price lookup: the served target (`provider/model[/deployment]`) and then the model the request
    was booked under (an alias), each by exact key first; only then glob keys, in config order."""

    def __init__(self, prices: Mapping[str, PriceConfig]) -> None:
        self.exact = dict(prices)
        self.globs = [(re.compile(fnmatch.translate(k)), p) for k, p in prices.items() if _GLOB.search(k)]
        self._cache: dict[tuple[str, str], PriceConfig | None] = {}
        self._capped: set[str] = set()

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
        cost = prompt_tokens * price.prompt_per_1m * 1e6 + completion_tokens * price.completion_per_1m * 1e6
        return round(cost) if cost < CALL_COST_MAX else CALL_COST_MAX

    def capped(self, target: str, cost: int, prompt_tokens: int, completion_tokens: int) -> int:
        """A served request's real `cost`, at most `CALL_COST_MAX`; one WARNING per target (per process) when
        that binds: the spend booked and charged is less than its tokens at its price."""
        if cost < CALL_COST_MAX:
            return cost
        if target not in self._capped and len(self._capped) < _CAPPED_NAMED:
            self._capped.add(target)
            log.warning(
                "prices: a request to %s (%d prompt, %d completion tokens) costs more than one request may be "
                "booked at, $%d; booked and charged at that",
                target,
                prompt_tokens,
                completion_tokens,
                CALL_COST_MAX // 10**12,
            )
        return CALL_COST_MAX


def served_cost(prices: Prices, rec: Record) -> int:
    """A served request's cost in picodollars: its usage at its target's price; a resumed stream's parts
    streamed elsewhere (`rec.parts`) each at its own target's, the rest at the target that finished it; and
    the calls it paid for and did not use (`rec.lost`, hedges that lost) each at its own target's."""
    usage = rec.usage
    prompt = usage.prompt_tokens if usage is not None else 0
    completion = usage.completion_tokens if usage is not None else 0
    parts = rec.parts
    lost = 0 if rec.lost is None else sum(lost_cost(prices, rec))
    if parts is None:
        cost = prices.cost_pico(rec.target, rec.model, prompt, completion) + lost
    else:
        # The finishing target was sent the text streamed before it as prompt, and generated the rest.
        before = sum(part[2] for part in parts)
        earlier = sum(prices.cost_pico(target, rec.model, p, c) for target, p, c in parts)
        cost = earlier + prices.cost_pico(rec.target, rec.model, prompt + before, max(completion - before, 0)) + lost
    return prices.capped(rec.target, cost, prompt, completion)


def lost_cost(prices: Prices, rec: Record) -> list[int]:
    """Each unused call's cost (`rec.lost`), priced at its own target and kept on it for the ledger's row."""
    out = []
    for call in rec.lost or ():
        call.cost_pico = prices.cost_pico(call.target, rec.model, call.prompt_tokens, call.completion_tokens)
        out.append(call.cost_pico)
    return out
