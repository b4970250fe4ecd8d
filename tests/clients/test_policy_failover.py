"""The failover benchmark's scenarios against the real gateway over sockets: which target answers.

A `500` once, or a `429` with a short `Retry-After`, is retried on the target that was asked for
(`retries.same_target: 1`, the default) so the answer comes from that model; a `429` whose wait is past
the budget, a timeout and a target that cannot be reached fail over to the fallback at once; and
`same_target: 0` restores immediate failover. The order of upstream calls is read from the scripted
upstreams' shared journal (tests/helpers/faults.py), whose good answers are the recorded OpenAI ones.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.helpers.faults import RECORDED_COMPLETION, Behaviour, FaultServer, hang, rate_limited, reset, server_error
from tests.helpers.servers import GatewayThread, free_port, serve_config

RETRIES = "retries: {{attempts: 3, initial_backoff_ms: 10, max_backoff_ms: 50, budget_ms: 1000{same}}}"


def config(faults: FaultServer, closed_port: int) -> str:
    def alias(name: str, first: str, extra: str = "") -> str:
        return (
            f"  - name: {name}\n    targets: [{{model: {first}/davinci-002}}]\n"
            f"    fallbacks: [fallback/davinci-002]\n{extra}"
        )

    return (
        f"""
server: {{host: 127.0.0.1, port: 0}}
logging: {{requests: false}}
timeouts: {{connect_ms: 1000, first_byte_ms: 300, total_ms: 10000}}
cooldown: {{base_ms: 50, max_ms: 2000, min_requests: 1}}
providers:
  asked: {{kind: openai, api_key: sk-asked, base_url: {faults["asked"].base_url}}}
  fallback: {{kind: openai, api_key: sk-fallback, base_url: {faults["fallback"].base_url}}}
  down: {{kind: openai, api_key: sk-down, base_url: "http://127.0.0.1:{closed_port}/v1"}}
models:
"""
        # The default policy (same_target unset: 1), and the old one.
        + alias("smart", "asked", "    " + RETRIES.format(same="") + "\n")
        + alias("eager", "asked", "    " + RETRIES.format(same=", same_target: 0") + "\n")
        + alias("unreachable", "down", "    " + RETRIES.format(same="") + "\n")
    )


@pytest.fixture(scope="module")
def faults() -> Iterator[FaultServer]:
    with FaultServer() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(faults: FaultServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("policy-failover"), config(faults, free_port())) as gw:
        yield gw


@pytest.fixture(autouse=True)
def fresh(faults: FaultServer, gateway: GatewayThread) -> None:
    faults.forget()
    gateway.pipeline.health.reset()


@pytest.fixture
def client(gateway: GatewayThread) -> Iterator[openai.OpenAI]:
    """The official SDK without its own retries: every retry here is the gateway's."""
    sdk = openai.OpenAI(
        base_url=f"{gateway.url}/v1",
        api_key="sk-anything",
        max_retries=0,
        timeout=15,
        http_client=openai.DefaultHttpxClient(trust_env=False),
    )
    try:
        yield sdk
    finally:
        sdk.close()


def ask(client: openai.OpenAI, model: str) -> tuple[str, str, float]:
    """(the serving target, the answer's text, seconds taken) for one completion through the SDK."""
    start = time.monotonic()
    raw = client.completions.with_raw_response.create(model=model, prompt="Tell me a joke", max_tokens=16)
    took = time.monotonic() - start
    return raw.headers["x-gateway-model"], raw.parse().choices[0].text, took


RECORDED_TEXT = RECORDED_COMPLETION["choices"][0]["text"]


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(server_error(), id="500-once"),
        pytest.param(reset(), id="connection-dropped-once"),
    ],
)
def test_a_transient_failure_is_answered_by_the_model_asked_for(
    faults: FaultServer, client: openai.OpenAI, fault: Behaviour
) -> None:
    faults["asked"].script(fault)
    served, text, _ = ask(client, "smart")
    assert faults.order() == ["asked", "asked"]
    assert served == "asked/davinci-002" and text == RECORDED_TEXT


def test_a_429_with_a_short_retry_after_waits_for_the_model_asked_for(
    faults: FaultServer, client: openai.OpenAI
) -> None:
    faults["asked"].script(rate_limited(retry_after="0.2"))
    served, text, took = ask(client, "smart")
    assert faults.order() == ["asked", "asked"]
    assert served == "asked/davinci-002" and text == RECORDED_TEXT
    gap = faults["asked"].hits[1].at - faults["asked"].hits[0].at
    assert 0.19 <= gap < 1.0 and took >= 0.19


def test_a_429_with_a_retry_after_past_the_budget_fails_over_at_once(
    faults: FaultServer, client: openai.OpenAI
) -> None:
    faults["asked"].script(rate_limited(retry_after="5"))
    served, text, took = ask(client, "smart")
    assert faults.order() == ["asked", "fallback"]
    assert served == "fallback/davinci-002" and text == RECORDED_TEXT
    assert took < 1.0


def test_a_timeout_fails_over_at_once(faults: FaultServer, client: openai.OpenAI) -> None:
    faults["asked"].script(hang())
    served, _, took = ask(client, "smart")
    assert faults.order() == ["asked", "fallback"]
    assert served == "fallback/davinci-002"
    assert took < 1.0  # one first-byte timeout (0.3 s), no second try of the silent target


def test_a_target_that_cannot_be_reached_fails_over_at_once(faults: FaultServer, client: openai.OpenAI) -> None:
    raw = client.completions.with_raw_response.create(model="unreachable", prompt="Tell me a joke", max_tokens=16)
    assert faults.order() == ["fallback"]
    assert raw.headers["x-gateway-model"] == "fallback/davinci-002"
    # One refused connection, then the fallback: the silent target was not tried a second time.
    assert raw.headers["x-gateway-attempts"] == "2"


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(server_error(), id="500-once"),
        pytest.param(rate_limited(retry_after="0.2"), id="429-short-retry-after"),
    ],
)
def test_same_target_0_fails_over_at_once(faults: FaultServer, client: openai.OpenAI, fault: Behaviour) -> None:
    faults["asked"].script(fault)
    served, _, _ = ask(client, "eager")
    assert faults.order() == ["asked", "fallback"]
    assert served == "fallback/davinci-002"


def test_a_target_failing_twice_goes_to_the_fallback(faults: FaultServer, gateway: GatewayThread) -> None:
    faults["asked"].script(server_error(), server_error())
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as http:
        resp = http.post("/v1/completions", json={"model": "smart", "prompt": "x", "max_tokens": 16})
    assert resp.status_code == 200
    assert faults.order() == ["asked", "asked", "fallback"]
    assert resp.headers["x-gateway-model"] == "fallback/davinci-002"
    assert resp.headers["x-gateway-attempts"] == "3"
