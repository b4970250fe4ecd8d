"""Attempts, retries and hedging for one request, driven by tenacity.

    stop  = retries.attempts upstream calls made (hedges count) | a wait that would pass retries.budget_ms
    retry = the error is retryable (408/409/429/5xx/529, connect errors, read timeouts; never a quota
            429 or a client error), or a context-window error with larger-context fallbacks left
    wait  = the same target again, after the provider's Retry-After (else exponential backoff with full
            jitter), up to retries.same_target times for a transient failure (5xx, dropped connection,
            429) whose wait fits the budget; otherwise 0 when the next attempt goes to a target not yet
            tried (another healthy target exists); otherwise the last target after its wait again

Timeouts, unreachable targets, exhausted quotas, refused credentials and a 404 never wait for the
same target while another one is left. A same-target retry goes through the cooldown its own failure
started (every other request skips the target meanwhile): it is the target's probe, and its success
ends the cooldown for everyone.

Every failed attempt that says something about the target (429, 5xx, timeout, connect error) cools
that target down for every replica. `sleep` and `clock` are injectable so tests can assert the exact
waits without waiting. Nothing here runs after a streamed byte has reached the client: a stream's
attempt ends when its first event has been read.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar, cast

import msgspec
from tenacity import AsyncRetrying, RetryCallState, wait_random_exponential

from gateway import tracing
from gateway.balancer import Selector
from gateway.errors import GatewayError, UpstreamTimeoutError
from gateway.health import Health, TargetState
from gateway.routing import Plan, Route
from gateway.upstream import Timeouts

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]
Call = Callable[[Route, Timeouts], Awaitable[T]]
# Called with a result that lost a hedge race and will not be used (an open stream to close).
Discard = Callable[[T], None]


class Outcome(msgspec.Struct, Generic[T]):
    value: T
    route: Route
    attempts: int


def _cause(exc: GatewayError) -> str | None:
    """What a failure says about the target: None when it says nothing (the client's own mistake)."""
    if not exc.cools:
        return None
    if exc.quota or exc.elsewhere:
        # Neither an exhausted quota nor refused credentials come back within a retry: keep everyone off.
        return "quota"
    if getattr(exc, "upstream_status", None) == 429:
        return "429"
    if exc.retryable:
        return "error"
    return None


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

    async def run(
        self,
        plan: Plan,
        call: Call[T],
        *,
        deadline_s: float | None = None,
        discard: Discard[T] | None = None,
    ) -> Outcome[T]:
        policy = plan.policy
        t = policy.timeouts
        total = t.total_ms / 1000 if deadline_s is None else min(t.total_ms / 1000, deadline_s)
        deadline = self.clock() + total
        states = await self.health.snapshot(plan.keys)
        selector = Selector(plan, states, self.health, probe_ttl_ms=t.first_byte_ms)
        try:
            current = await selector.first()
        except GatewayError as exc:
            raise exc.evolve(attempts=0) from None  # every target is cooling: no upstream call was made
        attempts = 0
        r = policy.retries
        budget_s = r.budget_ms / 1000

        def same_target(route: Route) -> int:
            return policy.same_target if policy.same_target is not None else route.same_target

        same_left = 0  # same-target retries left for `current`, counted once a failure needs them
        # Set when the loop ended because the next wait did not fit the budget: the client may still wait.
        out_of_budget = False

        async def retry(rs: RetryCallState) -> bool:
            exc = rs.outcome.exception() if rs.outcome is not None else None
            if not isinstance(exc, GatewayError):
                return False
            if exc.context_window:
                return selector.switch_to_context_fallbacks()
            if exc.elsewhere:
                return selector.has_untried()
            return exc.retryable

        async def wait(rs: RetryCallState) -> float:
            nonlocal current, same_left
            exc = rs.outcome.exception() if rs.outcome is not None else None
            if attempts >= r.attempts:
                return 0.0  # stop() ends here: do not pick (and take the probe slot of) a target never called
            hint = exc.retry_after if isinstance(exc, GatewayError) else None
            drawn: list[float] = []

            def pause() -> float:
                # The backoff is drawn once, and only for a wait taken: a move to a fresh target draws nothing.
                if hint is not None:
                    return hint
                if not drawn:
                    drawn.append(float(backoff(rs)))
                return drawn[0]

            if (
                same_left > 0
                and isinstance(exc, GatewayError)
                and exc.same_target
                and not exc.elsewhere
                and self.clock() - started + pause() < budget_s
                and self.clock() + pause() < deadline  # a retry that could not start is no retry
            ):
                same_left -= 1
                return pause()
            current, fresh = await selector.next()
            if fresh:
                same_left = same_target(current)
                return 0.0
            return pause()

        def remaining() -> Timeouts:
            left = deadline - self.clock()
            if left <= 0:
                raise UpstreamTimeoutError(
                    f"The request's deadline of {total:g} s passed",
                    code="deadline_exceeded",
                    retryable=False,
                    cause="deadline_exceeded",
                )
            base = Timeouts(t.connect_ms / 1000, t.first_byte_ms / 1000, t.total_ms / 1000)
            return base.capped(left)

        started = self.clock()

        def hedge_sent() -> None:
            nonlocal attempts
            attempts += 1

        def stop(rs: RetryCallState) -> bool:
            # Attempts are upstream calls, hedges included (tenacity's attempt number does not see hedges).
            # The budget is tenacity's stop_before_delay, but on the injected clock (its own ignores `sleep`).
            nonlocal out_of_budget
            if attempts >= r.attempts:
                return True
            out_of_budget = self.clock() - started + rs.upcoming_sleep >= budget_s
            return out_of_budget

        # The common case costs no tenacity machinery: the first attempt runs directly, and only a
        # failure enters the loop, which replays it as its own first outcome and decides what follows.
        replay: GatewayError | None = None
        if policy.hedge_after_ms is None:
            limits = remaining()
            attempts = 1
            try:
                value = await self._attempt(plan, states, current, call, limits)
                return Outcome(value=value, route=current, attempts=1)
            except GatewayError as exc:
                replay = exc
        same_left = same_target(current)
        backoff = wait_random_exponential(multiplier=r.initial_backoff_ms / 1000, max=r.max_backoff_ms / 1000)
        retrying = AsyncRetrying(
            stop=stop,
            wait=cast(Any, wait),  # tenacity awaits async waits; its stubs only declare sync ones
            retry=retry,
            sleep=self.sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    if replay is not None:
                        failed, replay = replay, None
                        raise failed
                    limits = remaining()  # past the deadline no call is made, and none is counted
                    attempts += 1
                    if policy.hedge_after_ms is not None and attempts < r.attempts:
                        value, route = await self._hedged(
                            plan, selector, current, call, remaining, policy.hedge_after_ms / 1000, discard, hedge_sent
                        )
                    else:
                        route = current
                        value = await self._attempt(plan, states, current, call, limits)
                    return Outcome(value=value, route=route, attempts=attempts)
        except GatewayError as exc:
            # The gateway spent its retries, or the failure is not one retrying helps: a client's retry
            # would only repeat them. Left to the client: a wait the budget could not hold, and every
            # retry where the operator had the gateway make none (`attempts: 1`).
            later = exc.retryable and (out_of_budget or r.attempts == 1)
            raise exc.evolve(attempts=attempts, retry_later=later) from None
        raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover

    async def _attempt(
        self, plan: Plan, states: dict[str, TargetState], route: Route, call: Call[T], timeouts: Timeouts
    ) -> T:
        track = plan.tracks_inflight
        if track:
            await self.health.inflight(route.key, +1)
        started = self.clock()
        span = tracing.attempt(route)  # one span per upstream call, hedges included; None when not traced
        try:
            value = await call(route, timeouts)
            if span is not None:
                span.succeeded(value)
        except GatewayError as exc:
            cause = _cause(exc)
            if cause is not None:
                await self.health.failure(route.key, exc.retry_after, cause)
                # Should this request retry the target and succeed, that success is its probe: it clears.
                failed = states.get(route.key) or TargetState()
                states[route.key] = msgspec.structs.replace(failed, failures=failed.failures + 1)
            if exc.target is None:  # made where the target was not known (an adapter's status mapping)
                raise exc.evolve(target=route.key, provider=route.provider) from None
            raise
        finally:
            if span is not None:
                span.close(sys.exc_info()[1])  # the exception on its way out, if any
            if track:
                await self.health.inflight(route.key, -1)
        await self.health.success(route.key, states.get(route.key))
        if plan.tracks_latency:
            await self.health.latency(route.key, (self.clock() - started) * 1000)
        return value

    async def _hedged(
        self,
        plan: Plan,
        selector: Selector,
        first: Route,
        call: Call[T],
        remaining: Callable[[], Timeouts],
        after_s: float,
        discard: Discard[T] | None,
        hedge_sent: Callable[[], None],
    ) -> tuple[T, Route]:
        """Start a second target if the first has not answered within `after_s`; first answer wins."""
        states = selector.states
        primary = asyncio.ensure_future(self._attempt(plan, states, first, call, remaining()))
        try:
            done, _ = await asyncio.wait({primary}, timeout=after_s)
            if done:
                return primary.result(), first
            second, fresh = await selector.next()
            if not fresh:
                return await primary, first
        except BaseException:
            primary.cancel()  # the request itself was cancelled (client gone): let go of the upstream
            raise
        hedge_sent()
        backup = asyncio.ensure_future(self._attempt(plan, states, second, call, remaining()))
        routes = {primary: first, backup: second}
        pending = {primary, backup}
        error: BaseException | None = None
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task.exception() is None:
                        winner = task
                        for other in pending:
                            other.cancel()
                        for other in done - {winner}:
                            if other.exception() is None and discard is not None:
                                discard(other.result())
                        return winner.result(), routes[winner]
                    error = error or task.exception()
        finally:
            for task in pending:
                task.cancel()
        assert error is not None
        raise error
