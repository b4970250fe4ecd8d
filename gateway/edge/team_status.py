"""A team admin's `GET /admin/status` (`teams.<name>.admin_key`): the operator's view narrowed to one team.

It shows the team's keys' usage today and spend per day, the team's buckets and its keys' own with their
headroom, its keys' running batches, and the health of the targets its `models` reach. It leaves out what
is the operator's or other tenants': providers (their reasons name variables and URLs), fleets (replica URLs
and engine load), server queues (every tenant's waiting counts), the response cache's counts, aliases and
targets the team cannot reach, alias, provider and deployment buckets (every tenant's consumption), a
target's in-flight count, latency and why it is unavailable, and why the ledger is down.
Roles: docs/security.md#admin-roles.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, Final

from gateway.batches.service import Batches
from gateway.edge.batch_routes import running_batches
from gateway.edge.status_view import alias_row, limit_rows, redis_state, target_rows, targets, today
from gateway.ledger.report import spend_per_day
from gateway.limits.ratelimit import Bucket
from gateway.path.pipeline import Pipeline

# A target's health, as much as a tenant needs to read an answer's failure: not who else loads it.
_TARGET_FIELDS: Final = ("target", "state", "cooling_ms", "cause", "failures")


def team_buckets(pipeline: Pipeline, team: str) -> list[Bucket]:
    """The team's buckets (`teams.<name>.limits`), then its keys' own in force (YAML and runtime) by name."""
    admission, keys = pipeline.admission, pipeline.keys
    own: list[Bucket] = [b for ident in keys.yaml_idents(team) for b in admission.keys.get(ident, ())]
    runtime = keys.runtime
    if runtime is not None:
        seen: set[str] = set()
        for key in runtime.by_digest.values():  # a rotated key is there twice (both secrets) during its grace
            if key.team == team and key.ident not in seen:
                seen.add(key.ident)
                own += key.buckets
    own.sort(key=lambda b: b.scope)  # stable: each scope's kinds stay in the config's order
    return [*admission.teams.get(team, ()), *own]


async def team_status(
    pipeline: Pipeline, team: str, batches: Batches | None, unreachable: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """What team `team`'s admin sees on the status page; `unreachable` as for the operator's `status`."""
    ceiling = pipeline.keys.ceilings.get(team)

    def may(model: str) -> bool:
        return ceiling is None or ceiling.match(model)

    down = {**(unreachable or {}), **pipeline.router.unavailable_providers()}
    rows = await target_rows(pipeline, targets(pipeline, down, may))
    ledger = pipeline.ledger
    body: dict[str, Any] = {
        "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "team": team,
        "redis": redis_state(pipeline.shared),
        "ledger": "disabled" if ledger is None else "ok" if ledger.trouble is None else "unavailable",
        "aliases": [alias_row(a) for a in pipeline.loaded.config.models if may(a.name)],
        "targets": [{f: row[f] for f in _TARGET_FIELDS} for row in rows],
        "limits": await limit_rows(pipeline, team_buckets(pipeline, team)),
        "usage": await today(pipeline, team),
        "spend_per_day": None if ledger is None else await spend_per_day(ledger, 30, team),
    }
    if batches is not None:
        body["batches"] = await running_batches(batches, pipeline.keys, team)
    return body


__all__ = ["team_buckets", "team_status"]
