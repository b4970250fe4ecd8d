"""The same-target retry policy (docs/resilience.md, "Same target first") and what the client is told.

A transient failure (5xx, a dropped connection, a 429 whose wait fits the budget) is retried on the
same target `retries.same_target` times (default 1) before the request moves on; timeouts, unreachable
targets, exhausted quotas and a 404 move on at once; `same_target: 0` restores immediate failover.
Every error answer says `x-should-retry`. Real Pipeline, scripted loopback upstreams, virtual time.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import AsyncIterator, Callable

import pytest

from gateway.config import ConfigError, parse_config
from gateway.edge.render import error_headers
from gateway.path.pipeline import Pipeline
from tests.helpers.faults import (
    SERVER_ERROR_BODY,
    Behaviour,
    FaultServer,
    hang,
    quota_exhausted,
    rate_limited,
    reset,
    respond,
    server_error,
    unavailable,
)
from tests.helpers.pipelines import PROVIDERS, VirtualTime, ask, key, same_but_id, state
from tests.helpers.recordings import fixture_bytes
from tests.helpers.servers import free_port
from tests.helpers.waiting import wait_for
from wire.errors import client_retry

from .conftest import SEED, MakePipeline, Reference

ORDERED_AB = """
  - name: smart
    strategy: ordered
    targets: [{model: alpha/davinci-002}]
    fallbacks: [beta/davinci-002]
"""
ONLY_A = """
  - name: smart
    targets: [{model: alpha/davinci-002}]
"""
# vLLM's answer to a model it does not serve (tests/fixtures/SOURCES.md: built from vLLM's source).
VLLM_404 = fixture_bytes("vllm/error_404_model_not_found.json")


def top(
    attempts: int = 3,
    *,
    budget_ms: int = 30000,
    same_target: int | None = None,
    first_byte_ms: int = 10000,
    total_ms: int = 60000,
) -> str:
    same = "" if same_target is None else f", same_target: {same_target}"
    return (
        f"retries: {{attempts: {attempts}, initial_backoff_ms: 250, max_backoff_ms: 8000, budget_ms: {budget_ms}"
        f"{same}}}\ncooldown: {{base_ms: 1000, max_ms: 60000, min_requests: 1}}\n"
        f"timeouts: {{connect_ms: 1000, first_byte_ms: {first_byte_ms}, total_ms: {total_ms}}}\n"
    )


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


# --------------------------------------------------------------------------------------------------
# Immediate failover


async def test_a_timeout_moves_on_at_once(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, reference: Reference
) -> None:
    faults["alpha"].script(hang())
    p = make(ORDERED_AB, top=top(first_byte_ms=200))
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta"]
    assert vtime.sleeps == [0.0]
    assert answer.served_by == key("beta")
    assert await wait_for(faults["alpha"].hits[0].disconnected, 1.0)


@pytest.mark.parametrize("status", [408, 504])
async def test_an_upstream_timeout_status_moves_on_at_once(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, status: int
) -> None:
    faults["alpha"].script(respond(SERVER_ERROR_BODY, status))
    p = make(ORDERED_AB, top=top())
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta"]
    assert vtime.sleeps == [0.0]
    assert answer.served_by == key("beta")


@pytest.fixture
async def custom(faults: FaultServer, vtime: VirtualTime) -> AsyncIterator[Callable[[str], Pipeline]]:
    """`custom(yaml)`: a Pipeline from a whole config (for per-provider settings), closed after the test."""
    made: list[Pipeline] = []

    def build(text: str) -> Pipeline:
        p = Pipeline(parse_config(text, "same-target.yaml", env={}), sleep=vtime.sleep, clock=vtime.clock)
        made.append(p)
        return p

    yield build
    for p in made:
        await p.close()


def providers(faults: FaultServer, **extra: str) -> str:
    lines = ["providers:"]
    for name in PROVIDERS:
        more = extra.get(name, "")
        lines.append(f"  {name}: {{kind: openai, api_key: sk-{name}, base_url: {faults[name].base_url}{more}}}")
    return "\n".join(lines) + "\n"


async def test_an_unreachable_target_moves_on_at_once(
    custom: Callable[[str], Pipeline], faults: FaultServer, vtime: VirtualTime
) -> None:
    closed = free_port()  # nothing listens there: the connection is refused
    text = (
        top()
        + providers(faults)
        + f"  down: {{kind: openai, api_key: sk-down, base_url: 'http://127.0.0.1:{closed}/v1'}}\n"
        + "models:\n  - name: smart\n    targets: [{model: down/davinci-002}]\n    fallbacks: [beta/davinci-002]\n"
    )
    answer = await ask(custom(text))
    assert faults.order() == ["beta"]
    assert vtime.sleeps == [0.0]
    assert answer.served_by == key("beta") and answer.attempts == 2


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(server_error(), id="500"),
        pytest.param(rate_limited(retry_after="0.2"), id="429-short-retry-after"),
        pytest.param(reset(), id="connection-dropped"),
    ],
)
async def test_same_target_0_restores_immediate_failover(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, fault: Behaviour
) -> None:
    faults["alpha"].script(fault)
    p = make(ORDERED_AB, top=top(same_target=0))
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta"]
    assert vtime.sleeps == [0.0]
    assert answer.served_by == key("beta")


async def test_an_exhausted_quota_moves_on_at_once(make: MakePipeline, faults: FaultServer, vtime: VirtualTime) -> None:
    faults["alpha"].script(quota_exhausted())
    p = make(ORDERED_AB, top=top(same_target=3))
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta"]
    assert vtime.sleeps == [0.0]
    assert answer.served_by == key("beta")


async def test_a_provider_sets_same_target_for_its_targets_and_an_alias_overrides_it(
    custom: Callable[[str], Pipeline], faults: FaultServer, vtime: VirtualTime
) -> None:
    # Global 2; alpha's provider says 0; beta's says nothing (global). The alias `pinned` says 1.
    base = top(attempts=6, same_target=2) + providers(faults, alpha=", retries: {attempts: 6, same_target: 0}")
    models = (
        "models:\n"
        "  - name: smart\n    strategy: ordered\n"
        "    targets: [{model: alpha/davinci-002}, {model: beta/davinci-002}, {model: gamma/davinci-002}]\n"
        "  - name: pinned\n    strategy: ordered\n"
        "    targets: [{model: alpha/davinci-002}, {model: beta/davinci-002}, {model: gamma/davinci-002}]\n"
        "    retries: {attempts: 6, same_target: 1}\n"
    )
    p = custom(base + models)
    faults["alpha"].script(server_error())
    faults["beta"].script(server_error(), server_error(), server_error())
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta", "beta", "beta", "gamma"]
    assert answer.served_by == key("gamma")

    faults.journal.clear()
    vtime.advance(120)  # every cooldown is over
    faults["alpha"].script(server_error(), server_error())
    faults["beta"].script(server_error(), server_error())
    answer = await ask(p, model="pinned")
    assert faults.order() == ["alpha", "alpha", "beta", "beta", "gamma"]
    assert answer.served_by == key("gamma")


# --------------------------------------------------------------------------------------------------
# An upstream that does not serve the model


async def test_a_404_moves_on_to_the_fallback_without_cooling(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(respond(VLLM_404, 404))
    p = make(ORDERED_AB, top=top(same_target=3))
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta"]
    assert vtime.sleeps == [0.0]
    assert answer.served_by == key("beta")
    assert ((await state(p, "alpha")).cooling_ms, (await state(p, "alpha")).failures) == (0, 0)


async def test_a_404_from_the_only_target_is_model_not_found(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(respond(VLLM_404, 404), respond(VLLM_404, 404))
    p = make(ONLY_A, top=top())
    answer = await ask(p)
    assert faults.order() == ["alpha"]
    assert vtime.sleeps == []
    assert answer.error is not None and answer.error.status == 404 and answer.attempts == 1
    upstream = json.loads(VLLM_404)["message"]
    assert answer.error_body() == {
        "error": {
            "message": f"alpha error (404): {upstream}",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    assert error_headers(answer.error) == {
        "x-should-retry": "false",
        "x-gateway-attempts": "1",
        "x-gateway-model": "alpha/davinci-002",
        "x-gateway-provider": "alpha",
    }
    # Not cooled: asking again reaches the upstream again (and is told the same), never "cooling".
    again = await ask(p)
    assert again.error is not None and again.error.status == 404
    assert faults.order() == ["alpha", "alpha"]


# --------------------------------------------------------------------------------------------------
# x-should-retry


async def test_a_final_error_after_the_gateways_retries_says_do_not_retry(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(*[rate_limited(retry_after="0.2")] * 3)
    p = make(ONLY_A, top=top())
    answer = await ask(p)
    assert faults["alpha"].count == 3
    assert answer.error is not None and answer.error.status == 429
    assert not client_retry(answer.error)
    assert error_headers(answer.error) == {
        "x-should-retry": "false",
        "retry-after": "1",
        "retry-after-ms": "200",
        "x-gateway-attempts": "3",
        "x-gateway-model": "alpha/davinci-002",
        "x-gateway-provider": "alpha",
    }


async def test_a_wait_beyond_the_budget_is_left_to_the_client(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(rate_limited(retry_after="45"))
    p = make(ONLY_A, top=top())
    answer = await ask(p)
    assert faults["alpha"].count == 1
    assert answer.error is not None and answer.error.status == 429
    assert error_headers(answer.error) == {
        "x-should-retry": "true",
        "retry-after": "45",
        "retry-after-ms": "45000",
        "x-gateway-attempts": "1",
        "x-gateway-model": "alpha/davinci-002",
        "x-gateway-provider": "alpha",
    }


async def test_a_wait_longer_than_the_sdks_honour_says_do_not_retry(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    # An SDK told to retry would come back after its own short backoff, long before 90 s are over.
    faults["alpha"].script(unavailable(retry_after="90"))
    p = make(ONLY_A, top=top())
    answer = await ask(p)
    assert answer.error is not None and answer.error.retry_after == 90.0
    assert error_headers(answer.error)["x-should-retry"] == "false"


async def test_every_target_cooling_says_retry_after_the_soonest_recovery(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(rate_limited(retry_after="5"), rate_limited(retry_after="5"))
    p = make(ONLY_A, top=top(attempts=2))
    first = await ask(p)
    assert faults["alpha"].count == 2 and vtime.sleeps == [5.0]
    assert first.error is not None and error_headers(first.error)["x-should-retry"] == "false"
    vtime.advance(2)  # alpha cools until 5 s after its second 429: 3 s from now
    second = await ask(p)
    assert faults["alpha"].count == 2
    assert second.error is not None and second.error.code == "all_targets_cooling"
    assert error_headers(second.error) == {
        "x-should-retry": "true",
        "retry-after": "3",
        "retry-after-ms": "3000",
        "x-gateway-attempts": "0",
    }


@pytest.mark.parametrize(
    ("fault", "should_retry"),
    [
        pytest.param(rate_limited(retry_after="5"), "true", id="429"),
        pytest.param(server_error(), "true", id="500"),
        pytest.param(quota_exhausted(), "false", id="quota"),
        pytest.param(respond(VLLM_404, 404), "false", id="404"),
    ],
)
async def test_a_gateway_told_not_to_retry_leaves_retries_to_the_client(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, fault: Behaviour, should_retry: str
) -> None:
    faults["alpha"].script(fault)
    p = make(ONLY_A, top=top(attempts=1))
    answer = await ask(p)
    assert faults["alpha"].count == 1
    assert answer.error is not None
    assert error_headers(answer.error)["x-should-retry"] == should_retry


async def test_a_client_error_says_do_not_retry(make: MakePipeline, faults: FaultServer, vtime: VirtualTime) -> None:
    p = make(ONLY_A, top=top())
    answer = await ask(p, temperature=7)
    assert answer.error is not None and answer.error.status == 400
    assert error_headers(answer.error) == {"x-should-retry": "false"}
    assert faults.order() == []


async def test_a_long_retry_after_that_fits_the_budget_is_still_the_same_target(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    # `budget_ms` is the bound: an operator who would rather fail over sooner lowers it, or same_target.
    faults["alpha"].script(rate_limited(retry_after="20"))
    p = make(ORDERED_AB, top=top())
    start = time.monotonic()
    answer = await ask(p)
    assert time.monotonic() - start < 5  # virtual time: nothing here slept 20 s
    assert vtime.sleeps == [20.0]
    assert answer.served_by == key("alpha")


async def test_a_wait_past_the_requests_deadline_moves_on_at_once(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    # The budget would hold 20 s, the request's total_ms of 15 s would not: a retry that could not start.
    faults["alpha"].script(rate_limited(retry_after="20"))
    p = make(ORDERED_AB, top=top(total_ms=15000))
    answer = await ask(p)
    assert faults.order() == ["alpha", "beta"]
    assert vtime.sleeps == [0.0]
    assert answer.served_by == key("beta")


async def test_the_gateways_own_rate_limit_says_retry_after_its_wait(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    p = make(ONLY_A + "    limits: {rps: 1}\n", top=top())
    assert (await ask(p)).served_by == key("alpha")
    refused = await ask(p)
    assert refused.error is not None and refused.error.code == "rate_limit_exceeded"
    assert refused.error.retry_after is not None and 0 < refused.error.retry_after <= 1
    assert error_headers(refused.error)["x-should-retry"] == "true"
    assert faults.order() == ["alpha"]


@pytest.mark.parametrize(
    ("where", "value"),
    [("retries", "-1"), ("retries", "11"), ("providers.alpha.retries", "x"), ("models[0].retries", "1.5")],
)
def test_a_bad_same_target_fails_at_start_up_naming_its_path(faults: FaultServer, where: str, value: str) -> None:
    text = top() + providers(faults) + "models:\n" + ONLY_A.strip("\n") + "\n"
    if where == "retries":
        text = text.replace("budget_ms: 30000", f"budget_ms: 30000, same_target: {value}")
    elif where == "providers.alpha.retries":
        text = text.replace(
            f"base_url: {faults['alpha'].base_url}",
            f"base_url: {faults['alpha'].base_url}, retries: {{same_target: {value}}}",
        )
    else:
        text += f"    retries: {{same_target: {value}}}\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, "same-target.yaml", env={})
    assert str(info.value).startswith(f"same-target.yaml: {where}.same_target: ")
    assert "\n" not in str(info.value)
