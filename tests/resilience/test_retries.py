"""What is retried, where, and after which wait (docs/resilience.md, "What is retried" and "Waits").

Each test runs the real Pipeline against scripted loopback upstreams; only time is injected, so every
wait the failover loop asks for is asserted exactly, and nothing here waits on the wall clock.
"""

from __future__ import annotations

import random

import pytest

from tests.helpers.faults import (
    OVERLOADED_BODY,
    RECORDED_COMPLETION,
    SERVER_ERROR_BODY,
    Behaviour,
    FaultServer,
    bad_request,
    context_too_long,
    quota_exhausted,
    rate_limited,
    reset,
    respond,
    server_error,
    unavailable,
)
from tests.helpers.pipelines import VirtualTime, ask, key, same_but_id

from .conftest import SEED, MakePipeline, Reference

ORDERED_AB = """
  - name: smart
    strategy: ordered
    targets: [{model: alpha/davinci-002}, {model: beta/davinci-002}]
"""
ONLY_A = """
  - name: smart
    targets: [{model: alpha/davinci-002}]
"""


def retries(
    attempts: int,
    *,
    initial_ms: int = 250,
    max_ms: int = 8000,
    budget_ms: int = 30000,
    same_target: int | None = None,
    cooling_max_ms: int = 60000,
) -> str:
    same = "" if same_target is None else f", same_target: {same_target}"
    return (
        f"retries: {{attempts: {attempts}, initial_backoff_ms: {initial_ms}, max_backoff_ms: {max_ms}, "
        f"budget_ms: {budget_ms}{same}}}\ncooldown: {{base_ms: 1000, max_ms: {cooling_max_ms}, min_requests: 1}}\n"
    )


# Immediate failover on every failure: what the gateway did before `retries.same_target` (default 1).
FAIL_OVER_AT_ONCE = 0


def assert_same_answer(got: bytes, want: bytes) -> None:
    """Byte for byte what one good upstream produced, but for the gateway's per-request id."""
    got_norm, got_ids = same_but_id(got)
    want_norm, want_ids = same_but_id(want)
    assert got_norm == want_norm
    assert len(got_ids) == 1 and got_ids != want_ids


# --------------------------------------------------------------------------------------------------
# Retry-After and backoff on the same target


@pytest.mark.parametrize(
    ("fault", "wait"),
    [
        pytest.param(rate_limited(retry_after="2"), 2.0, id="retry-after-seconds"),
        pytest.param(rate_limited(retry_after_ms="150"), 0.15, id="retry-after-ms"),
        pytest.param(rate_limited(retry_after="9", retry_after_ms="150"), 0.15, id="retry-after-ms-wins"),
        pytest.param(unavailable(retry_after="3"), 3.0, id="503-retry-after"),
    ],
)
async def test_same_target_retry_waits_what_the_upstream_said(
    make: MakePipeline,
    faults: FaultServer,
    vtime: VirtualTime,
    reference: Reference,
    fault: Behaviour,
    wait: float,
) -> None:
    faults["alpha"].script(fault)
    p = make(ONLY_A, top=retries(3))
    answer = await ask(p)
    assert faults.order() == ["alpha", "alpha"]
    assert vtime.sleeps == [wait]
    assert answer.headers == {
        "x-gateway-provider": "alpha",
        "x-gateway-model": key("alpha"),
        "x-gateway-attempts": "2",
    }
    assert_same_answer(answer.body, reference.plain.body)
    # Both upstream calls were the same request.
    assert faults["alpha"].hits[0].body == faults["alpha"].hits[1].body


async def test_503_burst_backs_off_with_full_jitter(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, reference: Reference
) -> None:
    faults["alpha"].script(unavailable(), server_error(), unavailable())
    p = make(ONLY_A, top=retries(4))
    answer = await ask(p)
    assert faults["alpha"].count == 4
    assert answer.served_by == key("alpha") and answer.attempts == 4
    assert_same_answer(answer.body, reference.plain.body)
    # uniform(0, min(max_backoff, initial * 2^n)) for n = 0, 1, 2, drawn from the seeded `random`.
    rng = random.Random(SEED)
    assert vtime.sleeps == [rng.uniform(0, 0.25), rng.uniform(0, 0.5), rng.uniform(0, 1.0)]
    assert all(0 <= s <= hi for s, hi in zip(vtime.sleeps, [0.25, 0.5, 1.0], strict=True))


async def test_backoff_is_capped_by_max_backoff(make: MakePipeline, faults: FaultServer, vtime: VirtualTime) -> None:
    faults["alpha"].script(*[server_error()] * 4)
    p = make(ONLY_A, top=retries(5, initial_ms=1000, max_ms=1500))
    answer = await ask(p)
    assert faults["alpha"].count == 5 and answer.attempts == 5
    rng = random.Random(SEED)
    highs = [1.0, 1.5, 1.5, 1.5]  # 1, 2, 4, 8 s capped at 1.5 s
    assert vtime.sleeps == [rng.uniform(0, hi) for hi in highs]


async def test_attempts_exhausted_returns_the_last_error(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(server_error(), server_error(), unavailable(retry_after="7"), unavailable())
    p = make(ONLY_A, top=retries(3))
    answer = await ask(p)
    assert faults["alpha"].count == 3
    assert answer.error is not None
    assert answer.attempts == 3
    assert answer.error.status == 502
    assert answer.error.retry_after == 7.0
    assert answer.error_body() == {
        "error": {
            "message": "alpha error (503): The server is overloaded or not ready yet.",
            "type": "upstream_error",
            "param": None,
            "code": "server_error",  # the adapter reports the upstream's type when it sent no code
        }
    }
    rng = random.Random(SEED)
    assert vtime.sleeps == [rng.uniform(0, 0.25), rng.uniform(0, 0.5)]


async def test_connection_reset_is_retried(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, reference: Reference
) -> None:
    faults["alpha"].script(reset(), reset())
    p = make(ONLY_A, top=retries(3))
    answer = await ask(p)
    assert faults["alpha"].count == 3 and answer.attempts == 3
    assert_same_answer(answer.body, reference.plain.body)
    rng = random.Random(SEED)
    assert vtime.sleeps == [rng.uniform(0, 0.25), rng.uniform(0, 0.5)]


# --------------------------------------------------------------------------------------------------
# Failover across targets and fallbacks


async def test_failover_to_a_fresh_target_does_not_wait(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, reference: Reference
) -> None:
    faults["alpha"].script(unavailable(retry_after="5"))
    p = make(ORDERED_AB, top=retries(3, same_target=FAIL_OVER_AT_ONCE))
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta"]
    assert vtime.sleeps == [0.0]  # beta was never tried: no Retry-After, no backoff
    assert answer.headers == {
        "x-gateway-provider": "beta",
        "x-gateway-model": key("beta"),
        "x-gateway-attempts": "2",
    }
    assert_same_answer(answer.body, reference.plain.body)
    # beta got the very request alpha got (its own model name and key aside: same provider kind here).
    assert faults["beta"].hits[0].json() == faults["alpha"].hits[0].json()
    assert faults["alpha"].hits[0].headers["authorization"] == "Bearer sk-alpha"
    assert faults["beta"].hits[0].headers["authorization"] == "Bearer sk-beta"


async def test_every_target_failed_the_last_one_is_retried_after_its_wait(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(unavailable())
    faults["beta"].script(rate_limited(retry_after="1"))
    p = make(ORDERED_AB, top=retries(3, same_target=FAIL_OVER_AT_ONCE))
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta", "beta"]
    assert vtime.sleeps == [0.0, 1.0]
    assert answer.served_by == key("beta") and answer.attempts == 3


FALLBACKS = """
  - name: backup
    targets: [{model: gamma/davinci-002}]
  - name: smart
    strategy: ordered
    targets: [{model: alpha/davinci-002}, {model: beta/davinci-002}]
    fallbacks: [backup, delta/davinci-002]
"""


async def test_fallbacks_follow_the_targets_in_order(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, reference: Reference
) -> None:
    faults["alpha"].script(unavailable())
    faults["beta"].script(reset())
    faults["gamma"].script(server_error())
    p = make(FALLBACKS, top=retries(4, same_target=FAIL_OVER_AT_ONCE))
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta", "gamma", "delta"]
    assert vtime.sleeps == [0.0, 0.0, 0.0]
    assert answer.headers == {
        "x-gateway-provider": "delta",
        "x-gateway-model": key("delta"),
        "x-gateway-attempts": "4",
    }
    assert_same_answer(answer.body, reference.plain.body)


async def test_attempts_count_across_targets_and_fallbacks(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(unavailable())
    faults["beta"].script(reset())
    faults["gamma"].script(server_error())
    p = make(FALLBACKS, top=retries(3, same_target=FAIL_OVER_AT_ONCE))
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta", "gamma"]  # delta is a fallback too, but attempts ran out
    assert answer.error is not None and answer.attempts == 3
    assert answer.error_body()["error"]["message"] == (
        "gamma error (500): The server had an error while processing your request."
    )


# --------------------------------------------------------------------------------------------------
# What is not retried


async def test_client_error_is_not_retried_nor_cooled(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(bad_request())
    p = make(ORDERED_AB, top=retries(3))
    answer = await ask(p)
    assert faults.order() == ["alpha"]
    assert vtime.sleeps == []
    assert answer.error is not None and answer.attempts == 1
    assert answer.error.status == 400
    assert answer.error_body() == {
        "error": {
            "message": "alpha error (400): The requested model 'gpt-5.2-proo' does not exist.",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    state = (await p.health.snapshot([key("alpha")]))[key("alpha")]
    assert (state.cooling_ms, state.failures) == (0, 0)
    # The next request goes to alpha again.
    await ask(p)
    assert faults.order() == ["alpha", "alpha"]


async def test_quota_429_moves_on_without_retrying_and_cools_the_target_for_the_longest_time(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    # An exhausted quota never comes back within a retry, but another target may have room: the
    # request moves on at once (no wait), and alpha is cooled for cooldown.max_ms for everyone.
    faults["alpha"].script(quota_exhausted())
    p = make(ORDERED_AB, top=retries(3, cooling_max_ms=45000))
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta"]
    assert vtime.sleeps == [0.0]  # a zero wait: straight on to the next target
    assert answer.error is None and answer.served_by == key("beta") and answer.attempts == 2
    state = (await p.health.snapshot([key("alpha")]))[key("alpha")]
    assert (state.cooling_ms, state.cause) == (45000, "quota")
    # Every later request skips alpha until then.
    vtime.advance(44.9)
    answer = await ask(p)
    assert answer.served_by == key("beta") and answer.attempts == 1
    assert faults.order() == ["alpha", "beta", "beta"]


async def test_quota_429_on_the_only_target_is_not_retried(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(quota_exhausted())
    p = make(ONLY_A, top=retries(3, cooling_max_ms=45000))
    answer = await ask(p)
    assert faults.order() == ["alpha"]
    assert vtime.sleeps == []
    assert answer.error is not None and answer.attempts == 1
    assert answer.error.status == 429
    assert answer.error.retry_after is None
    assert answer.error_body() == {
        "error": {
            "message": "alpha error (429): You exceeded your current quota, please check your plan and billing "
            "details.",
            "type": "rate_limit_error",
            "param": None,
            "code": "insufficient_quota",
        }
    }
    state = (await p.health.snapshot([key("alpha")]))[key("alpha")]
    assert (state.cooling_ms, state.cause) == (45000, "quota")


@pytest.mark.parametrize("status", [503, 500])
async def test_x_should_retry_false_wins_over_a_retryable_status(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, status: int
) -> None:
    faults["alpha"].script(respond(OVERLOADED_BODY, status, {"x-should-retry": "false"}))
    p = make(ORDERED_AB, top=retries(3))
    answer = await ask(p)
    assert faults.order() == ["alpha"]
    assert vtime.sleeps == []
    assert answer.error is not None and answer.attempts == 1 and answer.error.status == 502
    # Not retried, so not cooled ("as retried").
    state = (await p.health.snapshot([key("alpha")]))[key("alpha")]
    assert (state.cooling_ms, state.failures) == (0, 0)


async def test_x_should_retry_true_makes_a_400_retryable(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, reference: Reference
) -> None:
    faults["alpha"].script(bad_request(should_retry="true"))
    p = make(ORDERED_AB, top=retries(3))
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta"]
    assert vtime.sleeps == [0.0]
    assert answer.served_by == key("beta") and answer.attempts == 2
    assert_same_answer(answer.body, reference.plain.body)
    state = (await p.health.snapshot([key("alpha")]))[key("alpha")]
    assert (state.cooling_ms, state.cause, state.failures) == (1000, "error", 1)


# --------------------------------------------------------------------------------------------------
# Context-window errors


CONTEXT = """
  - name: smart
    targets: [{model: alpha/davinci-002}]
    fallbacks: [beta/davinci-002]
    context_window_fallbacks: [gamma/davinci-002]
"""


async def test_context_window_error_goes_only_to_context_window_fallbacks(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, reference: Reference
) -> None:
    faults["alpha"].script(context_too_long())
    p = make(CONTEXT, top=retries(3))
    answer = await ask(p)
    assert faults.order() == ["alpha", "gamma"]  # the ordinary fallback beta would not fit either
    assert vtime.sleeps == [0.0]
    assert answer.served_by == key("gamma") and answer.attempts == 2
    assert_same_answer(answer.body, reference.plain.body)
    state = (await p.health.snapshot([key("alpha")]))[key("alpha")]
    assert (state.cooling_ms, state.failures) == (0, 0)  # the target is fine; the prompt was too long


async def test_context_window_fallbacks_are_not_used_for_other_errors(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(unavailable())
    p = make(CONTEXT, top=retries(3, same_target=FAIL_OVER_AT_ONCE))
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta"]
    assert answer.served_by == key("beta")
    assert faults["gamma"].count == 0


async def test_context_window_error_without_context_fallbacks_is_the_clients(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(context_too_long())
    models = "  - name: smart\n    targets: [{model: alpha/davinci-002}]\n    fallbacks: [beta/davinci-002]\n"
    p = make(models, top=retries(3))
    answer = await ask(p)
    assert faults.order() == ["alpha"]
    assert vtime.sleeps == []
    assert answer.error is not None and answer.attempts == 1 and answer.error.status == 400
    assert answer.error_body()["error"]["code"] == "context_length_exceeded"
    assert answer.error_body()["error"]["param"] == "prompt"


# --------------------------------------------------------------------------------------------------
# The retry budget


async def test_no_retry_starts_when_its_wait_would_pass_the_budget(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(unavailable(retry_after="2"))
    p = make(ONLY_A, top=retries(5, budget_ms=1500))
    answer = await ask(p)
    assert faults.order() == ["alpha"]
    assert vtime.sleeps == []
    assert answer.error is not None and answer.attempts == 1
    # The last error, with the upstream's Retry-After for the client.
    assert (answer.error.status, answer.error.retry_after) == (502, 2.0)
    assert answer.error_body()["error"]["message"] == "alpha error (503): The server is overloaded or not ready yet."


async def test_budget_counts_the_waits_already_spent(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(*[rate_limited(retry_after_ms="400")] * 5)
    p = make(ONLY_A, top=retries(6, budget_ms=1000))
    answer = await ask(p)
    # t=0 fail, wait .4; t=.4 fail, wait .4; t=.8 fail: a third wait would end at 1.2 s > 1 s.
    assert faults["alpha"].count == 3
    assert vtime.sleeps == [0.4, 0.4]
    assert answer.error is not None and answer.attempts == 3
    assert (answer.error.status, answer.error.retry_after) == (429, 0.4)


async def test_a_fresh_target_needs_no_budget(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, reference: Reference
) -> None:
    faults["alpha"].script(unavailable(retry_after="2"))
    p = make(ORDERED_AB, top=retries(5, budget_ms=1500))
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta"]
    assert vtime.sleeps == [0.0]
    assert answer.served_by == key("beta")
    assert RECORDED_COMPLETION["choices"][0]["text"] == answer.json()["choices"][0]["text"]


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504, 529])
async def test_retryable_statuses_fail_over_and_cool(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, status: int
) -> None:
    faults["alpha"].script(respond(SERVER_ERROR_BODY, status))
    p = make(ORDERED_AB, top=retries(3, same_target=FAIL_OVER_AT_ONCE))
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta"]
    assert vtime.sleeps == [0.0]
    assert answer.served_by == key("beta") and answer.attempts == 2
    state = (await p.health.snapshot([key("alpha")]))[key("alpha")]
    assert (state.cooling_ms, state.cause) == (1000, "429" if status == 429 else "error")


@pytest.mark.parametrize("status", [401, 403])
async def test_refused_gateway_credentials_move_on_and_cool_the_target(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, status: int
) -> None:
    # The upstream refused the gateway's own key: retrying that target cannot help, another can.
    faults["alpha"].script(respond(SERVER_ERROR_BODY, status))
    p = make(ORDERED_AB, top=retries(3))
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta"]
    assert vtime.sleeps == [0.0]
    assert answer.served_by == key("beta") and answer.attempts == 2
    state = (await p.health.snapshot([key("alpha")]))[key("alpha")]
    assert (state.cooling_ms, state.cause) == (60000, "quota")


@pytest.mark.parametrize(("status", "client_status"), [(400, 400), (422, 422)])
async def test_other_statuses_are_answered_at_once(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, status: int, client_status: int
) -> None:
    faults["alpha"].script(respond(SERVER_ERROR_BODY, status))
    p = make(ORDERED_AB, top=retries(3))
    answer = await ask(p)
    assert faults.order() == ["alpha"]
    assert vtime.sleeps == []
    assert answer.error is not None and answer.attempts == 1 and answer.error.status == client_status
    state = (await p.health.snapshot([key("alpha")]))[key("alpha")]
    assert (state.cooling_ms, state.failures) == (0, 0)
