"""Admission: which limits a request touches, reserving them, and settling them afterwards.

Scopes (key, team, alias, provider, deployment) are compiled once from the config; tokens are reserved as an
estimate and reconciled with the upstream's usage in the background. Which scope is charged when:
docs/ratelimits.md.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Final

import msgspec

from gateway.config import LimitsConfig, LoadedConfig
from gateway.limits.auth import ClientKey, fingerprint
from gateway.limits.rateheaders import Lines, as_text, labels_of, rate_headers, reply_headers
from gateway.limits.ratelimit import TOKEN_KINDS, Bucket, BucketSet, Decision, Limiter, RedisDown
from gateway.limits.refusal import refusal, team_scope
from gateway.limits.reserve import shared_view, warn_one_at_a_time
from gateway.limits.settles import Corrections
from gateway.limits.tokens import over_limit, reservation, unbounded_completion, warm
from gateway.state import Degraded, SharedState
from gateway.upstream.plan import Plan, Route
from providers import REGISTRY
from wire.errors import GatewayError, InvalidRequestError, RateLimitError
from wire.schema import CompletionRequest

_KINDS: Final = ("rps", "rpm", "tpm", "tpd", "concurrent")
# The buckets that count upstream calls: an emulated fan-out charges them once per call it makes.
_CALL_KINDS: Final = frozenset({"rps", "rpm"})
# Combinations of scopes compiled (`Admission._compile`): a config's keys x aliases x routes, bounded
# whatever models clients name.
_SCOPES_KEPT: Final = 4096


def buckets_of(scope: str, limits: LimitsConfig | None, shared_as: str = "") -> list[Bucket]:
    """`scope`'s buckets, named `scope` to clients and operators; `shared_as`: `Bucket.shared_as`."""
    if limits is None:
        return []
    return [
        Bucket(scope, kind, getattr(limits, kind), shared_as) for kind in _KINDS if getattr(limits, kind) is not None
    ]


class _Scopes:
    """One combination of scopes a request charges (its key's, its team's, its alias's, its route's), compiled
    once: the buckets, the token buckets among them and the smallest token limit, the queue to wait in, and the
    key's team when the team's buckets are among them (a refusal by them names it)."""

    __slots__ = ("buckets", "charges", "labels", "queue_ms", "room", "team", "tokens")

    def __init__(self, buckets: list[Bucket], charges: BucketSet, queue_ms: int, team: str | None = None) -> None:
        self.buckets = buckets
        self.team = team
        self.charges = charges
        self.tokens = [b for b in buckets if b.kind in TOKEN_KINDS]
        self.room = min((b.room for b in self.tokens), default=0)
        self.queue_ms = queue_ms
        self.labels = labels_of(buckets)  # worked out once, read off every reply


class Ticket(msgspec.Struct):
    buckets: list[Bucket]
    lease: str
    reserved: int
    headers: Lines  # the x-ratelimit headers, encoded
    prompt: int = 0  # the prompt's share of `reserved`, to charge a cancelled stream what it used
    charges: BucketSet | None = None  # `buckets` compiled (the limiter's), when admission had them
    away: bool = False  # admitted on this process's state while Redis was away: corrected there, not in Redis


class Admission:
    def __init__(
        self,
        loaded: LoadedConfig,
        shared: SharedState,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        cfg = loaded.config
        self.limiter = Limiter(
            shared, fail_open=cfg.redis.on_failure == "fail_open", lease_ttl_ms=cfg.redis.lease_ttl_ms
        )
        self.sleep = sleep
        self.unbounded_tokens = cfg.caps.budget_max_tokens
        # Per key identity (`ClientKey.ident`), never its name: another config's key may be named alike.
        self.keys = {
            ident: buckets_of(f"key:{k.name}", k.limits, f"key:{ident}")
            for k in cfg.keys
            if k.limits and k.key
            for ident in (fingerprint(k.key.encode()),)
        }
        self.models = {m.name: buckets_of(f"model:{m.name}", m.limits) for m in cfg.models if m.limits}
        # Shared by all of a team's keys, YAML and runtime alike, beside each key's own (named by the team's name,
        # as an alias's are: gateways sharing a Redis share a team's buckets when they name it alike).
        self.teams = {n: buckets_of(team_scope(n), t.limits) for n, t in cfg.teams.items() if t.limits}
        # A batch's lines count toward their own buckets per key (`batches.limits`), never the key's: a batch
        # does not take the rate its key's interactive requests are allowed; they do count toward the key's
        # team's, through `batches.quota_share` (docs/batches.md).
        self.batch_limits = cfg.batches.limits
        # A YAML key's own `batch_limits`, in place of those, by its identity as its `limits` are.
        self.key_batch_limits = {
            fingerprint(k.key.encode()): k.batch_limits for k in cfg.keys if k.batch_limits is not None and k.key
        }
        self.providers = {n: buckets_of(f"provider:{n}", p.limits) for n, p in loaded.providers.items() if p.limits}
        self.deployments = {
            (n, d): buckets_of(f"deployment:{n}/{d}", dc.limits)
            for n, p in loaded.providers.items()
            for d, dc in p.deployments.items()
            if dc.limits
        }
        queue: dict[str, int] = {}
        for k in cfg.keys:
            if k.limits:
                queue[f"key:{k.name}"] = k.limits.max_queue_ms
        for m in cfg.models:
            if m.limits:
                queue[f"model:{m.name}"] = m.limits.max_queue_ms
        for n, t in cfg.teams.items():
            if t.limits:
                queue[team_scope(n)] = t.limits.max_queue_ms
        self.queue_ms = queue
        self.enabled = bool(self.keys or self.models or self.providers or self.deployments or self.teams)
        scopes = [
            *self.keys.values(),
            *self.teams.values(),
            *self.models.values(),
            *self.providers.values(),
            *self.deployments.values(),
        ]
        if any(b.kind in TOKEN_KINDS for bs in scopes for b in bs) and any(
            REGISTRY[p.kind].openai_bpe for p in loaded.providers.values()
        ):
            warm()
        self._scopes: dict[tuple[object, ...], _Scopes] = {}
        self._background: set[asyncio.Task[None]] = set()
        self.corrections = Corrections(self.limiter)
        # What admits a batch's lines: this, or below a `batches.quota_share` of 1 a view through it (`_lines`).
        self.lines = self if cfg.batches.quota_share >= 1 else self._lines(cfg.batches.quota_share)

    def _lines(self, share: float) -> Admission:
        """This admission as a batch's lines meet it (the same limiter, state and tasks), every alias's, provider's,
        deployment's and team's bucket seen through `share`: a line leaves the rest of each to interactive
        requests."""
        view = copy.copy(self)
        view.models = {n: shared_view(bs, share) for n, bs in self.models.items()}
        view.providers = {n: shared_view(bs, share) for n, bs in self.providers.items()}
        view.deployments = {n: shared_view(bs, share) for n, bs in self.deployments.items()}
        view.teams = {n: shared_view(bs, share) for n, bs in self.teams.items()}
        view._scopes = {}
        view.lines = view
        warn_one_at_a_time(
            [*view.models.values(), *view.providers.values(), *view.deployments.values(), *view.teams.values()]
        )
        return view

    def _route_buckets(self, route: Route) -> list[Bucket]:
        out = list(self.providers.get(route.provider, ()))
        if route.endpoint.deployment:
            out += self.deployments.get((route.provider, route.endpoint.deployment), ())
        return out

    def own(self, key: ClientKey | None) -> list[Bucket]:
        """The buckets of `key`'s own interactive requests: the key's, then its team's (`teams.<name>.limits`)."""
        if key is None:
            return []
        return [*(self.keys.get(key.ident) or key.buckets), *self._team(key)]

    def _team(self, key: ClientKey) -> Sequence[Bucket]:
        """The buckets of `key`'s team (`teams.<name>.limits`), shared by all of its keys."""
        if not self.teams:  # a config whose teams set no limits looks no further
            return ()
        return self.teams.get(key.team or "", ())

    def _compile(self, key: ClientKey | None, model: str, direct: Route | None, free: bool, batch: bool) -> _Scopes:
        # A batch's lines take `batches.limits` in place of their key's own buckets, and their team's too: a
        # team's limits bound all of its keys, so a team admin making more keys gets no more batch throughput.
        if batch:
            buckets = self._batch_buckets(key) + ([] if key is None else list(self._team(key)))
        else:
            buckets = self.own(key)
        team = key.team if key is not None and key.team in self.teams else None
        buckets += self.models.get(model, ())
        if free:
            # No upstream call: no provider's or deployment's quota, and no tokens.
            buckets = [b for b in buckets if b.kind not in TOKEN_KINDS]
        elif direct is not None:
            buckets += self._route_buckets(direct)
        # Only key, team and alias scopes configure a queue; a provider's quota must not cancel theirs.
        queues = [self.queue_ms[b.scope] for b in buckets if b.scope in self.queue_ms]
        if batch:
            if (limits := self._batch_limits(key)) is not None:
                queues.append(limits.max_queue_ms)
        elif key is not None and key.buckets and key.ident not in self.keys:
            queues.append(key.queue_ms)  # a runtime key's own `limits.max_queue_ms`
        return _Scopes(buckets, self.limiter.compiled(buckets), min(queues, default=0), team)

    def _batch_limits(self, key: ClientKey | None) -> LimitsConfig | None:
        """What limits `key`'s batch lines: its own `batch_limits` (a runtime key's, or a YAML key's by its
        identity), else `batches.limits`."""
        if key is None:
            return self.batch_limits
        if key.batch_limits is not None:
            return key.batch_limits
        return self.key_batch_limits.get(key.ident, self.batch_limits)

    def _batch_buckets(self, key: ClientKey | None) -> list[Bucket]:
        """The buckets of `key`'s batch lines (`_batch_limits`), named by the key's identity as its own are."""
        if key is None:
            return buckets_of("batch:anonymous", self.batch_limits)
        return buckets_of(f"batch:{key.name}", self._batch_limits(key), f"batch:{key.ident}")

    async def admit(
        self,
        key: ClientKey | None,
        req: CompletionRequest,
        plan: Plan,
        *,
        free: bool = False,
        meanwhile: Callable[[], None] | None = None,
        waits: bool = False,
        batch: bool = False,
    ) -> Ticket | None:
        """`free`: an answer the cache serves, which costs no upstream call: the key's and the alias's request
        rates still count it, their tokens and the provider's and deployment's quotas do not. `waits`: a request
        that waits for an identical one in flight and may make no call: charged as any request is, but a direct
        one's provider and deployment quotas are left to its attempt, as an alias's are. `meanwhile`: work to do
        while the decision is on its way from Redis (called once, and only then). `batch`: a batch's line, which
        counts toward `batches.limits` in place of its key's own, and toward its team's."""
        direct = None if waits else plan.single
        # What decides the buckets: the key (a runtime key's own limits are on it; its identity fixes its team,
        # which no key changes while a config is in force), the model, the route.
        route = None if free or direct is None else (direct.provider, direct.endpoint.deployment)
        # A runtime key's `batch_limits` can stay out: no key-API route changes a key's limits (rotate: its secret).
        sig = (None if key is None else (key.ident, key.buckets, key.queue_ms), req.model, free, route, batch)
        scopes = self._scopes.get(sig)
        if scopes is None:
            if len(self._scopes) >= _SCOPES_KEPT:
                self._scopes.clear()
            scopes = self._scopes[sig] = self._compile(key, req.model, direct, free, batch)
        buckets = scopes.buckets
        if not buckets:
            return None
        if scopes.tokens:
            prompt, tokens = self._reserve(req, scopes.tokens, scopes.room, plan.single or plan.groups[0].routes[0])
        else:
            prompt = tokens = 0
        charges, queue_ms, limiter = scopes.charges, scopes.queue_ms, self.limiter
        waited = 0
        while True:
            away = False  # decided on this process's state while Redis is away
            # Without Redis, decided on the spot, its reply read as the script's is.
            out = limiter.decided(charges, tokens)
            if out is not None:
                allowed, wait, lease = out[0] == 1, out[1], ""
                headers = reply_headers(out, scopes.labels)
            else:
                try:
                    # The common case (Redis answering, no lease): the channel's future awaited here, the reply
                    # read as it comes, without the limiter's coroutine and a BucketState per bucket.
                    pending = limiter.acquiring(charges, tokens)
                    if pending is None:
                        decision = await limiter.acquire(charges, tokens)
                        allowed, wait, lease = decision.allowed, decision.retry_after_ms, decision.lease
                        away = decision.away
                        headers = rate_headers(decision.states, scopes.labels)
                    else:
                        if meanwhile is not None:
                            meanwhile()
                            meanwhile = None
                        try:
                            out = await pending
                        except Degraded:
                            out, away = limiter.refused_call(charges, tokens), True
                        allowed, wait, lease = out[0] == 1, out[1], ""
                        headers = reply_headers(out, scopes.labels)
                except RedisDown:
                    raise _unavailable() from None
            if allowed:
                return Ticket(buckets, lease, tokens, headers, prompt, charges, away)
            if waited + wait > queue_ms:
                # Which bucket refused is worked out here only (the team's is named): each one's headroom.
                left = out[2::2] if out is not None else [s.remaining for s in decision.states]
                raise refusal(scopes.team, buckets, left, tokens, wait, headers)
            waited += wait
            await self.sleep(wait / 1000)

    def applies(self, key: ClientKey | None, batch: bool = False) -> bool:
        """Whether any limit can apply to `key`'s requests: the config's, or the key's own (one made through
        `/admin/keys` carries its limits with it, whatever the config sets); `batch`: to its batch lines."""
        if batch:
            return self.enabled or self._batch_limits(key) is not None
        return self.enabled or (key is not None and bool(key.buckets))

    def counts_cached(self, key: ClientKey | None, model: str) -> bool:
        """Whether `admit(..., free=True)` has a bucket to charge: the key's, its team's or the alias's request
        rate."""
        return any(b.kind not in TOKEN_KINDS for b in (*self.own(key), *self.models.get(model, ())))

    async def admit_route(self, route: Route, req: CompletionRequest, ticket: Ticket | None) -> Ticket | None:
        """A target's own provider/deployment quota, checked when the failover loop reaches it (an alias's
        target, a continuation's). Where the request's `ticket` holds it (a direct request's), admission
        charged the first call: a later one (a retry) is charged its call alone, its tokens being the ticket's."""
        buckets = self._route_buckets(route)
        if not buckets:
            return None
        if ticket is not None and buckets[0] in ticket.buckets:
            await self.charge_calls(route, 1)
            return None
        prompt, tokens = self._tokens(req, buckets, route)
        decision = await self.acquire(buckets, tokens)
        if decision.allowed:
            return Ticket(buckets, decision.lease, tokens, rate_headers(decision.states), prompt, away=decision.away)
        raise RateLimitError(
            f"Provider '{route.provider}' is at its configured quota",
            code="provider_quota",
            retry_after=decision.retry_after_ms / 1000,
            headers=as_text(rate_headers(decision.states)),
            # Another target may have room; this one is not unhealthy, so no cooldown.
            retryable=True,
            cools=False,
            target=route.key,
            provider=route.provider,
        )

    async def charge_calls(self, route: Route, more: int, param: str | None = None) -> bool:
        """`more` upstream calls on `route` beyond the one its admission charged (an emulated fan-out's
        further sub-calls, a guided retry), to its provider's and deployment's request-rate buckets, all or
        none, before any of them is made. True: charged on this process's state (Redis away), where any of
        them given back goes (`give_back_calls`).

        A refusal is the provider's 429, which fails the attempt (another target of an alias may still have
        room). With `param` (the field that asked for a fan-out, refused before its first call), a fan-out
        that no such bucket can ever hold is a 400 naming it, as a request over a token limit is, and either
        refusal gives back the unit admission charged for the first call: no call was made.
        """
        buckets = [b for b in self._route_buckets(route) if b.kind in _CALL_KINDS]
        if not buckets or more < 1:
            return False
        calls = self.limiter.compiled(buckets)
        if param is not None:
            for b in buckets:
                if more + 1 > (b.limit if b.share >= 1 else b.room):
                    # Admission charged its unit moments ago: where Redis is now (away or not) is where it went.
                    await self.corrections.at_once(calls, -1, self.limiter.shared.degraded)
                    raise InvalidRequestError(
                        f"'{param}' makes this request {more + 1} upstream calls to provider '{route.provider}' "
                        f"(the gateway emulates it), more than the {b.kind} limit of {b.limit} for {b.scope} "
                        + ("can ever allow" if b.share >= 1 else f"allows a batch line (quota_share {b.share:g})"),
                        param=param,
                        code="exceeds_request_limit",
                    )
        decision = await self.acquire(buckets, 0, more)
        if decision.allowed:
            return decision.away
        if param is not None:
            await self.corrections.at_once(calls, -1, decision.away)
        raise RateLimitError(
            f"Provider '{route.provider}' is at its configured quota"
            + (f" for the {more + 1} upstream calls this request makes" if param is not None else ""),
            code="provider_quota",
            retry_after=decision.retry_after_ms / 1000,
            headers=as_text(rate_headers(decision.states)),
            # Another target may have room; this one is not unhealthy, so no cooldown, and the same target
            # is not tried again.
            retryable=True,
            cools=False,
            elsewhere=True,
            target=route.key,
            provider=route.provider,
        )

    def give_back_calls(self, route: Route, count: int, here: int = 0) -> None:
        """Return `count` units charged by `charge_calls` for calls that were never made, off the request path,
        as corrections are (gateway/limits/settles.py): `here` of them were charged on this process's state and
        go back there, the others to Redis (kept until it answers)."""
        buckets = [b for b in self._route_buckets(route) if b.kind in _CALL_KINDS]
        if not buckets or count <= 0:
            return
        calls = self.limiter.compiled(buckets)
        here = min(here, count)
        if here:
            self.corrections.add(calls, -here, True)
        if count > here:
            self.corrections.add(calls, here - count, False)

    def _tokens(self, req: CompletionRequest, buckets: list[Bucket], route: Route) -> tuple[int, int]:
        token_buckets = [b for b in buckets if b.kind in TOKEN_KINDS]
        if not token_buckets:
            return 0, 0
        return self._reserve(req, token_buckets, min(b.limit if b.share >= 1 else b.room for b in token_buckets), route)

    def _reserve(self, req: CompletionRequest, token_buckets: list[Bucket], room: int, route: Route) -> tuple[int, int]:
        """(prompt tokens, tokens to reserve) against `token_buckets`, whose smallest limit is `room`."""
        per_choice = req.max_tokens
        if per_choice is None:
            per_choice = unbounded_completion(route, self.unbounded_tokens)
        prompt, tokens = reservation(req, route.adapter.openai_bpe, route.endpoint.model, per_choice)
        if req.max_tokens is None:
            # The worst case may exceed a small limit the request can still fit: it then waits for a whole
            # bucket rather than being refused for a max_tokens it never set.
            if prompt < room < tokens:
                tokens = room
        if tokens > room:
            b = min(token_buckets, key=lambda b: b.room)  # the tightest: what the request must fit
            parts, param, advice = over_limit(
                req, route.adapter.openai_bpe, route.endpoint.model, per_choice, (prompt, tokens), room
            )
            allows = "can ever allow" if b.share >= 1 else f"allows a batch line (quota_share {b.share:g}: {room})"
            raise InvalidRequestError(
                f"This request needs up to {tokens} tokens ({parts}), more than the {b.kind} limit of {b.limit} "
                f"for {b.scope} {allows}; {advice}",
                param=param,
                code="exceeds_token_limit",
            )
        return prompt, tokens

    async def acquire(self, buckets: list[Bucket], tokens: int, requests: int = 1) -> Decision:
        """The limiter's decision, or the 503 of fail-closed when Redis is unreachable."""
        try:
            return await self.limiter.acquire(buckets, tokens, requests)
        except RedisDown:
            raise _unavailable() from None

    def settle(self, ticket: Ticket | None, used: int | None) -> None:
        """Return unused reserved tokens (or charge overuse) and free concurrency, off the request path.

        Concurrency leases are released at once (a slot must not stay taken). Token corrections are
        summed per set of buckets and applied every few milliseconds in one script call per set
        (gateway/limits/settles.py): a call per request cost a saturated worker a round trip each, and a
        correction a few milliseconds late changes no admission decision by more than that request's own
        difference.
        """
        if ticket is None:
            return
        delta = 0 if used is None else used - ticket.reserved
        charges = ticket.charges
        if charges is None:
            charges = self.limiter.compiled(ticket.buckets)
        tset = charges.tokens_only
        if delta and tset is not None:
            self.corrections.add(tset, delta, ticket.away)
        if charges.leased:
            self._spawn(self._release(ticket))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _release(self, ticket: Ticket) -> None:
        try:
            await self.limiter.release(ticket.buckets, ticket.lease)
        except RedisDown:
            pass

    async def drain(self) -> None:
        await self.corrections.drain()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)


def _unavailable() -> GatewayError:
    """The 503 of fail-closed when Redis is unreachable."""
    return GatewayError(
        "Rate limiting is unavailable (Redis unreachable) and the gateway is set to fail closed",
        status=503,
        code="rate_limiter_unavailable",
    )
