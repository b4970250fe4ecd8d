"""One attempt of one request on one target, as values, and the upstream calls it makes.

A `Job` is what every attempt of a request shares (the request, its context, its plan); the failover
loop calls `Job.complete` or `Job.open` once per attempt, which makes an `Attempt`: the job plus the
route and the timeouts. An attempt that needs emulation (docs/emulation.md) hands its own `call` to
gateway/emulation/planning.py, so a fan-out's sub-calls share the attempt's route, timeouts and context. A
stream's attempt ends when its first event has been read; gateway/path/relay.py takes it from there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Coroutine
from typing import Any, ClassVar, cast

import msgspec

from gateway import emulation
from gateway.cache import Lookup
from gateway.emulation import Emulation, Folded, SubStream
from gateway.emulation.client_schema import Work
from gateway.fleet.picker import Hint
from gateway.fleet.tenancy import salted
from gateway.limits.admission import Admission, Ticket
from gateway.path.answers import (
    MAX_REPORTED_TOKENS,
    answered,
    choices_asked,
    failed_attempt,
    ignored_n,
    in_range,
    parsed,
    sane_usage,
    unreadable,
)
from gateway.path.events import Parse, prepended, upstream_events
from gateway.path.fanout import open_all
from gateway.path.opened import Opened
from gateway.path.services import Services
from gateway.queue.gate import Slot
from gateway.queue.service import Ask
from gateway.upstream.client import Stream
from gateway.upstream.plan import Plan, Route
from gateway.upstream.transport import Timeouts
from providers.base import Adapter, CallContext, LocalAdapter, map_params
from wire.chat import ChatCompletion
from wire.errors import GatewayError
from wire.schema import Completion, CompletionRequest
from wire.upstream import UpstreamRequest

log = logging.getLogger("gateway")

# A client answer, of a completion or a chat request.
Answer = Completion | ChatCompletion
# The longest an upstream's own quota headers may keep its target off: a month (Mistral's longest window),
# so a reset header saying "99999h" does not park the target for years.
MAX_QUOTA_WAIT_S = 31 * 86400.0


class Job:
    """One admitted request as the failover loop sees it: what each of its attempts shares.

    `admission` is None when no limit applies. `ticket` is the request's admission, settled when the answer (or
    the stream) ends; `prepaid` whether it charged the route's quota for the first call (a direct request's): every
    other attempt charges its route's quota itself (a retry there its call alone: its tokens are the ticket's).
    """

    __slots__ = (
        "services",
        "admission",
        "req",
        "ctx",
        "plan",
        "dropped",
        "ticket",
        "work",
        "cached",
        "hint",
        "ask",
        "ahead",
        "called",
        "until",
        "prepaid",
    )
    # What makes each attempt: `Attempt`, or chat's (gateway/path/chat.py), set below the class.
    attempt: ClassVar[type[Attempt]]

    def __init__(
        self,
        services: Services,
        admission: Admission | None,
        req: CompletionRequest,
        ctx: CallContext,
        plan: Plan,
        ticket: Ticket | None = None,
    ) -> None:
        self.services = services
        self.admission = admission
        self.req = req
        self.ctx = ctx
        self.plan = plan
        self.dropped: dict[str, list[str]] = {}  # per route key: the parameters dropped for it
        self.ticket = ticket
        self.work: Work | None = None  # what checking guided answers may spend: every attempt's together
        self.cached: Lookup | None = None  # the response cache's part in this request (gateway/cache)
        self.hint: Hint | None = None  # what a replicated provider's policy reads (gateway/fleet)
        self.ask: Ask | None = None  # who asks, when a server has max_concurrency (gateway/queue)
        # The first attempt's upstream request made while admission waited (`prepare`): its route, the request
        # and the parameters dropped for it. Taken by the first attempt on that route.
        self.ahead: tuple[Route, UpstreamRequest, list[str]] | None = None
        # The latest upstream call's route (None: none yet): a client that leaves after it is charged its prompt.
        self.called: Route | None = None
        # A stream's deadline, its first failover run's (on the failover's clock): a resumed stream's
        # continuation has what is left of it, not a deadline of its own.
        self.until = 0.0
        self.prepaid = False

    @property
    def deadline_s(self) -> float | None:
        """The request's own `inference_timeout` (seconds): it can only shorten the plan's `total_ms`."""
        t = self.req.inference_timeout
        # A tuple, not `float | int`: that builds a union object on every call.
        return float(t) if isinstance(t, (float, int)) else None

    def prepare(self) -> None:
        """Make the first attempt's upstream request now, while admission's call to Redis is on the wire, so
        that its CPU overlaps the round trip instead of following it (the pipeline asks only when this request
        is the loop's one: under load other requests' work fills the wait). Only where the first target is
        known before the failover loop runs (one route, or routes tried in a fixed order; no fleet); whatever
        fails here is left for the attempt to raise again, where it is answered."""
        order = self.plan.fixed_order
        if not order:
            return
        route = order[0]
        try:
            made = self.attempt(self, route, self.plan.timeouts).ahead()
        except Exception:
            return
        if made is not None:
            self.ahead = (route, *made)

    def made(self, route: Route) -> UpstreamRequest | None:
        """The request `prepare` made for `route`, once: a second attempt there makes its own."""
        ahead = self.ahead
        if ahead is None or ahead[0] is not route:
            return None
        self.ahead = None
        if ahead[2]:
            self.dropped[route.key] = ahead[2]
        return ahead[1]

    async def _queued(self, ask: Ask, route: Route, timeouts: Timeouts) -> tuple[Slot, Timeouts]:
        """`ask.wait`. A request that leads identical ones (gateway/cache/inflight.py) counts as blocked while it
        waits: they would wait in its place in the queue (a low class, a heavy tenant), so after `PATIENCE_S`
        the first asks for itself and leads in its place."""
        cached = self.cached
        if cached is None or not cached.leading:
            return await ask.wait(route, timeouts, self.plan)
        cached.blocked = asyncio.get_running_loop().time()
        try:
            return await ask.wait(route, timeouts, self.plan)
        finally:
            cached.blocked = 0.0

    def complete(self, route: Route, timeouts: Timeouts) -> Coroutine[Any, Any, Answer]:
        """One buffered attempt on `route`, within the target's own quota and its server's slots."""
        paid, self.prepaid = self.prepaid, False
        if self.ask is None and (self.admission is None or paid):
            # No slot to take, no quota to charge: the attempt's coroutine itself, a frame less per upstream resume.
            return self.attempt(self, route, timeouts).complete()
        return self._complete(route, timeouts, paid)

    async def _complete(self, route: Route, timeouts: Timeouts, paid: bool) -> Answer:
        ask = self.ask
        slot = None
        if ask is not None:
            slot = ask.take(route)  # a free slot (NO_CAP's where the server has no cap); None: it must wait
            if slot is None:
                slot, timeouts = await self._queued(ask, route, timeouts)
        admission = None if paid else self.admission
        used: int | None = 0
        prompt: int | None = None  # its prompt's tokens as the answer's usage reports them
        try:
            quota = await admission.admit_route(route, self.req, self.ticket) if admission is not None else None
            attempt = self.attempt(self, route, timeouts)
            try:
                c = await attempt.complete()
                u = c.usage
                used, prompt = (u.total_tokens, u.prompt_tokens) if u is not None else (None, None)
                return c
            except asyncio.CancelledError:
                used = _cut(quota, attempt)
                raise
            finally:
                if admission is not None:
                    admission.settle(quota, used)
        finally:
            if slot is not None:
                slot.done(used, prompt)

    async def open(self, route: Route, timeouts: Timeouts) -> Opened:
        """One streamed attempt on `route`: the stream, opened to its first event, holds the target's quota
        and its server's slot until it ends."""
        paid, self.prepaid = self.prepaid, False  # before any wait: hedged attempts start side by side
        ask = self.ask
        slot = None
        if ask is not None:
            slot = ask.take(route)  # a free slot (NO_CAP's where the server has no cap); None: it must wait
            if slot is None:
                slot, timeouts = await self._queued(ask, route, timeouts)
        admission = None if paid else self.admission
        try:
            quota = await admission.admit_route(route, self.req, self.ticket) if admission is not None else None
            attempt = self.attempt(self, route, timeouts)
            try:
                opened = await attempt.open()
            except BaseException as exc:
                if admission is not None:
                    admission.settle(quota, _cut(quota, attempt) if isinstance(exc, asyncio.CancelledError) else 0)
                raise
        except BaseException:
            if slot is not None:
                slot.done(0)
            raise
        opened.quota = quota
        opened.slot = slot
        return opened

    @staticmethod
    def keep(opened: Opened, target: str) -> None:
        """The stream counts in flight on `target` until the relay ends it (docs/fleets.md)."""
        opened.held = target

    def discard(self, lost: Opened) -> None:
        """A stream that lost a hedge race: closed, and its quota and slot given back."""
        lost.drop()
        if self.admission is not None:  # the upstream took its prompt and sent its first event
            self.admission.settle(lost.quota, lost.quota.prompt + 1 if lost.quota is not None else 0)
        if lost.slot is not None:
            lost.slot.done(0)
            lost.slot = None


class Attempt:
    """One attempt of a job on one route, within `timeouts`: one upstream call, or an emulation's several."""

    __slots__ = ("job", "services", "admission", "route", "req", "ctx", "timeouts", "dropped", "charged", "own", "sent")

    def __init__(self, job: Job, route: Route, timeouts: Timeouts) -> None:
        self.job = job
        self.services = job.services
        self.admission = job.admission
        self.route, self.timeouts = route, timeouts
        self.req, self.ctx = job.req, job.ctx
        if route.salt is not None and job.hint is not None:  # the tenant's prefix-cache salt (docs/fleets.md)
            self.req = salted(job.req, job.hint.scope(route.salt))
        self.dropped = job.dropped
        # An emulation's upstream calls: charged beyond admission's one (`own` of them on this process's own
        # state, while Redis was away), and made (docs/ratelimits.md).
        self.charged = self.own = self.sent = 0

    def _emulation(self) -> Emulation | None:
        route, services = self.route, self.services
        return emulation.plan(
            route.adapter, self.req, route.provider, services.guided_retries, services.caps, route.endpoint
        )

    def ahead(self) -> tuple[UpstreamRequest, list[str]] | None:
        """The upstream request this attempt would send for the job's request, made before the attempt runs
        (`Job.prepare`), with the parameters dropped for it; None where the attempt emulates or runs in process."""
        route, req = self.route, self.req
        if route.adapter.in_process or self._emulation() is not None:
            return None
        params, lost = self._mapped(req)
        return cast(Adapter, route.adapter).build_request(req, route.endpoint, params), lost

    def complete(self) -> Coroutine[Any, Any, Answer]:
        # The coroutine itself, not awaited here: one frame less on every resume of the upstream call.
        if self.job.ahead is not None:
            made = self.job.made(self.route)
            if made is not None:
                return self.call(self.req, made)
        em = self._emulation()
        if em is None:
            return self.call(self.req)
        return self._complete(em, self.req)

    async def _complete(self, em: Emulation, req: CompletionRequest) -> Completion:
        await self._charge(em)
        try:
            work = self._work() if em.guide is not None else None
            return await emulation.complete(em, req, self.ctx, self.call, self._again, work)
        finally:
            self._unsent()

    async def _charge(self, em: Emulation) -> None:
        """The fan-out's calls beyond the one admission charged, to the target's request buckets: all of
        them before the first is made, so a refused fan-out makes no call (docs/ratelimits.md)."""
        calls = len(em.prompts) * em.fan_n
        if calls > 1 and self.admission is not None:
            param = "best_of" if em.best_of else "n" if em.fan_n > 1 else "prompt"
            here = await self.admission.charge_calls(self.route, calls - 1, param)
            self.charged, self.own = calls - 1, (calls - 1 if here else 0)

    async def _again(self, req: CompletionRequest) -> Completion:
        """A guided output's retry: one more upstream call, charged before it is made."""
        await self._charge_again()
        return await self.call(req)

    async def _charge_again(self) -> None:
        if self.admission is not None:
            self.own += await self.admission.charge_calls(self.route, 1)
            self.charged += 1

    def _unsent(self) -> None:
        """Give back what was charged for calls never made: sub-calls refused before they were sent (a 400
        from the adapter), or cancelled when another one failed. Admission's unit stays, as for any request.
        Those charged on this process's state go back there first: Redis errs charged, never short."""
        unsent = self.charged - max(self.sent - 1, 0)
        if unsent > 0 and self.admission is not None:
            self.admission.give_back_calls(self.route, unsent, self.own)

    def _work(self) -> Work:
        """The request's checking budget, made by its first guided attempt: the attempt's timeouts end at the
        request's deadline (gateway/resilience/failover.py caps them to what is left of it)."""
        job = self.job
        if job.work is None:
            job.work = Work(self.services.caps.guided_work, time.monotonic() + self.timeouts.total)
        return job.work

    async def open(self) -> Opened:
        if self.job.ahead is not None:
            made = self.job.made(self.route)
            if made is not None:
                return await self.open_one(self.req, made)
        em = self._emulation()
        if em is None:
            return await self.open_one(self.req)
        if em.guide is not None:
            # Bytes sent cannot be taken back: a guided stream is made from an answer already validated.
            plain = msgspec.structs.replace(self.req, stream=False, stream_options=None)
            answer = await self._complete(em, plain)
            chunks = _replay(emulation.to_chunks(answer))
            return Opened(chunks, await anext(chunks, None), ctx=self.ctx)
        await self._charge(em)
        try:
            opens = await open_all([self.open_one(s) for s in emulation.sub_requests(em, self.req)])
        finally:
            self._unsent()
        # A completion attempt's sub-streams carry completion chunks (chat's: gateway/path/chat.py).
        into = Folded()
        merged = emulation.stream(em, self.req, self.ctx, cast("list[SubStream]", opens), into)
        return Opened(merged, await anext(merged, None), ctx=opens[0].ctx, children=opens, folded=into)

    def _mapped(self, req: CompletionRequest) -> tuple[dict[str, Any], list[str]]:
        """`req` checked against the route's table, its parameters mapped, and those dropped (not recorded)."""
        route = self.route
        route.adapter.check(req, route.provider)
        return map_params(req, route.adapter.params, route.provider, route.drop_unsupported)

    def _prepare(self, req: CompletionRequest) -> dict[str, Any]:
        params, lost = self._mapped(req)
        if lost:
            self.dropped[self.route.key] = lost
        return params

    async def _quota_used_up(self, wait: float) -> None:
        """An answer said the upstream's quota is now used up (`adapter.exhausted_for`): stop every replica
        sending more. Its callers read the headers themselves, so the common answer awaits nothing more."""
        await self.services.health.exhausted(self.route.key, min(wait, MAX_QUOTA_WAIT_S))

    async def exchange(self, adapter: Adapter, upstream_req: UpstreamRequest) -> bytes:
        """One buffered upstream call of this attempt's route: the answer's body, or the provider's error."""
        route = self.route
        self.sent += 1
        self.job.called = route
        resp = await self.services.upstream.send(route.provider, upstream_req, self.timeouts, route.key)
        if resp.status >= 400:
            raise adapter.map_error(resp.status, resp.headers, resp.body, route.provider)
        wait = route.adapter.exhausted_for(resp.headers)
        if wait is not None:
            await self._quota_used_up(wait)
        return resp.body

    async def call(self, req: CompletionRequest, made: UpstreamRequest | None = None) -> Completion:
        """One upstream call for `req` (the request, or one of an emulation's sub-requests), buffered; `made`:
        its upstream request, made ahead (`Job.prepare`)."""
        route = self.route
        adapter = route.adapter
        if made is None:
            params = self._prepare(req)
            if adapter.in_process:
                self.sent += 1
                self.job.called = route
                return await cast(LocalAdapter, adapter).complete(req, route.endpoint, _fresh(self.ctx))
            made = cast(Adapter, adapter).build_request(req, route.endpoint, params)
        adapter = cast(Adapter, adapter)
        ctx = _fresh(self.ctx)
        if req.n is not None and req.n != ctx.n:
            ctx.n = req.n  # best_of's candidates asked for in one call: the answer numbers that many choices
        body = await self.exchange(adapter, made)
        answer = parsed(route, adapter.parse_response, body, ctx)
        choices = answer.choices
        # The common answer (one prompt as text, no `n`, one choice numbered 0) takes no call to be checked.
        if len(choices) != 1 or choices[0].index or req.n is not None or type(req.prompt) is not str:
            answered(route, choices, choices_asked(req), req.n, self.services.ignores_n)
        u = answer.usage
        # sane_usage's common case, inline: every answer passes here, and a call costs more than the check.
        if u is not None and not (
            0 <= u.prompt_tokens <= MAX_REPORTED_TOKENS
            and 0 <= u.completion_tokens <= MAX_REPORTED_TOKENS
            and u.prompt_tokens + u.completion_tokens <= u.total_tokens <= MAX_REPORTED_TOKENS
            and u.completion_tokens_details is None
            and u.prompt_tokens_details is None
        ):
            answer.usage = sane_usage(u)
        return answer

    async def open_one(self, req: CompletionRequest, made: UpstreamRequest | None = None) -> Opened:
        """One upstream call for `req`, streamed: opened and read to its first event that carries something;
        `made`: its upstream request, made ahead (`Job.prepare`)."""
        route = self.route
        adapter = route.adapter
        if made is None:
            params = self._prepare(req)
            if adapter.in_process:
                self.sent += 1
                ctx = _fresh(self.ctx)
                local = cast(LocalAdapter, adapter).stream(req, route.endpoint, ctx)
                return Opened(local, await anext(local, None), ctx=ctx)
        adapter = cast(Adapter, adapter)
        if req.n is not None and req.n > 1 and route.key in self.services.ignores_n:
            raise ignored_n(route, choices_asked(req), choices_asked(req) // req.n)
        if made is None:
            made = adapter.build_request(req, route.endpoint, params)
        ctx = _fresh(self.ctx)
        self.sent += 1
        self.job.called = route
        stream = await self.services.upstream.open_stream(route.provider, made, self.timeouts, route.key)
        return await self.first_event(stream, adapter, adapter.parse_event, adapter.framing, ctx, choices_asked(req))

    async def first_event(
        self, stream: Stream, adapter: Adapter, parse: Parse, framing: str, ctx: CallContext, asked: int
    ) -> Opened:
        """An opened upstream stream, read to its first event that carries something (or failed), whose choices are
        numbered within the `asked` for."""
        route = self.route
        try:
            if stream.status >= 400:
                body = await stream.read_all()
                raise adapter.map_error(stream.status, stream.headers, body, route.provider)
            wait = route.adapter.exhausted_for(stream.headers)
            if wait is not None:
                await self._quota_used_up(wait)
            events = upstream_events(parse, framing, stream, ctx, self.services.caps, self.timeouts.stream_idle)
            try:
                first = await anext(events, None)
                # Events that carry nothing for the client (Azure's prompt-filter chunk) are not a start.
                while first is not None and not first.choices and first.usage is None:
                    first = await anext(events, None)
                if first is not None and not first.choices:
                    # Its usage before any choice: a stream that ends there generated nothing, as an empty one.
                    after = await anext(events, None)
                    first, events = (None, events) if after is None else (first, prepended(after, events))
            except GatewayError:
                raise
            except Exception as exc:
                # Nothing reached the client yet: a first event that cannot be read is a failed attempt.
                raise unreadable(route, "stream event", exc) from None
            if first is None:
                # Nothing reached the client yet: an empty stream is a failed attempt, retried like one.
                raise failed_attempt(
                    route, "ended the stream early", "upstream_stream_ended_early", "stream_ended_early"
                )
            in_range(route, first.choices, asked)
        except BaseException:
            stream.close()
            raise
        return Opened(events, first, stream, ctx=ctx)


Job.attempt = Attempt


async def _replay(chunks: list[Completion]) -> AsyncGenerator[Completion, None]:
    for c in chunks:
        yield c


def _cut(quota: Ticket | None, attempt: Attempt) -> int:
    """What a target's quota is charged for an attempt cancelled while it ran (a hedge that lost, a client
    gone): its prompt once a call was sent, which the upstream took; nothing before."""
    return quota.prompt if quota is not None and attempt.sent else 0


def _fresh(ctx: CallContext) -> CallContext:
    """A context for one upstream call: attempts (and hedged pairs) never share parser state."""
    return msgspec.structs.replace(ctx, offsets={}, state={}, ended=False)
