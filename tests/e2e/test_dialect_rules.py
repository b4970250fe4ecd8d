"""Each route's own request rules, as its seed states them, over real HTTP.

PAIS (seed 004) defaults `temperature` to 0 and bounds `max_tokens` and `stop`; SGP (seed 003) bounds
`top_logprobs` to 0..20. The loopback upstream records what each request sent, so both sides are checked.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.helpers.errors import PAIS_ROUTE, SGP_ROUTE, assert_error
from tests.helpers.recordings import fixture_bytes
from tests.helpers.upstreams import Upstream, reply

DAVINCI = "openai/completion_davinci002.json"


def _req(**fields: Any) -> dict[str, Any]:
    return {"model": "openai/davinci-002", "prompt": "Say this is a test", **fields}


# -- PAIS: temperature's default and the schema's bounds --------------------------------------------


def test_pais_sends_temperature_0_when_the_client_sends_none(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes(DAVINCI))
    resp = api.post(PAIS_ROUTE, json=_req(max_tokens=7))
    assert resp.status_code == 200, resp.text
    assert upstream.only().json()["temperature"] == 0
    upstream.received.clear()
    kept = api.post(PAIS_ROUTE, json=_req(max_tokens=7, temperature=0.7))
    assert kept.status_code == 200, kept.text
    assert upstream.only().json()["temperature"] == 0.7
    upstream.received.clear()
    # OpenAI's route leaves it to the upstream's default, as OpenAI does.
    plain = api.post("/v1/completions", json=_req(max_tokens=7))
    assert plain.status_code == 200, plain.text
    assert "temperature" not in upstream.only().json()


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"max_tokens": 0}, "max_tokens", "Invalid value for 'max_tokens': Expected `int` >= 1"),
        ({"stop": []}, "stop", "Invalid value for 'stop': Expected `array` of length >= 1"),
    ],
    ids=["max-tokens-0", "empty-stop-list"],
)
def test_pais_refuses_what_its_schema_bounds(
    api: httpx.Client, upstream: Upstream, fields: dict[str, Any], param: str, message: str
) -> None:
    upstream.handler = reply(fixture_bytes(DAVINCI))
    resp = api.post(PAIS_ROUTE, json=_req(**fields))
    assert_error(
        resp, PAIS_ROUTE, status=400, type="invalid_request_error", param=param, code="invalid_value", message=message
    )
    assert upstream.received == []


# -- SGP: top_logprobs is an integer between 0 and 20 ----------------------------------------------


def test_sgp_refuses_top_logprobs_over_20_as_a_range_error(api: httpx.Client, upstream: Upstream) -> None:
    # vLLM's own bound is its configured `max_logprobs`: the route's bound is SGP's, whatever the provider.
    resp = api.post(SGP_ROUTE, json=_req(model="vllm/facebook/opt-125m", logprobs=True, top_logprobs=21))
    assert_error(
        resp,
        SGP_ROUTE,
        status=400,
        type="invalid_request_error",
        param="top_logprobs",
        code="invalid_value",
        message="Invalid value for 'top_logprobs': Expected `int` <= 20",
    )
    assert upstream.received == []
