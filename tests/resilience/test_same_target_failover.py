"""What moves on at once instead of retrying the same target: timeouts, unreachable targets, exhausted quotas,
a 404 (docs/resilience.md, "Same target first"); `same_target: 0` restores immediate failover. Real Pipeline,
scripted loopback upstreams, virtual time.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import pytest

from gateway.config import parse_config
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
)
from tests.helpers.pipelines import VirtualTime, ask, key, state
from tests.helpers.servers import free_port
from tests.helpers.waiting import wait_for
from tests.resilience.same_target_setup import ONLY_A, ORDERED_AB, VLLM_404, providers, top

from .conftest import MakePipeline, Reference

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
