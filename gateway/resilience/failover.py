"""Attempts, retries and hedging for one request: one explicit loop over the plan's targets.

Each step decides whether to go on, where (the same target or the next) and how long to wait; a failure
that blames the target, not the request, is reported to health once per request (which cools it for
every replica at once or on evidence, docs/resilience.md "Cooldowns"); nothing runs after a streamed byte.
`sleep` and `clock` are injectable so tests assert exact waits. The rules: docs/resilience.md; why a loop
and not tenacity: docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

import msgspec

from gateway.fleet.picker import Hint
from gateway.ops import tracing
from gateway.resilience.balancer import Selector
from gateway.resilience.blame import blame as _blame
from gateway.resilience.blame import charge as _charge
from gateway.resilience.blame import cleared_for as _cleared_for
from gateway.resilience.blame import own_deadline as _own_deadline
from gateway.resilience.health import Health, TargetState
from gateway.upstream.plan import Plan, Route
from gateway.upstream.transport import Timeouts
from wire.errors import GatewayError, UpstreamTimeoutError

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]
Call = Callable[[Route, Timeouts], Awaitable[T]]
# Called with a result that lost a hedge race and will not be used (an open stream to close).
Discard = Callable[[T], None]
# Called with a successful attempt's result and its target's key when the result keeps the target's
# in-flight count past the attempt (an open stream: the relay gives it back when the stream ends).
Keep = Callable[[T, str], None]
Cancelled = Callable[[int], None]
# Called with each hedged call whose answer the request will not use: its target, its result when it answered
# (None: cancelled while it ran), and whether it was the first of the race (it ran `hedge_after_ms` at least;
# a later one may be cut before it was sent). The upstream was asked all the same, and is paid for it.
Lost = Callable[[Route, T | None, bool], None]


class Outcome(msgspec.Struct, Generic[T]):
    value: T
    route: Route
    attempts: int
    deadline: float = 0.0  # the run's (on the failover's clock): what a continuation of its stream has left


def backoff(initial_s: float, max_s: float, turn: int) -> float:
    """Full jitter after the loop's `turn`-th attempt failed: uniform(0, min(max, initial x 2^(turn-1)))."""
    exponent = turn - 1
    high = max_s if exponent >= 64 else min(initial_s * 2**exponent, max_s)
    return random.uniform(0, high)


class Failover:
    def __init__(
        self,
        health: Health,
        *,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.health = health
        self.sleep = sleep
        self.clock = clock

    def run(
        self,
        plan: Plan,
        call: Call[T],
        *,
        deadline_s: float | None = None,
        discard: Discard[T] | None = None,
        keep: Keep[T] | None = None,
        tenant: str | None = None,
        client_headers: bool = False,
        hint: Hint | None = None,
        avoid: str | None = None,
        cancelled: Cancelled | None = None,
        lost: Lost[T] | None = None,
    ) -> Coroutine[Any, Any, Outcome[T]]:
        """`deadline_s` is the client's own (it can only shorten `total_ms`), `tenant` its key's identity and
        `client_headers` whether it forwards headers upstream: what decides whom a failure blames. `hint`
        is what a replicated provider's policy reads (the prompt, the session), None without fleets.
        `avoid` is a target this request takes for cooling whatever its state (a broken stream's, which its
        continuation must not go back to). `cancelled` learns how many calls a cancelled request made, `lost`
        each hedged call that did not serve it (a loser, or every call of a request cancelled during a hedge).

        The loop's own coroutine when the targets' states and the first target are at hand (nearly every
        request): one frame less on every resume of the upstream call."""
        total = plan.timeouts.total if deadline_s is None else min(plan.timeouts.total, deadline_s)
        run = Run(self, plan, call, discard, self.clock() + total, total)
        run.tenant, run.client_headers, run.cancelled, run.lost = tenant, client_headers, cancelled, lost
        run.keep = keep if plan.tracks_inflight else None
        run.client_deadline = _own_deadline(plan, deadline_s)
        states = self.health.at_hand(plan.keys)
        if states is None:
            return self._begin(run, None, hint, avoid)
        selector = self._selector(plan, states, tenant, hint, avoid)
        first = selector.first_now()
        if first is None:
            return self._begin(run, selector, hint)
        run.selector, run.route = selector, first
        return run.go()

    async def broke(
        self,
        plan: Plan,
        route: Route,
        exc: GatewayError,
        *,
        deadline_s: float | None,
        tenant: str | None,
        client_headers: bool,
    ) -> None:
        """A stream that broke after its first event (its attempt had succeeded), judged as a failed attempt
        is (`Run._report`): a key's own headers or input cool nothing at once, and with a deadline of the
        request's own (`run`'s `deadline_s`) no timeout of the stream blames its target."""
        if _own_deadline(plan, deadline_s) and isinstance(exc, UpstreamTimeoutError):
            return  # the request's own deadline ran out, not the target's time
        blame = _blame(exc, client_headers=client_headers)
        if blame is not None:
            await _charge(self.health, route.key, tenant, exc, blame, failing=False)

    def _selector(
        self,
        plan: Plan,
        states: dict[str, TargetState],
        tenant: str | None,
        hint: Hint | None,
        avoid: str | None = None,
    ) -> Selector:
        suspects = self.health.evidence.suspects
        if suspects and tenant is not None:
            _cleared_for(tenant, states, suspects, self.health.named)
        if avoid is not None:
            avoided = states.get(avoid)
            if avoided is not None and avoided.cooling_ms <= 0:
                states[avoid] = msgspec.structs.replace(avoided, cooling_ms=1, cause=avoided.cause or "error")
        return Selector(plan, states, self.health, probe_ttl_ms=plan.policy.timeouts.first_byte_ms, hint=hint)

    async def _begin(
        self, run: Run[T], selector: Selector | None, hint: Hint | None, avoid: str | None = None
    ) -> Outcome[T]:
        """The way in when the states must be read or the first target needs a probe claimed."""
        if selector is None:
            states = await self.health.snapshot(run.plan.keys)
            selector = self._selector(run.plan, states, run.tenant, hint, avoid)
        try:
            first = await selector.first()
        except GatewayError as exc:
            raise exc.evolve(attempts=0) from None  # every target is cooling: no upstream call was made
        run.selector, run.route = selector, first
        return await run.go()


class Run(Generic[T]):
    """One request's way through its plan: the state the loop carries from one attempt to the next.

    `attempt` is the one place an upstream attempt starts and ends (hedges included): its target is
    known on the way in and its outcome on the way out.
    """

    __slots__ = (
        "failover",
        "plan",
        "call",
        "discard",
        "keep",
        "selector",
        "route",
        "deadline",
        "total",
        "attempts",
        "base",
        "tenant",
        "client_headers",
        "client_deadline",
        "blamed",
        "cancelled",
        "lost",
    )

    def __init__(
        self,
        failover: Failover,
        plan: Plan,
        call: Call[T],
        discard: Discard[T] | None,
        deadline: float,
        total: float,
    ) -> None:
        self.failover = failover
        self.plan = plan
        self.call = call
        self.discard = discard
        self.keep: Keep[T] | None = None
        self.selector: Selector  # set with the first target, before `go`
        self.route: Route  # the target the next attempt goes to
        self.deadline = deadline
        self.total = total
        self.attempts = 0  # upstream calls made, hedges included
        self.base = plan.timeouts
        self.tenant: str | None = None
        self.client_headers = False
        self.client_deadline = False  # the client's `inference_timeout` is shorter than the plan's total
        self.blamed: tuple[str, ...] = ()  # targets this request's failures already reported: once each
        self.cancelled: Cancelled | None = None
        self.lost: Lost[T] | None = None

    async def go(self) -> Outcome[T]:
        f, policy = self.failover, self.plan.policy
        r = policy.retries
        budget_s = r.budget_ms / 1000
        hedge_s = None if policy.hedge_after_ms is None else policy.hedge_after_ms / 1000
        same_left = self._same_target(self.route)  # same-target retries left for `self.route`
        started = f.clock()
        turn = 0
        try:
            while True:
                turn += 1
                route = self.route
                try:
                    timeouts = self._timeouts()  # past the deadline no call is made, and none is counted
                    self.attempts += 1
                    if hedge_s is not None and self.attempts < r.attempts:
                        value, served = await self._hedged(timeouts, hedge_s)
                    else:
                        served = self.route
                        value = await self.attempt(served, timeouts)
                    return Outcome(value=value, route=served, attempts=self.attempts, deadline=self.deadline)
                except GatewayError as exc:
                    # Kept without a traceback on it or on what it chains (the attempt's original error), which hold
                    # this very frame (and through it `failed`): a cycle the collector alone would free, at every
                    # request that fails over or gives up. What reaches the client and the log is `_gave_up`'s copy,
                    # which has a traceback of its own.
                    failed = exc.detached()
                    if exc.no_call:  # a full server, a field the target cannot honour: not an attempt
                        self.attempts -= 1
                if self.route is not route:  # a hedge whose second target failed first: its retries are its own
                    same_left = self._same_target(self.route)
                if not self._retryable(failed) or self.attempts >= r.attempts:
                    raise self._gave_up(failed, out_of_budget=False)
                # Where the next attempt goes, and after how long. A Retry-After is the wait; else a backoff,
                # drawn once and only for a wait taken (a move to a fresh target draws nothing).
                pause = failed.retry_after
                wait: float | None = None
                if same_left > 0 and failed.same_target and not failed.elsewhere:
                    if pause is None:
                        pause = backoff(r.initial_backoff_ms / 1000, r.max_backoff_ms / 1000, turn)
                    now = f.clock()
                    if now - started + pause < budget_s and now + pause < self.deadline:
                        same_left -= 1  # a retry that could not start before the deadline is no retry
                        wait = pause
                if wait is None:
                    self.route, fresh = await self.selector.next()
                    if fresh:
                        same_left = self._same_target(self.route)
                        wait = 0.0
                    elif not failed.same_target:
                        # A timeout or an unreachable target: no other target is left, and repeating this
                        # one would only wait out the same timeout again (a one-target plan fails at once).
                        raise self._gave_up(failed, out_of_budget=False)
                    elif pause is not None:
                        wait = pause
                    else:
                        wait = backoff(r.initial_backoff_ms / 1000, r.max_backoff_ms / 1000, turn)
                now = f.clock()
                # A wait past the request's deadline ends it as one past the budget does: with the failure that
                # made it wait (its cause, target and Retry-After), not a `deadline_exceeded` slept into.
                if now - started + wait >= budget_s or (wait > 0 and now + wait >= self.deadline):
                    raise self._gave_up(failed, out_of_budget=True)
                await f.sleep(wait)
        except asyncio.CancelledError:
            if self.cancelled is not None:
                self.cancelled(self.attempts)  # the calls made for a client that left: its record's attempts
            raise

    async def attempt(self, route: Route, timeouts: Timeouts) -> T:
        """One upstream attempt on `route`: counted in flight, and its outcome reported to health.

        With `keep`, a successful attempt's count is not given back here but passes to its result (an
        open stream counts until the relay ends it); every other way out gives it back at once."""
        health, plan = self.failover.health, self.plan
        states = self.selector.states
        track = plan.tracks_inflight
        span = tracing.attempt(route)  # one span per upstream call, hedges included; None when not traced
        kept = False
        try:
            if track:
                await health.inflight(route.key, +1)  # a cancel during its shared write still gives it back
            started = self.failover.clock()
            value = await self.call(route, timeouts)
            if span is not None:
                span.succeeded(value)
            if self.keep is not None:
                self.keep(value, route.key)
                kept = True
        except GatewayError as exc:
            await self._report(route, timeouts, exc)
            if exc.target is None:  # made where the target was not known (an adapter's status mapping)
                raise exc.evolve(target=route.key, provider=route.provider) from None
            raise
        except asyncio.CancelledError:
            known = states.get(route.key)
            if known is not None and known.recovering:
                # A probe cancelled (a hedge that lost, a client gone) decided nothing: the next request probes.
                await health.release(route.key)
            raise
        finally:
            if span is not None:
                span.close(sys.exc_info()[1])  # the exception on its way out, if any
            if track and not kept:
                await health.inflight(route.key, -1)
        try:
            recovered = health.success(route.key, states.get(route.key), self.tenant)
            if recovered is not None:
                await recovered
            if plan.tracks_latency:
                await health.latency(route.key, (self.failover.clock() - started) * 1000)
        except BaseException:
            # Cancelled before the result reached anyone: nobody else will close it or give its count back.
            if self.discard is not None:
                self.discard(value)
            if kept:
                await health.inflight(route.key, -1)
            raise
        return value

    async def _report(self, route: Route, timeouts: Timeouts, exc: GatewayError) -> None:
        """Tell health what a failed attempt says about its target, if anything, once per request."""
        health, key = self.failover.health, route.key
        states = self.selector.states
        known = states.get(key)
        blame = _blame(exc, client_headers=self.client_headers)
        if (
            blame is not None
            and self.client_deadline
            and isinstance(exc, UpstreamTimeoutError)
            and (exc.cause == "total_timeout" or timeouts.first_byte < self.base.first_byte)
        ):
            blame = None  # the client's own deadline ran out, not the target's time
        if blame is None:
            if known is not None and known.recovering and key not in self.blamed:
                await health.release(key)  # this probe decided nothing: the next request probes
            return
        if key in self.blamed:
            # This request's retry failed again: one request is one piece of evidence, and one failure
            # of the cooldown's count; only a fresh Retry-After still extends the cooldown.
            if exc.retry_after is not None and known is not None and known.failures > 0:
                await health.failure(key, exc.retry_after, blame[0], count=False)
            return
        self.blamed += (key,)
        if not await _charge(health, key, self.tenant, exc, blame, failing=known is not None and known.failures > 0):
            return
        # Should this request retry the target and succeed, that success is its probe: it clears.
        failed = known or TargetState()
        states[key] = msgspec.structs.replace(failed, failures=failed.failures + 1)

    async def _hedged(self, timeouts: Timeouts, after_s: float) -> tuple[T, Route]:
        """Start a second target if the first has not answered within `after_s`; first answer wins."""
        first = self.route
        primary = asyncio.ensure_future(self.attempt(first, timeouts))
        routes = {primary: first}
        won: asyncio.Task[T] | None = None
        error: BaseException | None = None
        try:
            done, pending = await asyncio.wait(routes, timeout=after_s)
            if not done:
                second, fresh = await self.selector.next()
                if fresh:
                    later = self._timeouts()
                    self.attempts += 1
                    routes[asyncio.ensure_future(self.attempt(second, later))] = second
                pending = set(routes)
            while True:
                for task in done:
                    if task.exception() is None:
                        won = task
                        return task.result(), routes[task]
                    if error is None:  # the failure judged, and the target a same-target retry goes back to
                        error, self.route = task.exception(), routes[task]
                if not pending:
                    break
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # On every way out, a cancelled request's too: an attempt that answered in the turn the request was
            # cancelled holds an open stream, and its count, that nobody else would give back.
            await self._let_go(routes, won)
        assert error is not None
        try:
            raise error
        finally:
            error = None  # the traceback holds this frame: no cycle through it back to the exception

    async def _let_go(self, routes: dict[asyncio.Task[T], Route], won: asyncio.Task[T] | None) -> None:
        """Every hedged attempt but `won`: cancelled while it runs (it gives back what it holds), else its answer
        closed and the count it kept given back. Cancelled during those writes, the request lets go of `won` too."""
        kept: list[str] = []
        lost = self.lost
        for i, (task, route) in enumerate(routes.items()):
            if task is won:
                continue
            if not task.done():
                task.cancel()
                if lost is not None:
                    lost(route, None, not i)
            elif not task.cancelled() and task.exception() is None:
                if lost is not None:
                    lost(route, task.result(), not i)
                if self.discard is not None:
                    self.discard(task.result())
                if self.keep is not None:
                    kept.append(route.key)
        try:
            for key in kept:
                await self.failover.health.inflight(key, -1)
        except BaseException:
            if won is not None:
                await self._let_go({won: routes[won]}, None)
            raise

    def _timeouts(self) -> Timeouts:
        left = self.deadline - self.failover.clock()
        if left <= 0:
            raise UpstreamTimeoutError(
                f"The request's deadline of {self.total:g} s passed",
                code="deadline_exceeded",
                retryable=False,
                cause="deadline_exceeded",
            )
        return self.base.capped(left)

    def _same_target(self, route: Route) -> int:
        policy = self.plan.policy
        return policy.same_target if policy.same_target is not None else route.same_target

    def _retryable(self, exc: GatewayError) -> bool:
        if exc.context_window:
            return self.selector.switch_to_context_fallbacks()
        if exc.elsewhere:
            return self.selector.has_untried()
        return exc.retryable

    def _gave_up(self, exc: GatewayError, *, out_of_budget: bool) -> GatewayError:
        # The gateway spent its retries, or the failure is not one retrying helps: a client's retry would
        # only repeat them. Left to the client: a wait the budget could not hold, and every retry where the
        # operator had the gateway make none (`attempts: 1`).
        later = exc.retryable and (out_of_budget or self.plan.policy.retries.attempts == 1)
        return exc.evolve(attempts=self.attempts, retry_later=later)
