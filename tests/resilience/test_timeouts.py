"""Timeouts (docs/resilience.md, "Timeouts"): first byte, every later read, the whole request.

These tests spend real time (the upstream client's timeouts are real); each stays well under two seconds.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.helpers.faults import FaultServer, hang, slow, stream
from tests.helpers.pipelines import VirtualTime, ask, key, same_but_id
from tests.helpers.waiting import wait_for

from .conftest import MakePipeline, Reference

ONLY_A = """
  - name: smart
    targets: [{model: alpha/davinci-002}]
"""
ORDERED_ABC = """
  - name: smart
    strategy: ordered
    targets: [{model: alpha/davinci-002}, {model: beta/davinci-002}, {model: gamma/davinci-002}]
"""


def top(attempts: int, first_byte_ms: int, total_ms: int = 8000) -> str:
    return (
        f"retries: {{attempts: {attempts}}}\n"
        # No connect phase longer than the call it is part of (refused at load).
        f"timeouts: {{connect_ms: {min(1000, total_ms)}, first_byte_ms: {first_byte_ms}, total_ms: {total_ms}}}\n"
    )


async def test_a_one_target_plan_fails_at_once_on_a_timeout_instead_of_waiting_it_out_again(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    # Nothing else to move on to: a second wait of first_byte_ms on the same hung upstream would only
    # double the client's wait for the same 504 (three attempts of 3 s took 9.2 s).
    faults["alpha"].script(then=hang())
    p = make(ONLY_A, top=top(3, first_byte_ms=200))
    start = time.monotonic()
    answer = await ask(p)
    took = time.monotonic() - start
    assert faults["alpha"].count == 1
    assert answer.error is not None and answer.attempts == 1
    assert answer.error.status == 504
    assert answer.error_body() == {
        "error": {
            "message": "Upstream 'alpha/davinci-002' timed out waiting for its answer (timeouts.first_byte_ms)",
            "type": "timeout_error",
            "param": None,
            "code": "upstream_first_byte_timeout",
        }
    }
    assert vtime.sleeps == []
    assert 0.18 <= took < 0.6  # one first-byte timeout of 0.2 s
    hit = faults["alpha"].hits[0]
    assert await wait_for(hit.disconnected, 1.0)
    assert hit.disconnected_at is not None
    assert 0.18 <= hit.disconnected_at - hit.at < 0.5


async def test_a_timeout_moves_on_at_once_and_is_not_repeated_once_every_target_was_tried(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(then=hang())
    faults["beta"].script(then=hang())
    p = make(ORDERED_ABC.replace(", {model: gamma/davinci-002}", ""), top=top(5, first_byte_ms=200))
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta"]
    assert answer.error is not None and answer.attempts == 2 and answer.error.status == 504
    assert vtime.sleeps == [0.0]


async def test_a_slow_first_byte_within_first_byte_ms_is_not_retried(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, reference: Reference
) -> None:
    faults["alpha"].script(slow(0.15), stream(first_delay=0.15))
    p = make(ORDERED_ABC, top=top(3, first_byte_ms=600))
    plain = await ask(p)
    streamed = await ask(p, stream=True)
    assert faults.order() == ["alpha", "alpha"]
    assert plain.attempts == streamed.attempts == 1
    assert same_but_id(plain.body)[0] == same_but_id(reference.plain.body)[0]
    assert same_but_id(streamed.body)[0] == same_but_id(reference.stream.body)[0]


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "stream"])
async def test_a_first_byte_too_slow_fails_over(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, reference: Reference, streamed: bool
) -> None:
    faults["alpha"].script(slow(1.0) if not streamed else stream(first_delay=1.0))
    p = make(ORDERED_ABC, top=top(3, first_byte_ms=250))
    start = time.monotonic()
    answer = await ask(p, stream=streamed)
    took = time.monotonic() - start
    assert faults.order() == ["alpha", "beta"]
    assert vtime.sleeps == [0.0]
    assert answer.served_by == key("beta") and answer.attempts == 2
    want = reference.stream if streamed else reference.plain
    assert same_but_id(answer.body)[0] == same_but_id(want.body)[0]
    assert 0.25 <= took < 0.9
    assert await wait_for(faults["alpha"].hits[0].disconnected, 1.0)


async def test_total_ms_stops_further_attempts(make: MakePipeline, faults: FaultServer) -> None:
    for name in ("alpha", "beta", "gamma"):
        faults[name].script(then=hang())
    wall = VirtualTime(follow_wall=True)  # the deadline runs on the injected clock: let it follow real time
    p = make(ORDERED_ABC, top=top(5, first_byte_ms=300, total_ms=500), time=wall)
    start = time.monotonic()
    answer = await ask(p)
    took = time.monotonic() - start
    # alpha: first byte timeout at 0.3 s; beta: what was left of 0.5 s; gamma: never called.
    assert faults.order() == ["alpha", "beta"]
    assert answer.error is not None
    assert answer.attempts == 2
    assert (answer.error.status, answer.error.type) == (504, "timeout_error")
    assert 0.45 <= took < 0.9
    beta = faults["beta"].hits[0]
    assert await wait_for(beta.disconnected, 1.0)
    assert beta.disconnected_at is not None
    assert 0.15 <= beta.disconnected_at - beta.at < 0.4
    # No wait to gamma (a fresh target), but by then the deadline had passed: no call, no attempt.
    assert wall.sleeps == [0.0, 0.0]
    assert answer.error_body() == {
        "error": {
            "message": "The request's deadline of 0.5 s passed",
            "type": "timeout_error",
            "param": None,
            "code": "deadline_exceeded",
        }
    }


async def test_inference_timeout_can_only_shorten_the_deadline(make: MakePipeline, faults: FaultServer) -> None:
    faults["alpha"].script(then=hang())
    wall = VirtualTime(follow_wall=True)
    p = make(ONLY_A, top=top(3, first_byte_ms=5000, total_ms=8000), time=wall)
    start = time.monotonic()
    answer = await ask(p, inference_timeout=0.3)
    took = time.monotonic() - start
    assert answer.error is not None and answer.error.status == 504
    assert faults["alpha"].count == 1 and answer.attempts == 1
    assert 0.28 <= took < 0.8


@pytest.mark.parametrize("hedged", [False, True], ids=["plain", "hedged"])
async def test_a_cancelled_request_lets_go_of_its_upstream(
    make: MakePipeline, faults: FaultServer, hedged: bool
) -> None:
    """A client that goes away (the handler's task is cancelled) must not leave an upstream call running."""
    faults["alpha"].script(then=hang())
    models = ONLY_A + ("    hedge_after_ms: 1000\n" if hedged else "")
    p = make(models, top=top(3, first_byte_ms=5000))
    task = asyncio.ensure_future(ask(p))
    while faults["alpha"].count < 1:
        await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_for(faults["alpha"].hits[0].disconnected, 1.0)
