"""Settings that are each within their own bounds but contradict another, or name nothing that is defined.

Found at load as one (YAML path, problem) pair, as every other config error: a timeout longer than the call it
is part of, a backoff starting above its cap, a key of a team nobody declared, an alias that falls back to
itself. A value the operator left unset is never the culprit: `timeouts: {total_ms: 30000}` keeps the default
`first_byte_ms` (120000), which the shorter total simply cuts short. Each block replaces the one below it whole
(docs/resilience.md), so only the keys written in the file (`data`, as parsed) are held to the one beside them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any, Final, Protocol

from gateway.config.patterns import ModelNames
from gateway.config.schema import GatewayConfig, ProviderConfig, TeamConfig
from providers.registry import REGISTRY

# How the fair queue names a team's share when `queue.fair_by: team` (a key's goes by its label): no key may.
TEAM_PREFIX: Final = "team:"

Problem = tuple[str, str]
# The priority classes, lowest first: a `priority` above its `max_priority` is refused.
RANK = {"low": 0, "normal": 1, "high": 2}


def non_finite(node: Any, path: str = "") -> Problem | None:
    """The first `.inf`, `-.inf` or `.nan` anywhere in the parsed file (YAML also reads `1.0e+400` as `.inf`):
    no setting means anything by them (a weight, a price, a budget, a share), and a NaN compares false with
    every bound, so a field's own range would let some through or refuse them with a misleading reason."""
    if isinstance(node, float) and not math.isfinite(node):
        shown = ".nan" if math.isnan(node) else (".inf" if node > 0 else "-.inf")
        return path or "(top level)", f"must be a finite number, got {shown}"
    if isinstance(node, dict):
        for k, v in node.items():
            if (found := non_finite(v, f"{path}.{k}" if path else str(k))) is not None:
                return found
    if isinstance(node, list):
        for i, v in enumerate(node):
            if (found := non_finite(v, f"{path}[{i}]")) is not None:
                return found
    return None


def _written(data: Any, *keys: str | int) -> Mapping[str, Any]:
    """The mapping at `keys` in the parsed file, or an empty one: what the operator wrote in that block."""
    for key in keys:
        if isinstance(data, dict):
            data = data.get(key)
        elif isinstance(data, list) and isinstance(key, int) and key < len(data):
            data = data[key]
        else:
            return {}
    return data if isinstance(data, dict) else {}


def _blocks(cfg: GatewayConfig, providers: Mapping[str, ProviderConfig], field: str) -> Iterator[tuple[str, Any]]:
    """(YAML path, block) of `field` at the top level, in each provider and in each alias, where it is set."""
    yield field, getattr(cfg, field)
    for name, p in providers.items():
        if getattr(p, field) is not None:
            yield f"providers.{name}.{field}", getattr(p, field)
    for i, alias in enumerate(cfg.models):
        if getattr(alias, field) is not None:
            yield f"models[{i}].{field}", getattr(alias, field)


def _raw(data: Any, path: str) -> Mapping[str, Any]:
    """The parsed mapping of a block path made by `_blocks` (`providers.<name>.x`, `models[<i>].x`, `x`)."""
    if path.startswith("providers."):
        name, _, field = path[len("providers.") :].rpartition(".")
        return _written(data, "providers", name, field)
    if path.startswith("models["):
        index, _, field = path[len("models[") :].partition("].")
        return _written(data, "models", int(index), field)
    return _written(data, path)


Pair = tuple[str, float, str, float, str]  # (YAML path, its value, the bound's name, the bound, why it binds)
# A day's spend is part of its month's: a daily budget above the monthly one is never what stops the requests.
_DAY = ": it is never reached"


def _pairs(cfg: GatewayConfig, providers: Mapping[str, ProviderConfig], data: Any) -> Iterator[Pair]:
    """Each written setting that may not exceed another, with that other; `block_problem` refuses the first above."""
    for path, t in _blocks(cfg, providers, "timeouts"):
        for phase in ("connect_ms", "first_byte_ms", "stream_idle_ms"):
            if phase in _raw(data, path):
                yield f"{path}.{phase}", getattr(t, phase), "total_ms", t.total_ms, ", which bounds the whole call"
    for path, r in _blocks(cfg, providers, "retries"):
        if "initial_backoff_ms" in _raw(data, path):
            yield f"{path}.initial_backoff_ms", r.initial_backoff_ms, "max_backoff_ms", r.max_backoff_ms, ""
    if "base_ms" in _written(data, "cooldown"):
        yield "cooldown.base_ms", cfg.cooldown.base_ms, "max_ms", cfg.cooldown.max_ms, ""
    for path, c in _blocks(cfg, providers, "cache"):
        # The memory store keeps nothing larger than its whole bound (the top-level `max_bytes`): a larger entry
        # cap promises entries it drops at once. Redis's bound is its own; `store: redis` without a `redis.url`
        # is the memory store.
        if "max_entry_bytes" in _raw(data, path) and (c.store == "memory" or not cfg.redis.url):
            bound = cfg.cache.max_bytes
            yield f"{path}.max_entry_bytes", c.max_entry_bytes, "the memory store's bound cache.max_bytes", bound, ""
    if "batch_rows" in _written(data, "ledger"):
        yield "ledger.batch_rows", cfg.ledger.batch_rows, "queue_rows", cfg.ledger.queue_rows, ": it is never reached"
    for name, t in cfg.teams.items():
        if t.max_cost_per_day is not None and t.max_cost_per_month is not None:
            yield f"teams.{name}.max_cost_per_day", t.max_cost_per_day, "max_cost_per_month", t.max_cost_per_month, _DAY
    for i, alias in enumerate(cfg.models):
        if alias.hedge_after_ms is not None:
            total = (alias.timeouts or cfg.timeouts).total_ms
            yield f"models[{i}].hedge_after_ms", alias.hedge_after_ms, "total_ms", total, ": no hedge would start"


def block_problem(cfg: GatewayConfig, providers: Mapping[str, ProviderConfig], data: Any) -> Problem | None:
    """The first written setting above the bound beside it: a phase timeout above `total_ms`, a first backoff or
    cooldown above its cap, a cache entry cap above the store's bound, a threshold past the bound it would act
    before (`batch_rows`, a daily budget, `hedge_after_ms`)."""
    for path, value, name, bound, why in _pairs(cfg, providers, data):
        if value > bound:
            return path, f"{_shown(value)} is above {name} {_shown(bound)}{why}"
    return None


def _shown(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"  # 0.05, 60; never 2.68435e+08 for a byte count


def name_problem(cfg: GatewayConfig, providers: Mapping[str, ProviderConfig]) -> Problem | None:
    """The first empty name (an alias, a client key, a team, a deployment) or reference to a name that is not
    defined (a key's team), or an alias that falls back to itself (it would only retry its own targets)."""
    for name, p in providers.items():
        for d, dc in p.deployments.items():
            if not d.strip():
                return f"providers.{name}.deployments.{d}", "a deployment name may not be empty"
            if dc.name is not None and not dc.name.strip():
                return f"providers.{name}.deployments.{d}.name", "may not be empty (unset: the deployment's key)"
    aliases = {alias.name for alias in cfg.models}
    refs = [("tokenizer.default_model", cfg.tokenizer.default_model)] if cfg.tokenizer.default_model else []
    for i, alias in enumerate(cfg.models):
        refs += [(f"models[{i}].targets[{j}].model", t.model) for j, t in enumerate(alias.targets)]
        for field in ("fallbacks", "context_window_fallbacks"):
            refs += [(f"models[{i}].{field}[{j}]", ref) for j, ref in enumerate(getattr(alias, field))]
    for path, ref in refs:
        if ref not in aliases and (problem := _deployment_problem(ref, providers)) is not None:
            return path, problem
    for i, alias in enumerate(cfg.models):
        if not alias.name.strip():
            return f"models[{i}].name", "an alias name may not be empty"
        for field in ("fallbacks", "context_window_fallbacks"):
            for j, ref in enumerate(getattr(alias, field)):
                if ref == alias.name:
                    return f"models[{i}].{field}[{j}]", f"a fallback cycle: alias {ref!r} falls back to itself"
    names = model_names(cfg, providers)
    for model in cfg.prices:
        if not model.strip():
            return f"prices.{model}", "a price's model string (or glob) may not be empty"
        if (problem := names.problem(model, "price")) is not None:
            return f"prices.{model}", f"never applies: {problem}"
    for team_name, team in cfg.teams.items():
        if not team_name.strip():
            return f"teams.{team_name}", "a team name may not be empty"
        if team.priority and team.max_priority and RANK[team.priority] > RANK[team.max_priority]:
            return (
                f"teams.{team_name}.priority",
                f"{team.priority!r} is above the team's max_priority {team.max_priority!r}",
            )
        for j, pattern in enumerate(team.models):
            if (problem := names.problem(pattern)) is not None:
                return f"teams.{team_name}.models[{j}]", f"the team could never call it: {problem}"
    for i, key in enumerate(cfg.keys):
        if (found := key_problem(key, cfg.teams, names)) is not None:
            return f"keys[{i}].{found[0]}", found[1]
    return None


class KeyFields(Protocol):
    """What `key_problem` reads of a client key: a YAML one (`KeyConfig`) or one made at runtime."""

    @property
    def name(self) -> str: ...
    @property
    def team(self) -> str | None: ...
    @property
    def max_cost_per_day(self) -> float | None: ...
    @property
    def max_cost_per_month(self) -> float | None: ...
    @property
    def priority(self) -> str | None: ...
    @property
    def max_priority(self) -> str | None: ...
    @property
    def models(self) -> list[str]: ...


def key_problem(key: KeyFields, teams: Mapping[str, TeamConfig], names: ModelNames) -> Problem | None:
    """The first of a client key's settings that contradicts another or the `teams:` it names, as (its field,
    why): an empty name, a model pattern no request could match (`names`: what the config routes), an
    undeclared team, a daily budget above the monthly, a default priority above the highest it may ask for
    (each unset one its team's, else `normal`). The config's `keys[]` and `POST /admin/keys` both refuse what
    this finds, so a runtime key is held to what a YAML key is."""
    if not key.name.strip():
        return "name", "a key name may not be empty"
    if key.name.startswith(TEAM_PREFIX):  # the fair queue's name for a team's share (`queue.fair_by: team`)
        return "name", f"a key name may not begin with {TEAM_PREFIX!r}: a team's share of the queue goes by it"
    for j, pattern in enumerate(key.models):
        if (problem := names.problem(pattern)) is not None:
            return f"models[{j}]", f"the key could never call it: {problem}"
    team = teams.get(key.team) if key.team is not None else None
    if key.team is not None and team is None:
        return "team", f"no team {key.team!r} under teams: (declare it there; `{{}}` sets no budget)"
    day, month = key.max_cost_per_day, key.max_cost_per_month
    if day is not None and month is not None and day > month:
        return "max_cost_per_day", f"{_shown(day)} is above max_cost_per_month {_shown(month)}{_DAY}"
    asks = key.priority or (team.priority if team else None) or "normal"
    most = key.max_priority or (team.max_priority if team else None) or "normal"
    if RANK[asks] > RANK[most]:
        return "priority", f"{asks!r} is above the key's max_priority {most!r}"
    return None


def _deployment_problem(ref: str, providers: Mapping[str, ProviderConfig]) -> str | None:
    """Why `vendor/model[/deployment]` can never be called when its provider has no URL but its deployments'
    (its kind has no public default): only a string ending in one of them reaches a server."""
    vendor, _, rest = ref.partition("/")
    p = providers.get(vendor)
    if p is None or not p.deployments or p.base_url or p.replicas or not REGISTRY[p.kind].needs_base_url:
        return None
    head, sep, last = rest.rpartition("/")
    if sep and head and last in p.deployments:
        return None
    names = ", ".join(p.deployments)
    return f"{ref!r} names no deployment of provider {vendor!r}, which has no base_url of its own ({names})"


def model_names(cfg: GatewayConfig, providers: Mapping[str, ProviderConfig]) -> ModelNames:
    """What the config routes, for its model patterns: its aliases and providers, and the models of each
    provider that lists them and asks its upstream for none (its models cannot appear at run time)."""
    listed: dict[str, list[str]] = {}
    for name, p in providers.items():
        listing = REGISTRY[p.kind].model_listing if p.kind in REGISTRY else None
        discovers = cfg.discovery.enabled and listing is not None and (listing[1] if p.discover is None else p.discover)
        if p.models and not discovers:
            listed[name] = p.models + [f"{m}/{d}" for m in p.models for d in p.deployments]
    return ModelNames((a.name for a in cfg.models), {n: len(p.replicas) for n, p in providers.items()}, listed)


def model_warnings(cfg: GatewayConfig, providers: Mapping[str, ProviderConfig]) -> list[Problem]:
    """Each model pattern that routes but matches none of the models its providers list, when those lists are
    all there is (no discovery): a WARNING at load, not a refusal, since routing needs no listing."""
    names = model_names(cfg, providers)
    found: list[Problem] = []
    for i, key in enumerate(cfg.keys):
        for j, pattern in enumerate(key.models):
            if (why := names.unlisted(pattern)) is not None:
                found.append((f"keys[{i}].models[{j}]", why))
    for name, team in cfg.teams.items():
        for j, pattern in enumerate(team.models):
            if (why := names.unlisted(pattern)) is not None:
                found.append((f"teams.{name}.models[{j}]", why))
    for model in cfg.prices:
        if (why := names.unlisted(model, "price")) is not None:
            found.append((f"prices.{model}", why))
    return found
