"""What the client is told after the same-target retry policy: every error answer says `x-should-retry`
(docs/resilience.md, "Same target first"). Real Pipeline, scripted loopback upstreams, virtual time.
"""

from __future__ import annotations

import time

import pytest

from gateway.config import ConfigError, parse_config
from gateway.edge.render import error_headers
from tests.helpers.faults import (
    Behaviour,
    FaultServer,
    quota_exhausted,
    rate_limited,
    respond,
    server_error,
    unavailable,
)
from tests.helpers.pipelines import VirtualTime, ask, key
from tests.resilience.same_target_setup import ONLY_A, ORDERED_AB, VLLM_404, providers, top
from wire.errors import client_retry

from .conftest import MakePipeline

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
