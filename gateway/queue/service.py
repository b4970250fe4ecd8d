"""The queue of one pipeline: the gates of the config's capped servers, who asks, and an attempt's wait.

Built once per config. A pipeline without any `max_concurrency` builds none and the request path never
calls here. A reload's new pipeline adopts the old one's gates (`adopt`), so requests waiting, and slots
held, carry over to the new config.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Final

import msgspec

from gateway.config import TEAM_PREFIX, LoadedConfig, QueueConfig, replica_cap, replica_names, replica_tag, replica_url
from gateway.limits.auth import ClientKey
from gateway.limits.ratelimit import Limiter
from gateway.limits.tokens import prompt_count, prompt_tokens, text_tokens, unbounded_completion, unrendered_tokens
from gateway.ops import tracing
from gateway.ops.metrics import Metrics
from gateway.queue.fair import BATCH, PRIORITIES, RANK, Waiter
from gateway.queue.gate import LOW, NO_CAP, Gate, Slot
from gateway.upstream.plan import Plan, Route
from gateway.upstream.transport import Timeouts
from providers import REGISTRY
from wire.errors import InvalidRequestError, PermissionDeniedError, RateLimitError, UpstreamTimeoutError, shown
from wire.schema import CompletionRequest

HEADER: Final = "x-gateway-priority"
_ROUTES_LIMIT: Final = 4096
_ANONYMOUS: Final = "anonymous"
# What a waiter's future is given when a newcomer of a tenant with fewer waiting takes its place (`_displace`).
_DISPLACED: Final = object()


class Spilled(RateLimitError):
    """An attempt that found its server full while another target of the plan had room: no upstream call was
    made, and the failover loop moves on to the next target without counting it as an attempt."""

    no_call = True


class Ask(msgspec.Struct, eq=False):
    """Who one request is to the queue: its tenant, the tenant's weight, its class and what it may cost.

    A Struct: built in C, without an `__init__` frame, once per request."""

    queues: Queues
    tenant: str
    weight: float
    rank: int
    prompt: int  # its prompt's tokens, estimated
    most: int | None  # the most it may generate (max_tokens x choices), None without max_tokens
    choices: int
    # The targets this request's attempts have gone to: the first, and a set only once there are others.
    first: str = ""
    tried: set[str] | None = None
    waited: float = 0.0  # seconds its attempts spent in queues, for the access log

    def has_tried(self, key: str) -> bool:
        return key == self.first or (self.tried is not None and key in self.tried)

    def take(self, route: Route) -> Slot | None:
        """A slot on `route`'s server that needs no waiting: a free one, or `NO_CAP` where the server has no
        cap; None when the attempt must `wait` for one (the server is full, or with Redis has no spare lease)."""
        key = route.key
        first = self.first
        if not first:
            self.first = key
        elif key != first:
            if self.tried is None:
                self.tried = {key}
            else:
                self.tried.add(key)
        queues = self.queues
        routes = queues.routes
        # `Queues.gate`'s table read here, without its call, once the route has been seen.
        gate = routes[key] if key in routes else queues.gate(route)
        if gate is None:
            return NO_CAP
        if self.rank < LOW:
            if gate.low_cap < gate.cap:
                gate.seen = time.monotonic()  # the reserve holds while such requests come
            limit = gate.cap
        else:
            limit = gate.low_limit()[0]
        if gate.in_use < limit and not gate.order.depth:
            # A free slot of this process, or (with Redis) a spare one of a block it holds: nothing to await.
            most = self.most
            if most is None:
                most = self.unbounded(route)
            if gate.limiter is None:
                gate.in_use += 1
                # `Gate.grant`, inline: a Python call less on every request that finds a slot free.
                tenant, weight, prompt = self.tenant, self.weight, self.prompt
                cost = gate.order.charge(tenant, prompt, most, weight)
                return Slot(gate, "", None, tenant, weight, cost, prompt, 0.0)
            if gate.spare and limit == gate.cap:
                return gate.from_block(self.tenant, self.weight, self.prompt, most)
        return None

    async def wait(self, route: Route, timeouts: Timeouts, plan: Plan | None) -> tuple[Slot, Timeouts]:
        """A slot on `route`'s server, which `take` found without one to give at once, and the attempt's
        timeouts less the time waited. `plan` None: the call has no other target to go to."""
        gate: Gate = self.queues.gate(route)  # type: ignore[assignment]  # `take` found it
        most = self.most if self.most is not None else self.unbounded(route)
        return await self.queues.wait(self, most, gate, route, timeouts, plan)

    def unbounded(self, route: Route) -> int:
        """The most a request without `max_tokens` may generate on `route`: the budgets' worst case. Its charge
        at a grant is its prompt and the answer its tenant's recent requests there had, within this (or
        `max_tokens`), so a request counts while it runs and a tenant of long generations cannot start many
        at once; what the answer used corrects it at its end (gateway/queue/fair.py)."""
        return unbounded_completion(route, self.queues.unbounded_tokens) * self.choices


class _Tenant:
    __slots__ = ("name", "weight", "rank", "most")

    def __init__(self, name: str, weight: float, rank: int, most: int) -> None:
        self.name, self.weight, self.rank, self.most = name, weight, rank, most


class Queues:
    def __init__(self, loaded: LoadedConfig, limiter: Limiter | None, metrics: Metrics | None) -> None:
        """`limiter`: the one whose concurrency leases hold slots across processes (None: no Redis)."""
        cfg = loaded.config
        self.config: QueueConfig = cfg.queue
        self.limiter = limiter
        self.metrics = metrics
        self.unbounded_tokens = cfg.caps.budget_max_tokens
        # (provider, base URL) -> its gate; routes of the same server share it.
        self.gates: dict[tuple[str, str], Gate] = {}
        share, hold = self.config.low_share, self.config.low_share_hold_ms / 1000
        for name, p in loaded.providers.items():
            if p.replicas:
                for replica, r in zip(replica_names(name, p.replicas), p.replicas, strict=True):
                    cap = replica_cap(r, p.max_concurrency)
                    if cap is not None:
                        url = replica_url(r).rstrip("/")
                        lease = f"{name}@{replica_tag(url)}"
                        self.gates[(name, url)] = Gate(replica, cap, limiter, metrics, share, hold, lease)
            elif p.max_concurrency is not None:
                base = p.base_url or getattr(REGISTRY[p.kind], "default_base_url", None) or ""
                self.gates[(name, base)] = Gate(name, p.max_concurrency, limiter, metrics, share, hold)
                for d, dc in p.deployments.items():
                    if dc.base_url and dc.base_url != base:
                        self.gates[(name, dc.base_url)] = Gate(
                            f"{name}/{d}", p.max_concurrency, limiter, metrics, share
                        )
        self.routes: dict[str, Gate | None] = {}  # route key -> its gate (None: its server has no cap)
        self.fair_by_team = self.config.fair_by == "team"
        teams = cfg.teams
        self.tenants: dict[str, _Tenant] = {}
        self.teams = teams
        for k in cfg.keys:
            self.tenants[k.name] = self._tenant(k.name, k.team, k.weight, k.priority, k.max_priority)
        waits = self.config.max_wait_by_priority
        # A batch line waits as a `low` request does unless `batch` says otherwise.
        batch = waits.batch if waits.batch is not None else waits.low
        self.max_wait_s = tuple(
            (w if w is not None else self.config.max_wait_ms) / 1000
            for w in (waits.high, waits.normal, waits.low, batch)
        )
        self._normal = _Tenant(_ANONYMOUS, 1.0, RANK["normal"], RANK["normal"])

    def _tenant(self, name: str, team_name: str | None, w: float, asks: str | None, most: str | None) -> _Tenant:
        """A key's place in the fair order: its team's when `fair_by: team`, its priorities or else its team's."""
        team = self.teams.get(team_name) if team_name else None
        by_team = self.fair_by_team and team_name is not None
        weight = (team.weight if team is not None else 1.0) if by_team else w
        asks = asks or (team.priority if team else None) or "normal"
        most = most or (team.max_priority if team else None) or "normal"
        # A runtime key's default never passes what it may ask for (the config refuses such a YAML key).
        tenant = TEAM_PREFIX + team_name if by_team and team_name else name
        return _Tenant(tenant, weight, max(RANK[asks], RANK[most]), RANK[most])

    def adopt(self, old: Queues) -> None:
        """A reload: the servers both configs cap keep their gate (its waiters, slots held and service) under
        the new cap; a server no longer capped lets its waiters through at once."""
        for where, gate in old.gates.items():
            mine = self.gates.get(where)
            if mine is not None:
                gate.resize(mine.cap, self.limiter, self.metrics, self.config.low_share, mine.hold_s, mine.name)
                self.gates[where] = gate
            else:
                _lift(gate)
        old.gates = {where: g for where, g in old.gates.items() if self.gates.get(where) is not g}  # its own to close

    async def close(self) -> None:
        """Shutdown (or the end of a replaced config): every gate's spare leases back to Redis."""
        for gate in self.gates.values():
            await gate.close()

    def lift(self) -> None:
        """A reload to a config that caps no server: everyone waiting goes at once."""
        for gate in self.gates.values():
            _lift(gate)

    def gate(self, route: Route) -> Gate | None:
        found = self.routes.get(route.key, self)
        if found is self:
            found = self.gates.get((route.provider, route.endpoint.base_url))
            if len(self.routes) >= _ROUTES_LIMIT:
                self.routes.clear()  # direct model strings are the client's: keep them from growing this
            self.routes[route.key] = found
        return found  # type: ignore[return-value]

    def _runtime(self, key: ClientKey) -> _Tenant:
        """A runtime key's (the ledger's) tenant: its own share, stored with it."""
        return self._tenant(key.label, key.team, key.weight, key.priority, key.max_priority)

    def priority(self, key: ClientKey | None, headers: Mapping[str, str]) -> tuple[_Tenant, int]:
        """`key`'s tenant and the class its request asks for: its `x-gateway-priority` header, checked (unknown:
        400; above the key's `max_priority`: 403), or its default."""
        t = self._normal if key is None else self.tenants.get(key.label)
        if t is None:
            t = self._runtime(key)  # type: ignore[arg-type]  # None is `_normal`
        asked = headers.get(HEADER)
        if asked is None:
            return t, t.rank
        asked = asked.strip().lower()
        r = RANK.get(asked)
        if r is None:
            raise InvalidRequestError(
                f"'{HEADER}' must be one of high, normal, low; got {shown(asked)!r}",
                param=HEADER,
                code="invalid_priority",
            )
        if r < t.most:
            raise PermissionDeniedError(
                f"This key may not ask for priority '{asked}': its max_priority is '{PRIORITIES[t.most]}'",
                param=HEADER,
                code="priority_not_allowed",
            )
        return t, r

    def ask(
        self, key: ClientKey | None, headers: Mapping[str, str], req: CompletionRequest, batch: bool = False
    ) -> Ask:
        """Who asks: the tenant of `key`, and the class its `x-gateway-priority` header (or its default) asks for;
        `batch`: a batch's line, of `key`'s tenant, in the class below every one a client may ask for."""
        if HEADER in headers and not batch:
            t, rank = self.priority(key, headers)
        else:  # `priority` without a header to check, inline: every request of a capped gateway comes here
            found = self._normal if key is None else self.tenants.get(key.label)
            t = found if found is not None else self._runtime(key)  # type: ignore[arg-type]  # None is `_normal`
            rank = BATCH if batch else t.rank
        prompts = req.prompt
        # Choices as the budgets count them (gateway/limits/tokens.py `reservation`): every prompt's answers.
        choices = 1 if req.n is None and req.best_of is None else max(req.n or 1, req.best_of or 1)
        beside = req.unrendered  # tools, schemas, a suffix, thinking sent back, images; None for a prompt alone
        if type(prompts) is str:  # the usual prompt: one text
            prompt = text_tokens(prompts, False, "")
            if beside is not None:
                prompt += unrendered_tokens(beside, False, "")
        else:
            prompt = prompt_tokens(prompts, False, "")
            count = prompt_count(prompts)
            choices *= count
            if beside is not None:  # sent with each prompt
                prompt += count * unrendered_tokens(beside, False, "")
        most = req.max_tokens * choices if req.max_tokens is not None else None
        return Ask(self, t.name, t.weight, rank, prompt, most, choices)

    def ask_nothing(self, key: ClientKey | None, headers: Mapping[str, str]) -> Ask:
        """Who asks for a call that generates nothing (a tokenizer route's): its tenant and class, as `ask`
        finds them, charged no tokens in the fair order while it holds its slot."""
        t, rank = self.priority(key, headers)
        return Ask(self, t.name, t.weight, rank, 0, 0, 1)

    async def wait(
        self, ask: Ask, most: int, gate: Gate, route: Route, timeouts: Timeouts, plan: Plan | None
    ) -> tuple[Slot, Timeouts]:
        """A slot on `gate` for one attempt of `ask`'s request, which may generate at most `most` tokens: at
        once, or after waiting in its fair order."""
        w = Waiter(ask.tenant, ask.weight, ask.rank, most, None, 0.0, ask.prompt)
        slot = await gate.take(w)
        if slot is not None:
            return slot, timeouts
        # Only a request that waits gets a future and a start time: a free slot costs neither.
        w.future, w.since = asyncio.get_running_loop().create_future(), time.monotonic()
        metrics = self.metrics
        room, others = self._elsewhere(ask, route, plan)
        if room:
            raise self._spilled(gate, route)
        if gate.order.depth >= self.config.max_depth and not self._displace(gate, ask.tenant):
            raise self._full(gate, route, "")
        max_wait = self.max_wait_s[ask.rank]
        deadline_first = timeouts.total < max_wait
        span = tracing.wait(gate.name, PRIORITIES[ask.rank])
        gate.enqueue(w)
        for other in others:  # the alias's other full servers: whichever frees a slot first may take it
            other.watchers[w.future] = None
        try:
            try:
                async with asyncio.timeout(min(max_wait, timeouts.total)):
                    slot = await w.future
                if slot is _DISPLACED:  # a tenant with fewer waiting took its place in the full queue
                    raise self._full(gate, route, " and this key has the most of them waiting")
                if slot is None:  # another target freed a slot first: the attempt moves on to it
                    gate.leave(w)
                    raise self._spilled(gate, route)
            except TimeoutError:
                gate.leave(w)
                self._rejected(gate, "deadline" if deadline_first else "queue_timeout")
                if deadline_first:
                    raise UpstreamTimeoutError(
                        "The request's deadline passed while it waited for a slot",
                        code="deadline_exceeded",
                        retryable=False,
                        cause="deadline_exceeded",
                    ) from None
                raise _refused(
                    RateLimitError,
                    gate,
                    route,
                    f"Waited {max_wait:g} s for a slot on server '{gate.name}' (queue.max_wait_ms); retry later",
                    code="queue_timeout",
                    retry_after=gate.retry_after(),
                    elsewhere=False,
                ) from None
        except BaseException as exc:
            if w.future.done() and not w.future.cancelled() and w.future.exception() is None:
                granted = w.future.result()
                if granted is not None and granted is not _DISPLACED:
                    granted.done(0)  # granted as the request went away: the slot goes to the next
            else:
                w.future.cancel()
                gate.leave(w)
            if span is not None:
                span.close(exc)
            raise
        finally:
            for other in others:
                other.watchers.pop(w.future, None)
        if span is not None:
            span.close(None)
        ask.waited += slot.waited
        if metrics is not None:
            metrics.queue_wait.labels(gate.name, PRIORITIES[ask.rank]).observe(slot.waited)
        return slot, timeouts.capped(max(timeouts.total - slot.waited, 0.001))

    def _full(self, gate: Gate, route: Route, why: str) -> RateLimitError:
        """The 429 `queue_full` of a request the full queue of `gate` does not keep, counted."""
        self._rejected(gate, "queue_full")
        return _refused(
            RateLimitError,
            gate,
            route,
            f"The queue for server '{gate.name}' is full ({self.config.max_depth} requests wait){why}; retry later",
            code="queue_full",
            retry_after=gate.retry_after(),
            elsewhere=True,
        )

    @staticmethod
    def _displace(gate: Gate, tenant: str) -> bool:
        """Room in a full queue for a newcomer of `tenant`, made by the heaviest waiting tenant's newest waiter
        leaving it (refused as `queue_full`), when it has more waiting (`FairOrder.displaced_by`)."""
        w = gate.order.displaced_by(tenant)
        if w is None:
            return False
        gate.leave(w)
        if not w.future.done():
            w.future.set_result(_DISPLACED)
        return True

    def _elsewhere(self, ask: Ask, route: Route, plan: Plan | None) -> tuple[bool, list[Gate]]:
        """Whether another target of the plan, not yet tried by this request, could start it now; if none
        can, the servers of those others (each full), which a slot freed first may still call it to."""
        full: list[Gate] = []
        if plan is None or (plan.single is not None and not route.replicas and not plan.single.replicas):
            return False, full
        for g in plan.groups:
            for r in g.routes:
                for x in r.replicas or (r,):
                    if x.key == route.key or ask.has_tried(x.key) or x.unavailable is not None:
                        continue
                    other = self.gate(x)
                    if other is None or other.room():
                        return True, full
                    if other not in full:
                        full.append(other)
        return False, full

    def _spilled(self, gate: Gate, route: Route) -> Spilled:
        self._rejected(gate, "spilled")
        return _refused(  # type: ignore[return-value]  # `kind` is Spilled
            Spilled,
            gate,
            route,
            f"Server '{gate.name}' is at its max_concurrency of {gate.cap}; another target has room",
            code="server_saturated",
            retry_after=None,
            elsewhere=True,
        )

    async def status(self) -> list[dict[str, object]]:
        """Each capped server for the status page: its cap, the slots in use (with Redis, by every process;
        else this process's) and the requests waiting here per class."""
        out: list[dict[str, object]] = []
        for gate in self.gates.values():
            in_use = gate.in_use
            if self.limiter is not None:
                peeked = await self.limiter.peek([gate.bucket])
                # Spare leases of this process's blocks are held in Redis but run nothing.
                in_use = max(gate.cap - peeked[0].remaining - len(gate.spare), 0) if peeked else in_use
            counts = gate.order.counts
            out.append(
                {
                    "server": gate.name,
                    "cap": gate.cap,
                    "in_use": in_use,
                    "waiting": {p: counts[i] for i, p in enumerate(PRIORITIES)},
                }
            )
        return out

    def _rejected(self, gate: Gate, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.queue_rejected.labels(gate.name, reason).inc()


def _lift(gate: Gate) -> None:
    gate.resize(1_000_000_000, None, gate.metrics)  # uncapped now: its waiters go, its slots end as they do


def _refused(
    kind: type[RateLimitError],
    gate: Gate,
    route: Route,
    message: str,
    *,
    code: str,
    retry_after: float | None,
    elsewhere: bool,
) -> RateLimitError:
    """A queue's 429: never the target's fault (no cooldown); `elsewhere`: another target may have room."""
    return kind(
        message,
        code=code,
        retry_after=retry_after,
        retryable=elsewhere,
        elsewhere=elsewhere,
        cools=False,
        target=route.key,
        provider=route.provider,
    )


def build(loaded: LoadedConfig, limiter: Limiter, metrics: Metrics | None) -> Queues | None:
    """The config's queues, or None when no server has a `max_concurrency` (then nothing of this runs)."""
    queues = Queues(loaded, limiter if loaded.config.redis.url else None, metrics)
    return queues if queues.gates else None
