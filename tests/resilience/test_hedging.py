"""Hedged requests (docs/resilience.md, "Hedging"): a second target after `hedge_after_ms`, first answer wins."""

from __future__ import annotations

import asyncio
import time

from tests.helpers.faults import FaultServer, hang, slow, stream, unavailable
from tests.helpers.pipelines import VirtualTime, ask, key, same_but_id
from tests.helpers.waiting import wait_for

from .conftest import MakePipeline, Reference

HEDGED = """
  - name: smart
    strategy: ordered
    hedge_after_ms: 150
    targets: [{model: alpha/davinci-002}, {model: beta/davinci-002}]
"""
TOP = "retries: {attempts: 3}\ntimeouts: {connect_ms: 1000, first_byte_ms: 5000, total_ms: 8000}\n"
# Timeouts a hanging target runs into within the test: its first byte is awaited 400 ms.
FIRST_BYTE_400 = "timeouts: {connect_ms: 1000, first_byte_ms: 400, total_ms: 8000}\n"


async def test_a_slow_first_target_is_hedged_and_cancelled(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, reference: Reference
) -> None:
    faults["alpha"].script(slow(3.0))
    p = make(HEDGED, top=TOP)
    start = time.monotonic()
    answer = await ask(p)
    took = time.monotonic() - start
    assert faults.order() == ["alpha", "beta"]
    # The hedge went out after hedge_after_ms, not at once and not after a wait of the retry loop. The
    # timer starts before alpha's request is on the wire, so the lower bound is taken from the client's
    # start, which precedes it: a loaded machine that delays alpha's arrival cannot break it.
    hedged_at = faults["beta"].hits[0].at - start
    assert 0.15 <= hedged_at < 0.75
    assert faults["alpha"].hits[0].at < faults["beta"].hits[0].at
    assert hedged_at <= took < 1.0
    assert vtime.sleeps == []
    assert answer.headers == {
        "x-gateway-provider": "beta",
        "x-gateway-model": key("beta"),
        "x-gateway-attempts": "2",  # a hedge counts as an attempt
    }
    assert same_but_id(answer.body)[0] == same_but_id(reference.plain.body)[0]
    # The loser's connection was closed: the upstream saw the gateway hang up.
    assert await wait_for(faults["alpha"].hits[0].disconnected, 2.0)
    assert not faults["beta"].hits[0].disconnected.is_set()
    # A hedge loss says nothing bad about alpha: it is not cooled.
    state = (await p.health.snapshot([key("alpha")]))[key("alpha")]
    assert (state.cooling_ms, state.failures) == (0, 0)


async def test_a_slow_first_event_is_hedged_for_streams(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, reference: Reference
) -> None:
    faults["alpha"].script(stream(first_delay=3.0))  # headers at once, no event
    p = make(HEDGED, top=TOP)
    answer = await ask(p, stream=True)
    assert faults.order() == ["alpha", "beta"]
    assert answer.headers["x-gateway-model"] == key("beta")
    assert answer.headers["x-gateway-attempts"] == "2"
    assert same_but_id(answer.body)[0] == same_but_id(reference.stream.body)[0]
    assert await wait_for(faults["alpha"].hits[0].disconnected, 2.0)


async def test_a_fast_first_target_is_not_hedged(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, reference: Reference
) -> None:
    faults["alpha"].script(slow(0.05))
    p = make(HEDGED, top=TOP)
    answer = await ask(p)
    streamed = await ask(p, stream=True)
    assert faults.order() == ["alpha", "alpha"]
    assert answer.headers["x-gateway-attempts"] == streamed.headers["x-gateway-attempts"] == "1"
    assert answer.served_by == streamed.served_by == key("alpha")
    assert same_but_id(answer.body)[0] == same_but_id(reference.plain.body)[0]


async def test_when_both_are_slow_the_first_answer_wins(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(slow(0.4))
    faults["beta"].script(slow(1.5))
    p = make(HEDGED, top=TOP)
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta"]
    assert answer.served_by == key("alpha") and answer.attempts == 2
    assert await wait_for(faults["beta"].hits[0].disconnected, 2.0)


async def test_a_fast_failure_fails_over_without_a_hedge(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(unavailable())
    p = make(HEDGED, top=TOP.replace("attempts: 3", "attempts: 3, same_target: 0"))
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta"]
    assert vtime.sleeps == [0.0]
    assert answer.served_by == key("beta") and answer.attempts == 2


async def test_a_fast_failure_is_retried_on_the_same_target_without_a_hedge(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    # The default same_target: 1. The retry is hedged in turn, but answers before hedge_after_ms.
    faults["alpha"].script(unavailable())
    p = make(HEDGED, top=TOP)
    answer = await ask(p)
    assert faults.order() == ["alpha", "alpha"]
    assert len(vtime.sleeps) == 1 and 0 <= vtime.sleeps[0] <= 0.25
    assert answer.served_by == key("alpha") and answer.attempts == 2


async def test_a_hedge_that_fails_leaves_the_first_target_to_answer(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(slow(0.4))
    faults["beta"].script(unavailable())
    p = make(HEDGED, top=TOP)
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta"]
    assert answer.served_by == key("alpha") and answer.attempts == 2
    assert not faults["alpha"].hits[0].disconnected.is_set()


async def test_hanging_targets_are_bounded_by_first_byte_ms(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(hang())
    faults["beta"].script(hang())
    top = "retries: {attempts: 2}\n" + FIRST_BYTE_400
    p = make(HEDGED, top=top)
    start = time.monotonic()
    answer = await ask(p)
    took = time.monotonic() - start
    assert faults.order() == ["alpha", "beta"]
    assert answer.error is not None and answer.error.status == 504 and answer.attempts == 2
    assert 0.4 <= took < 1.2


async def test_no_hedge_without_an_attempt_left(make: MakePipeline, faults: FaultServer, vtime: VirtualTime) -> None:
    faults["alpha"].script(slow(0.4))
    p = make(HEDGED, top=TOP.replace("attempts: 3", "attempts: 1"))
    answer = await ask(p)
    assert faults.order() == ["alpha"]  # a hedge is an attempt, and the one allowed was alpha
    assert answer.served_by == key("alpha") and answer.attempts == 1


async def test_a_deadline_that_passes_before_the_hedge_lets_go_of_the_first_target(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    # The request's deadline passes (on the injected clock) while alpha is still silent: no hedge may start,
    # and alpha's call, which nobody will read any more, is cancelled rather than left running.
    faults["alpha"].script(slow(3.0))
    p = make(HEDGED, top=TOP)

    async def time_runs_out() -> None:
        await asyncio.sleep(0.05)
        vtime.advance(60.0)

    clock = asyncio.ensure_future(time_runs_out())
    answer = await ask(p)
    await clock
    assert faults.order() == ["alpha"]
    assert answer.error is not None and answer.error.code == "deadline_exceeded"
    assert answer.attempts == 1  # the hedge was never sent
    assert await wait_for(faults["alpha"].hits[0].disconnected, 1.0)


async def test_when_both_fail_the_same_target_retry_goes_back_to_the_target_that_failed_first(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    # The first of the two failures decides what comes next; a same-target retry goes back to its target. Here
    # beta's 503 (transient: retried on the same target) comes first, and alpha's timeout (never retried on
    # the same target) after: the retry goes to beta, not back to the target that timed out.
    faults["alpha"].script(hang())
    faults["beta"].script(unavailable())
    top = "retries: {attempts: 3}\n" + FIRST_BYTE_400
    p = make(HEDGED, top=top)
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta", "beta"]
    assert answer.served_by == key("beta") and answer.attempts == 3
    assert len(vtime.sleeps) == 1  # beta's backoff

    # Reversed: alpha's 503 comes first, then the hedge to beta times out. alpha is retried.
    faults.forget()
    faults["alpha"].script(slow(0.25, then=unavailable()))
    faults["beta"].script(hang())
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta", "alpha"]
    assert answer.served_by == key("alpha") and answer.attempts == 3
