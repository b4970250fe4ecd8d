"""Model resolution: `alias` | `vendor/model_name` | `vendor/model_name/deployment` -> a Route.

Compiled once from the config. An alias wins; otherwise the first segment names a provider; the last
segment is a deployment only if that provider declares a deployment of that name, otherwise it is part
of the model name (model names contain slashes: `accounts/fireworks/models/...`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from gateway.config import LoadedConfig, ProviderConfig, Scope, replica_tag, same_target_of
from gateway.fleet.picker import Fleet, shared_name
from gateway.fleet.tenancy import SALT_FIELD
from gateway.upstream.plan import Group, Plan, Policy, Route
from providers import REGISTRY
from providers.base import Adapter, Endpoint, LocalAdapter
from wire.errors import ModelNotFoundError

_CACHE_LIMIT: Final = 4096


class Router:
    def __init__(self, loaded: LoadedConfig) -> None:
        cfg = loaded.config
        self._loaded = loaded
        self._providers = loaded.providers
        self._adapters: dict[str, Adapter | LocalAdapter] = {
            name: REGISTRY[p.kind]().configure(p.max_logprobs, p.max_n) for name, p in loaded.providers.items()
        }
        # Each provider with `replicas:`, one Fleet: its policy and its drain and engine-load state.
        self.fleets = {
            name: Fleet(name, p.replicas, p.routing, p.prefix_scope)
            for name, p in loaded.providers.items()
            if p.replicas
        }
        # Each provider's prefix-cache salt scope, where its adapter sends the gateway's salt and its
        # `prefix_scope` keeps tenants apart: its routes' attempts salt each request for its tenant.
        self._salts: dict[str, Scope] = {
            name: p.prefix_scope
            for name, p in loaded.providers.items()
            if p.prefix_scope != "shared" and salts(self._adapters[name])
        }
        # Whether a request's tenant is read (pipeline.py's Hint): a fleet places by it, a salt is made of it.
        self.hints = bool(self.fleets or self._salts)
        self._drop = {
            name: (p.unsupported_params or cfg.unsupported_params) == "drop" for name, p in loaded.providers.items()
        }
        # Routes for direct model strings are memoized; the bound keeps client-chosen strings from growing it.
        self._cache: dict[str, Route] = {}
        # Each alias's own targets; which one serves a request is the balancer's choice
        # (gateway/resilience/balancer.py).
        self.aliases: dict[str, Group] = {}
        groups = self.aliases
        for alias in cfg.models:
            routes = [self._direct(t.model) for t in alias.targets]
            groups[alias.name] = Group(routes, [t.weight for t in alias.targets], alias.strategy)
        self._plans: dict[str, Plan] = {}
        for alias in cfg.models:
            policy = Policy(
                retries=alias.retries or cfg.retries,
                timeouts=alias.timeouts or cfg.timeouts,
                resume_streams=alias.resume_streams,
                hedge_after_ms=alias.hedge_after_ms,
                same_target=alias.retries.same_target if alias.retries else None,
            )
            main = [groups[alias.name]] + [self._group(ref, groups) for ref in alias.fallbacks]
            ctx = [self._group(ref, groups) for ref in alias.context_window_fallbacks]
            self._plans[alias.name] = Plan(
                groups=main,
                policy=policy,
                context_groups=ctx,
            )
        self._direct_plans: dict[str, Plan] = {}
        self._model_plans: dict[str, Plan] = {}  # the same plans, by the direct string asked for
        # GET /v1/models, built on first use and again when the discovery publishes new lists.
        self._listed: list[tuple[str, str]] | None = None
        self._listed_from: Mapping[str, Sequence[str]] | None = None
        self._unreachable_from: Mapping[str, str] | None = None

    def _group(self, ref: str, groups: dict[str, Group]) -> Group:
        if ref in groups:
            return groups[ref]
        return Group([self._direct(ref)], [1.0])

    def plan(self, model: str) -> Plan:
        """The alias's compiled plan, or a one-route plan for `vendor/model[/deployment]`."""
        found = self._plans.get(model)
        if found is not None:
            return found
        found = self._model_plans.get(model)  # a direct string asked for before: one probe, no `resolve`
        if found is not None:
            return found
        route = self.resolve(model)
        found = self._direct_plans.get(route.key)
        if found is None:
            p = self._providers[route.provider]
            cfg = self._loaded.config
            policy = Policy(retries=p.retries or cfg.retries, timeouts=p.timeouts or cfg.timeouts)
            found = Plan(groups=[Group([route], [1.0])], policy=policy)
            if len(self._direct_plans) >= _CACHE_LIMIT:
                self._direct_plans.clear()
                self._model_plans.clear()  # every string that names a route keeps that route's one plan
            self._direct_plans[route.key] = found
        if len(self._model_plans) >= _CACHE_LIMIT:
            self._model_plans.clear()
        self._model_plans[model] = found
        return found

    def resolve(self, model: str) -> Route:
        """The route of a direct `vendor/model_name[/deployment]` string (aliases go through `plan`)."""
        route = self._cache.get(model)
        if route is None:
            route = self._direct(model)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[model] = route
        return route

    def identity(self, target: str) -> str:
        """The name a target's health goes by, in Redis and in this process: the server it calls, not its place in
        the config. A replica's puts its URL's hash in place of its position (`shared_name`); any other target's
        puts the hash of the URL it calls after its provider (`vendor@<hash>/model`, as a replica of that URL
        would be named), so that a reload pointing a provider at another server, or a process pointing it
        elsewhere, starts that server clean. A target that calls no URL (an in-process kind) keeps its own name."""
        vendor, _, rest = target.partition("/")
        if "@" in vendor:
            return shared_name(self.fleets, target)
        try:
            endpoint = self._direct(target).endpoint
        except ModelNotFoundError:
            return target
        if not endpoint.base_url:
            return target
        server = endpoint.base_url if endpoint.region is None else f"{endpoint.base_url} {endpoint.region}"
        return f"{vendor}@{replica_tag(server)}/{rest}"

    def _direct(self, model: str) -> Route:
        vendor, _, rest = model.partition("/")
        pcfg = self._providers.get(vendor)
        if pcfg is None or not rest:
            raise ModelNotFoundError(model)
        name, deployment = rest, None
        head, sep, last = rest.rpartition("/")
        if sep and head and last in pcfg.deployments:
            name, deployment = head, last
        key = f"{vendor}/{name}" + (f"/{deployment}" if deployment else "")
        fleet = self.fleets.get(vendor)
        salt = self._salts.get(vendor)
        replicas = tuple(
            Route(
                key=f"{replica}/{name}",
                provider=vendor,
                adapter=self._adapters[vendor],
                endpoint=self._endpoint(vendor, pcfg, name, None, url),
                drop_unsupported=self._drop[vendor],
                unavailable=self._unavailable(vendor, pcfg, None),
                same_target=same_target_of(pcfg.retries, self._loaded.config.retries),
                salt=salt,
            )
            for replica, url in (zip(fleet.names, fleet.urls, strict=True) if fleet is not None else ())
        )
        return Route(
            key=key,
            provider=vendor,
            adapter=self._adapters[vendor],
            endpoint=self._endpoint(vendor, pcfg, name, deployment),
            drop_unsupported=self._drop[vendor],
            unavailable=self._unavailable(vendor, pcfg, deployment),
            same_target=same_target_of(pcfg.retries, self._loaded.config.retries),
            replicas=replicas,
            fleet=fleet,
            salt=salt,
        )

    def _endpoint(
        self, vendor: str, p: ProviderConfig, model: str, deployment: str | None, replica: str | None = None
    ) -> Endpoint:
        d = p.deployments.get(deployment) if deployment else None
        adapter = self._adapters[vendor]
        base = (
            (d.base_url if d and d.base_url else None)
            or replica
            or p.base_url
            or getattr(adapter, "default_base_url", None)
        )
        return Endpoint(
            provider=vendor,
            model=(d.name if d and d.name else model) if adapter.deployment_renames_model else model,
            base_url=base or "",
            api_key=(d.api_key if d and d.api_key else None) or p.api_key or None,
            deployment=deployment,
            api_version=(d.api_version if d and d.api_version else None) or p.api_version,
            headers=p.headers,
            default_max_tokens=p.default_max_tokens,
            region=p.region,
        )

    def _unavailable(self, vendor: str, p: ProviderConfig, deployment: str | None) -> str | None:
        # An unset base_url variable counts too: otherwise the route would silently fall back to the
        # provider's public default URL (or the provider's own URL, for a deployment).
        paths = [f"providers.{vendor}.base_url", f"providers.{vendor}.api_key"]
        if deployment:
            dep = p.deployments[deployment]
            if dep.base_url is not None:
                paths[0] = f"providers.{vendor}.deployments.{deployment}.base_url"
            if dep.api_key is not None:
                paths[1] = f"providers.{vendor}.deployments.{deployment}.api_key"
        missing = [v for path in paths for v in self._loaded.missing_for(path)]
        if missing:
            return f"Provider '{vendor}' is unavailable: environment variable {missing[0]} is not set"
        key = p.deployments[deployment].api_key if deployment else None
        if self._adapters[vendor].needs_api_key and not (key or p.api_key):
            # Calling without credentials would only earn an upstream 401; say what is missing instead.
            return f"Provider '{vendor}' is unavailable: it has no api_key configured"
        return None

    def unavailable_providers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, p in self._providers.items():
            reason = self._unavailable(name, p, None)
            if reason:
                out[name] = reason
        return out

    def model_ids(
        self,
        discovered: Mapping[str, Sequence[str]] | None = None,
        unreachable: Mapping[str, str] | None = None,
    ) -> list[tuple[str, str]]:
        """(model id, owner) for GET /v1/models: what a request can be served by now.

        Aliases with at least one callable target or fallback, the callable alias targets, then each
        available provider's declared `models:` and what it said it serves (`discovered`, provider ->
        `provider/<id>` strings, gateway/edge/discovery.py). A provider that cannot be called contributes
        nothing: its key variable is unset, or the discovery found nobody listening at its URL
        (`unreachable`, provider -> reason). Memoized per `discovered` and `unreachable` value (the
        discovery publishes new ones when they change); callers must not change the list.
        """
        if self._listed is not None and discovered is self._listed_from and unreachable is self._unreachable_from:
            return self._listed
        down = set(self.unavailable_providers()) | set(unreachable or ())
        seen = self._static_ids(down)
        for name, ids in (discovered or {}).items():
            if name in self._providers and name not in down:
                for m in ids:
                    seen.setdefault(m, name)
        self._listed, self._listed_from, self._unreachable_from = list(seen.items()), discovered, unreachable
        return self._listed

    def _static_ids(self, down: set[str]) -> dict[str, str]:
        def callable_(r: Route) -> bool:
            return r.unavailable is None and r.provider not in down

        seen: dict[str, str] = {}
        for name, plan in self._plans.items():
            if any(callable_(r) for g in plan.groups for r in g.routes):
                seen.setdefault(name, "gateway")
        for alias_cfg in self._loaded.config.models:
            for t, route in zip(alias_cfg.targets, self.aliases[alias_cfg.name].routes, strict=True):
                if callable_(route):
                    seen.setdefault(t.model, t.model.partition("/")[0])
        for name, p in self._providers.items():
            if name not in down:
                for m in p.models:
                    seen.setdefault(f"{name}/{m}", name)
        return seen


def salts(adapter: Adapter | LocalAdapter) -> bool:
    """Whether the adapter sends the canonical prefix-cache salt to its engine as it is, on every route it has
    (its parameter tables take the field, written under its own name): then the gateway may set it."""
    tables = [adapter.params, getattr(adapter, "chat_params", None) or adapter.params]
    for table in tables:
        rule = table.get(SALT_FIELD)
        if rule is None or rule.emulated or rule.apply is not None or rule.to not in (None, SALT_FIELD):
            return False
    return True
