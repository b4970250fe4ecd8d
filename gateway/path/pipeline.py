"""One completion request, end to end, in three steps: admit, then buffered or streamed.

This is the request path, so it is kept flat: one JSON decode of the client body, one encode of the
upstream body per attempt, one decode of the upstream answer and one encode of the client answer. The
steps and the values passed along: docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import msgspec

from gateway import cache
from gateway.cache import Lookup
from gateway.cache.hit import answered
from gateway.config import LoadedConfig
from gateway.fleet.picker import Hint
from gateway.limits.admission import Admission, Ticket
from gateway.limits.auth import ClientKey, KeyRing
from gateway.limits.budgets import Budgets, usage_budgets
from gateway.limits.rateheaders import Lines
from gateway.limits.usage import UsageStore
from gateway.ops import tracing
from gateway.ops.metrics import Metrics, Record
from gateway.path.attempt import Job
from gateway.path.dialects import OPENAI, Dialect, decode_error
from gateway.path.lost import left, losses
from gateway.path.operation import COMPLETIONS, Operation
from gateway.path.relay import STREAM_FAILED, Held, Relay
from gateway.path.routing import Router
from gateway.path.services import Services
from gateway.queue import service as queue
from gateway.queue.grant import EngineGrant
from gateway.resilience.failover import Failover, Outcome
from gateway.resilience.health import Health
from gateway.state import SharedState
from gateway.upstream.client import Upstream
from gateway.upstream.plan import Plan
from gateway.upstream.scrub import Scrubber, watch_logs
from providers.base import CallContext, prompt_form
from wire.errors import UpstreamError
from wire.schema import CompletionRequest, encode

if TYPE_CHECKING:
    from gateway.ledger.book import Ledger

# gateway/edge/endpoint.py ends a stream that failed before the relay could say so with these bytes.
__all__ = ["STREAM_FAILED", "Front", "Pipeline", "Result", "release"]


class Result(msgspec.Struct):
    """A finished answer (`body`) or an open stream (`stream`), plus headers for the client."""

    headers: dict[str, str]
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None
    # What the stream holds until its relay begins; the endpoint releases it if the relay never does.
    held: Held | None = None
    # Header lines encoded already, sent after `headers`: the request's x-ratelimit headers (`Ticket.headers`),
    # or an early cached answer's (gateway/cache/hit.py).
    limits: Lines | None = None


# The lookup of a `Front` whose request the cache has not been asked about yet.
_LATER: Final = object()


# What `Pipeline.early` did of a request it did not answer, for `complete` to go on from: the key, the request,
# its plan (None: not routed yet, a spending limit is checked first) and what the cache's lookup returned (a
# Lookup, None, or a coroutine to await; `_LATER`: not looked up yet). A tuple: this is every miss's path.
Front = tuple[ClientKey | None, CompletionRequest, Plan | None, Any]


def release(front: Front) -> None:
    """For a request cancelled before `complete` ran: whoever waits on its answer asks for itself, and a
    lookup's coroutine that never ran is closed."""
    cached = front[3]
    if isinstance(cached, Lookup):
        cached.abandon()
    elif cached is not None and cached is not _LATER:
        cached.close()


class _Answered(msgspec.Struct):
    """What the replay of a cached answer reads of its request (the cache's `JobLike`): no `Job` is made. A
    struct, made without a Python call."""

    req: CompletionRequest
    ctx: CallContext
    ticket: Ticket | None = None


class Pipeline:
    def __init__(
        self,
        loaded: LoadedConfig,
        *,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        metrics: Metrics | None = None,
    ) -> None:
        self.loaded = loaded
        self.router = Router(loaded)
        self.keys = KeyRing(loaded)
        self.grant = EngineGrant(loaded)
        self.upstream = Upstream(loaded)
        self.shared = SharedState(loaded.config.redis.url)
        on_cooldown = metrics.cooldown if metrics is not None else None
        self.health = Health(
            self.shared,
            loaded.config.cooldown,
            clock=clock,
            on_cooldown=on_cooldown,
            refresh_ms=loaded.config.redis.refresh_ms,
            inflight_ttl_ms=loaded.config.redis.lease_ttl_ms,
            shared_name=lambda target: self.router.identity(target),
        )
        self.log_prompts = loaded.config.logging.prompts
        self.log_requests = loaded.config.logging.requests
        self.failover = Failover(self.health, clock=clock, **({"sleep": sleep} if sleep else {}))
        self.admission = Admission(loaded, self.shared, **({"sleep": sleep} if sleep else {}))
        self.admission.limiter.solo(self._alone)
        self.usage = UsageStore(loaded, self.shared, metrics=metrics)
        # Budgets by reservation (gateway/limits/budgets.py); with a ledger, the ledger's replace them.
        self.budgets: Budgets = usage_budgets(loaded, self.usage)
        # None unless tracing is on (gateway/ops/tracing.py): the endpoint then opens a span per request.
        self.tracing = tracing.from_config(loaded)
        self.trace_link = loaded.config.tracing.client_context == "link"
        # Built once per config: cuts the config's secrets out of upstream text (errors, logs).
        self.scrub = Scrubber.from_config(loaded)
        watch_logs(self.scrub)
        caps = loaded.config.caps
        self.services = Services(self.upstream, self.health, caps, loaded.config.guided_retries)
        self.relay = Relay(self.services, self.admission, self.health, self.failover, self.scrub)
        # None unless a `cache` block is on: then the request path pays one attribute check (gateway/cache).
        self.cache = cache.build(loaded, self.shared, self.admission, metrics)
        # None unless a server has `max_concurrency`: then each attempt waits for a slot (gateway/queue).
        self.queues = queue.build(loaded, self.admission.limiter, metrics)

    ledger: Ledger | None = None  # the process's ledger, when one is configured (gateway/ledger/service.py)

    # Requests hold the pipeline they started with; a reload retires this one, which closes its pools
    # when the last of them ends.
    active = 0
    retiring = False  # set by a reload: the endpoint takes the new pipeline for a request not yet entered
    _closing: asyncio.Future[None] | None = None

    def _alone(self) -> bool:
        return self.active <= 1

    def enter(self) -> None:
        self.active += 1

    def exit(self) -> None:
        self.active -= 1
        if self.retiring and self.active == 0:
            self._close_soon()

    def retire(self) -> None:
        self.retiring = True
        if self.active == 0:
            self._close_soon()

    def _close_soon(self) -> None:
        if self._closing is None:
            self._closing = asyncio.ensure_future(self.close())

    async def close(self) -> None:
        await self.admission.drain()
        if self.queues is not None:
            await self.queues.close()  # spare leases go back before the limiter closes
        await self.admission.limiter.close()
        await self.health.close()
        await self.usage.drain()
        await self.upstream.close()
        await self.shared.close()

    def early(
        self,
        raw: bytes,
        headers: Mapping[str, str],
        rec: Record,
        op: Operation = COMPLETIONS,
        dialect: Dialect = OPENAI,
    ) -> Result | Front:
        """With a cache on, the request's front without a task or an await: decoded, authorized, routed and
        looked up. A hit that no rate limit has to count is answered here, with nothing else built for it;
        any other request goes on in `complete(front=...)` from where this left it."""
        key, req = self._decoded(raw, headers, rec, op, dialect)
        if key is not None and self.budgets.applies(key):
            return key, req, None, _LATER  # budgets are checked before the cache is looked at
        plan = self.router.plan(req.model)
        self._refine(req, plan, rec)
        if self.queues is not None and queue.HEADER in headers:
            self.queues.priority(key, headers)  # a priority the key may not ask for is refused, hit or not
        cached = self.cache.lookup(req, rec.key_id, headers, rec, plan)  # type: ignore[union-attr]  # the endpoint checked
        if type(cached) is Lookup and cached.entry is not None:
            admission = self.admission
            if not (admission.applies(key) and admission.counts_cached(key, req.model)):
                cached.count(rec)
                if not req.stream:  # its bytes and header lines made without a call context or headers dict
                    now = self.cache.clock()  # type: ignore[union-attr]
                    body, lines = answered(
                        cached.entry, cached.state, now, rec, op.new_id(), int(time.time()), req.model, op.chat
                    )
                    return Result({}, body, None, None, lines)
                now_s, last = int(time.time()), dialect.usage_last
                ctx = CallContext(id=op.new_id(), created=now_s, model=req.model, chat=op.chat, usage_last=last)
                return cached.replay(_Answered(req, ctx), rec, Result)
        return key, req, plan, cached

    async def complete(
        self,
        raw: bytes,
        headers: Mapping[str, str],
        dialect: Dialect,
        rec: Record | None = None,
        front: Front | None = None,
        op: Operation = COMPLETIONS,
    ) -> Result:
        rec = rec if rec is not None else Record(request_id="", dialect=dialect.name)
        try:
            job = await self._admit(raw, headers, rec, front, op, dialect)
            cached = job.cached
            if cached is not None:
                if not cached.direct:  # `direct`: a buffered miss (a stream goes through `serve`)
                    return await cached.serve(job, rec, self._buffered, self._streamed, Result)
                # A buffered miss of one prompt: the answer stored as it comes back, without `serve`.
                try:
                    result = await self._buffered(job, rec)
                except BaseException:
                    cached.count(rec)
                    cached.abandon()
                    raise
                cached.done(rec, result.body)
                result.headers["x-gateway-cache"] = cached.state
                return result
            if job.req.stream:
                return await self._streamed(job, rec)
            return await self._buffered(job, rec)
        except UpstreamError as exc:
            # The one way out for upstream errors before a stream starts: nothing unscrubbed passes it.
            raise self.scrub.error(exc) from None

    def _decoded(
        self, raw: bytes, headers: Mapping[str, str], rec: Record, op: Operation, dialect: Dialect
    ) -> tuple[ClientKey | None, CompletionRequest]:
        """Who asks, and for what: authenticated, decoded, amended by the route, normalized and authorized."""
        key = self.keys.authenticate(headers)
        return key, self._checked(key, raw, rec, op, False, dialect)

    def front_as(self, key: ClientKey | None, raw: bytes, rec: Record, op: Operation = COMPLETIONS) -> Front:
        """A request made on behalf of `key` without its secret (a batch's line, gateway/batches): decoded,
        normalized and authorized as the key's own would be; `complete(front=..., op=op)` does the rest."""
        return key, self._checked(key, raw, rec, op, True), None, _LATER

    def _checked(
        self,
        key: ClientKey | None,
        raw: bytes,
        rec: Record,
        op: Operation,
        batch: bool = False,
        dialect: Dialect = OPENAI,
    ) -> CompletionRequest:
        if key is not None:
            rec.key, rec.key_label, rec.key_id, rec.team = key.name, key.label, key.ident, key.team or ""
        try:
            req = op.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise decode_error(exc) from None
        if dialect.amends and not op.chat:  # the route's own defaults and bounds (its seed's completion schema)
            dialect.amend(req)
        op.normalize(req, self.loaded.config.caps)
        self.keys.authorize(key, req.model)
        if req.priority is not None:  # the engine's own order, which the gateway's classes would not bound
            self.grant.check(key, batch)
        rec.model = req.model  # a budget refusal counts under the model asked for (routing refines it below)
        return req

    def _refine(self, req: CompletionRequest, plan: Plan, rec: Record) -> None:
        alias = req.model in self.router.aliases
        rec.model = req.model if alias else plan.groups[0].routes[0].key
        rec.stream = bool(req.stream)
        if self.log_prompts:
            rec.prompt = req.prompt if isinstance(req.prompt, str) else encode(req.prompt).decode()

    async def _admit(
        self,
        raw: bytes,
        headers: Mapping[str, str],
        rec: Record,
        front: Front | None,
        op: Operation,
        dialect: Dialect = OPENAI,
    ) -> Job:
        """Who asks, for what, and whether they may: the request decoded, routed and admitted."""
        if front is None:
            key, req = self._decoded(raw, headers, rec, op, dialect)
            plan: Plan | None = None
            looked: Any = _LATER
        else:
            key, req, plan, looked = front
        if plan is None:
            budgeted = key if key is not None and self.budgets.applies(key) else None
            plan = self.router.plan(req.model)
            if budgeted is not None:
                rec.hold = await self.budgets.reserve(budgeted, req, plan, self.usage.prices, self.shared)
            self._refine(req, plan, rec)
        ctx = CallContext(
            id=op.new_id(),
            created=int(time.time()),
            model=req.model,
            prompts=_text_prompts(req),
            stop_reason=bool(req.include_stop_reason),
            n=req.n or 1,
            echo=bool(req.echo),
            logprobs=req.logprobs is not None,
            top_logprobs=req.logprobs or 0,
            chat=op.chat,
            usage_last=dialect.usage_last,
        )
        # Who asks, for the fair queue (a priority the key may not ask for is refused before anything is charged).
        # A batch's line waits below every interactive request, and meets its own rate limits, not its key's.
        batch = rec.batch_id is not None
        ask = self.queues.ask(key, headers, req, batch) if self.queues is not None else None
        admission = self.admission if self.admission.applies(key, batch) else None
        if batch and admission is not None:
            admission = admission.lines  # the shared quotas through `batches.quota_share`
        # Read by a replicated provider's policy (gateway/fleet) and by the attempts on an engine that is salted:
        # the key scopes its sessions, its prefixes and its engine's prefix-cache salt. Set before admission,
        # whose wait may make the first attempt's upstream request ahead (`Job.prepare`), salt included.
        hint = Hint(req, headers, rec.key_id, rec.team) if self.router.hints else None
        if self.cache is None:
            job = op.job(self.services, admission, req, ctx, plan)
            job.hint = hint
            if admission is not None:
                meanwhile = job.prepare if self._alone() else None
                job.ticket = await admission.admit(key, req, plan, meanwhile=meanwhile, batch=batch)
                job.prepaid = plan.single is not None  # a direct request's route quota, charged for its first call
        else:
            cached = looked
            if type(cached) is not Lookup:  # one test for the common case, a lookup `early` settled
                if cached is _LATER:
                    cached = self.cache.lookup(req, rec.key_id, headers, rec, plan)
                if cached is not None and not isinstance(cached, Lookup):
                    cached = await cached  # a Redis read
            job = op.job(self.services, admission, req, ctx, plan)
            job.hint = hint
            # Identical to a request in flight: admitted as the upstream request it may yet make (its key's and
            # alias's tokens and `concurrent` slot held while it waits), its route's quota charged only if it does.
            waits = cached is not None and cached.ahead is not None
            if admission is not None:
                try:
                    # An answer the cache serves costs no upstream tokens, and needs no upstream request.
                    free = cached is not None and cached.entry is not None
                    meanwhile = job.prepare if not free and not waits and self._alone() else None
                    job.ticket = await admission.admit(
                        key, req, plan, free=free, meanwhile=meanwhile, waits=waits, batch=batch
                    )
                    job.prepaid = plan.single is not None and not free and not waits
                except BaseException:
                    if cached is not None:
                        cached.abandon()  # whoever waits on this request's answer asks for itself
                    raise
            if waits:
                try:
                    cached = await self.cache.coalesce(cached, req)
                except BaseException:
                    self.admission.settle(job.ticket, 0)  # past its deadline, or its client gone: nothing used
                    raise
            job.cached = cached
        job.ask = ask
        return job

    async def _buffered(self, job: Job, rec: Record) -> Result:
        """Every attempt of an unstreamed request, then its answer: encoded once, with its usage booked."""
        used: int | None = 0
        started = time.perf_counter()
        try:
            done = await self.failover.run(
                job.plan,
                job.complete,
                deadline_s=job.deadline_s,
                tenant=rec.key_id or rec.key,
                client_headers=bool(job.req.inference_extra_headers),
                hint=job.hint,
                cancelled=_attempts_of(rec),
                lost=losses(job, rec) if job.plan.policy.hedge_after_ms is not None else None,
            )
            usage = done.value.usage
            used = usage.total_tokens if usage is not None else None
        except asyncio.CancelledError:
            used = left(job, rec)
            raise
        finally:
            rec.upstream_s = time.perf_counter() - started
            if job.ask is not None:
                rec.queue_s = job.ask.waited
            self.admission.settle(job.ticket, used)
        _served(rec, job.plan, done)
        rec.usage = done.value.usage
        if job.cached is not None:
            # A chat answer too: the cache stores it by what both shapes have (gateway/cache/chat.py).
            job.cached.answer = done.value  # type: ignore[assignment]  # not `cast`: a call per request
        if self.log_prompts:
            rec.completion = encode([ch.text for ch in done.value.choices]).decode()
        return Result(_headers(done, job), body=encode(done.value), limits=_limits(job))

    async def _streamed(self, job: Job, rec: Record) -> Result:
        """Every attempt of a streamed request up to its first event; then the relay has the stream."""
        started = time.perf_counter()
        try:
            opened = await self.failover.run(
                job.plan,
                job.open,
                deadline_s=job.deadline_s,
                discard=job.discard,
                keep=job.keep,
                tenant=rec.key_id or rec.key,
                client_headers=bool(job.req.inference_extra_headers),
                hint=job.hint,
                cancelled=_attempts_of(rec),
                lost=losses(job, rec) if job.plan.policy.hedge_after_ms is not None else None,
            )
        except asyncio.CancelledError:
            self.admission.settle(job.ticket, left(job, rec))  # before its first event: as a buffered one
            raise
        except BaseException:
            self.admission.settle(job.ticket, 0)
            raise
        finally:
            rec.upstream_s = time.perf_counter() - started
            if job.ask is not None:
                rec.queue_s = job.ask.waited
        _served(rec, job.plan, opened)
        job.until = opened.deadline
        held = Held(self.relay, opened.value, job, rec.request_id)
        stream = self.relay.stream(opened.value, opened.route, job, rec, held)
        return Result(_headers(opened, job), stream=stream, held=held, limits=_limits(job))


def _attempts_of(rec: Record) -> Callable[[int], None]:
    """What tells `rec` the upstream calls its request made, hedges included, when the client left before
    an answer: the access log, the metrics and the ledger count them as they would an answer's."""

    def cancelled(attempts: int) -> None:
        rec.attempts = attempts

    return cancelled


def _served(rec: Record, plan: Plan, outcome: Outcome[Any]) -> None:
    route = outcome.route
    key = rec.target = route.key
    rec.provider, rec.attempts = route.provider, outcome.attempts
    # Served by a fallback: by none of the first group's routes, nor any of their replicas. Loops, not `all`
    # over generators: each generator is a call of its own.
    for r in plan.groups[0].routes:
        if r.key == key:
            return
        for x in r.replicas:
            if x.key == key:
                return
    rec.fallback = True


def _headers(outcome: Outcome[Any], job: Job) -> dict[str, str]:
    """What served the answer and the parameters dropped for that target (the rate-limit state: `_limits`)."""
    route = outcome.route
    headers = {
        "x-gateway-provider": route.provider,
        "x-gateway-model": route.key,
        "x-gateway-attempts": str(outcome.attempts),
    }
    lost = job.dropped.get(route.key)
    if lost:
        headers["x-gateway-dropped-params"] = ",".join(lost)
    return headers


def _limits(job: Job) -> Lines | None:
    ticket = job.ticket
    return None if ticket is None else ticket.headers


def _text_prompts(req: CompletionRequest) -> list[str] | None:
    form = prompt_form(req.prompt)
    if form == "text":
        return [req.prompt]  # type: ignore[list-item]
    if form == "texts":
        return list(req.prompt)  # type: ignore[arg-type]
    return None
