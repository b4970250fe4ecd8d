"""What else a hostile upstream answer could push through: response headers, Retry-After, token counts.

- Upstream response headers never reach the client's response (only the gateway's own, and a
  `retry-after` the gateway computes), so an upstream cannot set cookies or inject CR/LF there.
- An upstream `Retry-After` (seconds or `-ms`) is bounded at one hour (wire/errors.py
  MAX_RETRY_AFTER_S), in what the client is told and in how long the target cools; before the fix a
  `Retry-After: 999999999` was relayed and cooled the target for 31 years.
- Reported token counts feed rate limits, budgets and usage rows: a negative or absurd count is clamped
  (gateway/path/answers.py MAX_REPORTED_TOKENS) and a total below its parts is raised to their sum; so is
  a detail the client is shown (cached, reasoning tokens).
Real sockets: uvicorn serving the gateway, scripted aiohttp upstreams on loopback.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.path.answers import MAX_REPORTED_TOKENS
from gateway.path.attempt import MAX_QUOTA_WAIT_S
from tests.helpers.faults import RATE_LIMIT_BODY, RECORDED_COMPLETION, FaultServer, respond
from tests.helpers.servers import GatewayThread, serve_config
from wire.errors import MAX_RETRY_AFTER_S

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
retries: {{attempts: 1}}
providers:
  alpha: {{kind: openai, api_key: sk-alpha-upstream-key-0001, base_url: "{alpha}"}}
"""


@pytest.fixture
def gateway(faults: FaultServer, tmp_path: Path) -> Iterator[GatewayThread]:
    with serve_config(tmp_path, CONFIG.format(alpha=faults["alpha"].base_url)) as gw:
        yield gw


def post(gw: GatewayThread) -> httpx.Response:
    with httpx.Client(trust_env=False, timeout=15) as client:
        return client.post(gw.url + "/v1/completions", json={"model": "alpha/davinci-002", "prompt": "x"})


@pytest.mark.parametrize("headers", [{"retry-after": "999999999"}, {"retry-after-ms": "99999999999"}])
def test_huge_retry_after_is_bounded_for_the_client_and_the_cooldown(
    gateway: GatewayThread, faults: FaultServer, headers: dict[str, str]
) -> None:
    faults["alpha"].script(respond(RATE_LIMIT_BODY, 429, headers))
    resp = post(gateway)
    assert resp.status_code == 429
    assert int(resp.headers["retry-after"]) <= MAX_RETRY_AFTER_S
    again = post(gateway)  # the target cools, but for at most the bound
    assert again.status_code == 429
    assert int(again.headers["retry-after"]) <= MAX_RETRY_AFTER_S


def test_upstream_response_headers_do_not_reach_the_client(gateway: GatewayThread, faults: FaultServer) -> None:
    evil = {"set-cookie": "session=stolen", "x-evil": "1", "location": "https://evil.example", "x-request-id": "up"}
    faults["alpha"].script(respond(json.dumps(RECORDED_COMPLETION).encode(), 200, evil))
    resp = post(gateway)
    assert resp.status_code == 200
    for name in ("set-cookie", "x-evil", "location"):
        assert name not in resp.headers
    assert resp.headers["x-request-id"] != "up"


@pytest.mark.parametrize(
    ("usage", "want"),
    [
        pytest.param(
            {"prompt_tokens": -1000000, "completion_tokens": 5, "total_tokens": -999995}, (0, 5, 5), id="negative"
        ),
        pytest.param(
            {"prompt_tokens": 2**62, "completion_tokens": 1, "total_tokens": 2**62 + 1},
            (MAX_REPORTED_TOKENS, 1, MAX_REPORTED_TOKENS + 1),
            id="huge",
        ),
        pytest.param(
            {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 0}, (10, 10, 20), id="total-below-parts"
        ),
    ],
)
def test_reported_usage_is_clamped(
    gateway: GatewayThread, faults: FaultServer, usage: dict[str, int], want: tuple[int, int, int]
) -> None:
    body = {**RECORDED_COMPLETION, "usage": usage}
    faults["alpha"].script(respond(json.dumps(body).encode(), 200))
    resp = post(gateway)
    assert resp.status_code == 200, resp.text
    got = resp.json()["usage"]
    assert (got["prompt_tokens"], got["completion_tokens"], got["total_tokens"]) == want


@pytest.mark.parametrize(
    ("details", "want"),
    [
        pytest.param(
            ({"reasoning_tokens": -9}, {"cached_tokens": 2**62}),
            ({"reasoning_tokens": 0}, {"cached_tokens": MAX_REPORTED_TOKENS}),
            id="negative-and-huge",
        ),
        pytest.param(
            ({"reasoning_tokens": 3, "audio_tokens": 0}, {"cached_tokens": 4}),
            ({"reasoning_tokens": 3, "audio_tokens": 0}, {"cached_tokens": 4}),
            id="sane",
        ),
    ],
)
def test_reported_usage_details_are_clamped(
    gateway: GatewayThread,
    faults: FaultServer,
    details: tuple[dict[str, int], dict[str, int]],
    want: tuple[dict[str, int], dict[str, int]],
) -> None:
    usage: dict[str, object] = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    usage |= {"completion_tokens_details": details[0], "prompt_tokens_details": details[1]}
    faults["alpha"].script(respond(json.dumps({**RECORDED_COMPLETION, "usage": usage}).encode(), 200))
    resp = post(gateway)
    assert resp.status_code == 200, resp.text
    got = resp.json()["usage"]
    assert (got["prompt_tokens"], got["completion_tokens"], got["total_tokens"]) == (10, 5, 15)
    assert (got["completion_tokens_details"], got["prompt_tokens_details"]) == want


def test_fractional_token_counts_are_an_invalid_answer(gateway: GatewayThread, faults: FaultServer) -> None:
    body = {**RECORDED_COMPLETION, "usage": {"prompt_tokens": 1.5, "completion_tokens": 1, "total_tokens": 2.5}}
    faults["alpha"].script(respond(json.dumps(body).encode(), 200))
    resp = post(gateway)
    assert resp.status_code == 502
    assert resp.json()["error"]["code"] == "invalid_upstream_response"


def test_quota_reset_header_of_years_cools_the_target_for_at_most_a_month(
    gateway: GatewayThread, faults: FaultServer
) -> None:
    used_up = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "99999h"}
    faults["alpha"].script(respond(json.dumps(RECORDED_COMPLETION).encode(), 200, used_up))
    assert post(gateway).status_code == 200
    health = gateway.pipeline.health.local  # no Redis configured: the cooldown lives in process
    # Kept under the target's server identity (`alpha@<hash of its URL>/davinci-002`), the only one cooling.
    [(name, (until, _))] = health.cool.items()
    assert name.startswith("alpha@") and name.endswith("/davinci-002")
    assert 0 < until - health.clock() <= MAX_QUOTA_WAIT_S
