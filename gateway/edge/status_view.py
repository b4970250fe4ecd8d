"""What `GET /admin/status` shows the operator (`status`), and the parts a team admin's narrowed view
(gateway/edge/team_status.py) is made of: today's usage, targets and their health, rate-limit headroom.

Every part reads state without changing it: bucket headroom is a peek (no charge), health a snapshot.
Fields: docs/operations.md#admin-endpoints.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gateway.config import AliasConfig
from gateway.edge.drain import state as fleet_state
from gateway.ledger.engine import LedgerDown
from gateway.ledger.report import day_usage, spend_per_day
from gateway.limits.ratelimit import Bucket
from gateway.limits.usage import DayUsage
from gateway.path.pipeline import Pipeline
from gateway.state import SharedState
from gateway.upstream.plan import Route


def team_day(usage: DayUsage, names: Iterable[str]) -> DayUsage:
    """A day's usage without a ledger (by key name) narrowed to a team's keys in force (`names`)."""
    ours = set(names)
    return DayUsage(day=usage.day, keys={n: u for n, u in usage.keys.items() if n in ours})


async def today(pipeline: Pipeline, team: str | None = None) -> Any:
    """The status page's "Usage today": the ledger's books when there is one (with `unavailable` while it
    cannot be read), else the usage store's; with a `team`, its keys' alone."""
    day = pipeline.usage.today()
    roster = pipeline.keys.roster(team)
    if pipeline.ledger is None:
        usage = await pipeline.usage.report(day)
        return usage if team is None else team_day(usage, roster)
    try:
        return await day_usage(pipeline.ledger, day, roster, team)
    except LedgerDown as exc:
        # The driver's words may name the database's host: the operator's to read, not a team's.
        why = f"the ledger is unavailable: {exc}" if team is None else "the ledger is unavailable"
        return {"day": day, "keys": {}, "unavailable": why}


def ledger_state(pipeline: Pipeline) -> str:
    """`disabled`, `ok`, or `unavailable: <why>` (the database and its driver's error: `/ready` says less)."""
    if pipeline.ledger is None:
        return "disabled"
    trouble = pipeline.ledger.trouble
    return "ok" if trouble is None else f"unavailable: {trouble}"


def redis_state(shared: SharedState) -> str:
    return "disabled" if not shared.configured else "degraded" if shared.degraded else "ok"


def targets(
    pipeline: Pipeline, down: Mapping[str, str], may: Callable[[str], bool] | None = None
) -> dict[str, str | None]:
    """The targets the config names (alias targets, direct fallbacks, then each provider's advertised
    models), each with why it cannot be called now, or None; with `may` (a team's `models`), those a request
    to a model it may call can reach: its aliases' targets and fallbacks, and the advertised models it names."""
    cfg = pipeline.loaded.config
    router = pipeline.router
    aliases = {a.name for a in cfg.models}
    seen: dict[str, str | None] = {}

    def add(route: Route) -> None:
        seen.setdefault(route.key, route.unavailable or down.get(route.provider))
        for replica in route.replicas:  # a replicated provider's replicas are targets of their own
            add(replica)

    for alias in cfg.models:
        if may is not None and not may(alias.name):
            continue
        for route in router.aliases[alias.name].routes:
            add(route)
        for ref in (*alias.fallbacks, *alias.context_window_fallbacks):
            if ref not in aliases:
                add(router.resolve(ref))
            elif may is not None:  # an alias fallen back on serves the team's requests, whatever its name
                for route in router.aliases[ref].routes:
                    add(route)
    for name, p in pipeline.loaded.providers.items():
        for model in p.models:
            if may is not None and not may(f"{name}/{model}"):
                continue
            seen.setdefault(f"{name}/{model}", down.get(name))
            if p.replicas:
                add(router.resolve(f"{name}/{model}"))
    return seen


async def target_rows(pipeline: Pipeline, names: Mapping[str, str | None]) -> list[dict[str, Any]]:
    """Each target of `names` (target -> why it cannot be called, or None) with its health now."""
    health = await pipeline.health.snapshot(list(names))
    rows = []
    for name, reason in names.items():
        h = health[name]
        # A target nothing can call is not "ok", however healthy its (empty) record looks.
        state = "unavailable" if reason else "cooling" if h.cooling_ms > 0 else "recovering" if h.recovering else "ok"
        rows.append(
            {
                "target": name,
                "state": state,
                "reason": reason,
                "cooling_ms": h.cooling_ms,
                "cause": h.cause,
                "failures": h.failures,
                "inflight": h.inflight,
                "latency_ms": None if h.latency_ms is None else round(h.latency_ms, 1),
            }
        )
    return rows


def alias_row(a: AliasConfig) -> dict[str, Any]:
    return {
        "name": a.name,
        "strategy": a.strategy,
        "targets": [{"model": t.model, "weight": t.weight} for t in a.targets],
        "fallbacks": a.fallbacks,
        "context_window_fallbacks": a.context_window_fallbacks,
    }


async def limit_rows(pipeline: Pipeline, buckets: list[Bucket]) -> list[dict[str, Any]]:
    """Each bucket's headroom now: a peek at its stored state, charging nothing."""
    return [
        {
            "scope": s.bucket.scope,
            "kind": s.bucket.kind,
            "limit": s.bucket.limit,
            "remaining": s.remaining,
            "reset_ms": s.reset_ms,
        }
        for s in await pipeline.admission.limiter.peek(buckets)
    ]


def _buckets(pipeline: Pipeline) -> list[Bucket]:
    a = pipeline.admission
    return [b for scope in (a.keys, a.teams, a.models, a.providers, a.deployments) for bs in scope.values() for b in bs]


async def status(pipeline: Pipeline, unreachable: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What the status page shows the operator; `unreachable`: the providers the discovery found nobody
    listening for."""
    loaded = pipeline.loaded
    unavailable = {**(unreachable or {}), **pipeline.router.unavailable_providers()}
    providers = [
        {
            "name": name,
            "kind": p.kind,
            "available": name not in unavailable,
            "reason": unavailable.get(name),
            "models": p.models,
        }
        for name, p in loaded.providers.items()
    ]
    return {
        "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "redis": redis_state(pipeline.shared),
        "ledger": ledger_state(pipeline),
        "providers": providers,
        "aliases": [alias_row(a) for a in loaded.config.models],
        "targets": await target_rows(pipeline, targets(pipeline, unavailable)),
        "limits": await limit_rows(pipeline, _buckets(pipeline)),
        "usage": await today(pipeline),
        "cache": pipeline.cache.stats() if pipeline.cache is not None else None,
        "spend_per_day": None if pipeline.ledger is None else await spend_per_day(pipeline.ledger, 30),
        "fleets": {name: fleet_state(fleet) for name, fleet in pipeline.router.fleets.items()},
        "queues": await pipeline.queues.status() if pipeline.queues is not None else [],
    }


__all__ = [
    "alias_row",
    "ledger_state",
    "limit_rows",
    "redis_state",
    "status",
    "target_rows",
    "targets",
    "team_day",
    "today",
]
