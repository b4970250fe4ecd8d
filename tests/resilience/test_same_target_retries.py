"""The same-target retry policy (docs/resilience.md, "Same target first"): a transient failure (5xx, a dropped
connection, a 429 whose wait fits the budget) is retried on the same target `retries.same_target` times
(default 1) before the request moves on. Real Pipeline, scripted loopback upstreams, virtual time.
"""

from __future__ import annotations

import random

import pytest

from tests.helpers.faults import (
    SERVER_ERROR_BODY,
    Behaviour,
    FaultServer,
    rate_limited,
    reset,
    respond,
    server_error,
    unavailable,
)
from tests.helpers.pipelines import VirtualTime, ask, key, same_but_id, state
from tests.resilience.same_target_setup import ORDERED_AB, top

from .conftest import SEED, MakePipeline, Reference


def backoffs(*highs: float) -> list[float]:
    """The full-jitter waits the seeded `random` draws for these caps, in order."""
    rng = random.Random(SEED)
    return [rng.uniform(0, hi) for hi in highs]


# --------------------------------------------------------------------------------------------------
# Same target first

TRANSIENT = [
    pytest.param(respond(SERVER_ERROR_BODY, 500), id="500"),
    pytest.param(respond(SERVER_ERROR_BODY, 502), id="502"),
    pytest.param(unavailable(), id="503"),
    pytest.param(respond(SERVER_ERROR_BODY, 529), id="529"),
    pytest.param(respond(SERVER_ERROR_BODY, 409), id="409"),
    pytest.param(rate_limited(), id="429-without-retry-after"),
    pytest.param(reset(), id="connection-dropped"),
]


@pytest.mark.parametrize("fault", TRANSIENT)
async def test_a_transient_failure_is_retried_on_the_same_target_before_the_fallback(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, reference: Reference, fault: Behaviour
) -> None:
    faults["alpha"].script(fault)
    p = make(ORDERED_AB, top=top())
    answer = await ask(p)
    assert faults.order() == ["alpha", "alpha"]  # the model asked for answered; the fallback was not called
    assert vtime.sleeps == backoffs(0.25)
    assert answer.served_by == key("alpha") and answer.attempts == 2
    assert same_but_id(answer.body)[0] == same_but_id(reference.plain.body)[0]
    # The retry went through the cooldown its own failure started, and its success ended it.
    assert (await state(p, "alpha")).cooling_ms == 0
    assert (await state(p, "alpha")).failures == 0


async def test_a_429_whose_retry_after_fits_the_budget_waits_for_the_same_target(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, reference: Reference
) -> None:
    faults["alpha"].script(rate_limited(retry_after="0.2"))
    p = make(ORDERED_AB, top=top())
    answer = await ask(p)
    assert faults.order() == ["alpha", "alpha"]
    assert vtime.sleeps == [0.2]
    assert answer.served_by == key("alpha")


@pytest.mark.parametrize(
    ("fault", "budget_ms"),
    [
        pytest.param(rate_limited(retry_after="45"), 30000, id="429-retry-after-45s-budget-30s"),
        pytest.param(rate_limited(retry_after_ms="1200"), 1000, id="429-retry-after-1.2s-budget-1s"),
        pytest.param(unavailable(retry_after="40"), 30000, id="503-retry-after-40s-budget-30s"),
    ],
)
async def test_a_wait_beyond_the_budget_moves_on_at_once(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, fault: Behaviour, budget_ms: int
) -> None:
    faults["alpha"].script(fault)
    p = make(ORDERED_AB, top=top(budget_ms=budget_ms))
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta"]
    assert vtime.sleeps == [0.0]
    assert answer.served_by == key("beta")


async def test_the_budget_left_is_what_decides(make: MakePipeline, faults: FaultServer, vtime: VirtualTime) -> None:
    # alpha fails twice (0.5 s waited); beta's 429 asks for 0.6 s, which the 1 s budget no longer holds.
    faults["alpha"].script(rate_limited(retry_after="0.5"), rate_limited(retry_after="0.5"))
    faults["beta"].script(rate_limited(retry_after="0.6"))
    models = """
  - name: smart
    strategy: ordered
    targets: [{model: alpha/davinci-002}]
    fallbacks: [beta/davinci-002, gamma/davinci-002]
"""
    p = make(models, top=top(attempts=5, budget_ms=1000))
    answer = await ask(p)
    assert faults.order() == ["alpha", "alpha", "beta", "gamma"]
    assert vtime.sleeps == [0.5, 0.0, 0.0]
    assert answer.served_by == key("gamma")


async def test_the_same_target_is_retried_same_target_times_then_the_next_one_gets_its_own(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(server_error(), server_error(), server_error())
    faults["beta"].script(server_error())
    p = make(ORDERED_AB, top=top(attempts=6, same_target=2))
    answer = await ask(p)
    assert faults.order() == ["alpha", "alpha", "alpha", "beta", "beta"]
    # The loop's turn number drives the backoff: 0.25, 0.5 on alpha; none to move on; 2.0 on beta.
    rng = random.Random(SEED)
    assert vtime.sleeps == [rng.uniform(0, 0.25), rng.uniform(0, 0.5), 0.0, rng.uniform(0, 2.0)]
    assert answer.served_by == key("beta") and answer.attempts == 5


async def test_a_target_that_keeps_failing_is_cooled_for_everyone_else(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    # The cooldown starts at the first failure; the same-target retry goes through it. Its failure is the
    # same request's: it does not count twice (the cooldown is not doubled by one request's retries).
    faults["alpha"].script(server_error(), server_error())
    p = make(ORDERED_AB, top=top())
    answer = await ask(p)
    assert faults.order() == ["alpha", "alpha", "beta"]
    assert answer.served_by == key("beta") and answer.attempts == 3
    alpha = await state(p, "alpha")
    assert alpha.failures == 1
    assert 0 < alpha.cooling_ms <= 1000
    # The next request skips alpha while it cools.
    again = await ask(p)
    assert again.served_by == key("beta") and again.attempts == 1
    assert faults.order() == ["alpha", "alpha", "beta", "beta"]
