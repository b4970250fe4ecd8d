"""Hits and coalesced requests cost no upstream tokens; identical requests in flight make one call;
lm-eval's own bodies rerun without the upstream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.clients.test_lm_eval_bodies import GSM8K_STOPS, ID_PROMPTS, _generate_body, _loglikelihood_body
from tests.helpers.accesslog import listening
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream

from .conftest import ADMIN, ALICE, MODEL, client, config

CAROL = "gk-cache-carol-9d21"
DAVE = "gk-cache-dave-4f0a"
LIMITED = f"""
  - {{name: carol, key: "{CAROL}", limits: {{tpm: 60}}}}
  - {{name: dave, key: "{DAVE}", limits: {{rpm: 2}}}}
"""


@pytest.fixture
def limited(upstream: Upstream, tmp_path: Path) -> Iterator[GatewayThread]:
    text = config(upstream).replace("keys:\n", "keys:" + LIMITED, 1)
    with serve_config(tmp_path, text) as gw:
        yield gw


def body(prompt: Any, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 50, "temperature": 0, **extra}


def test_hits_are_not_charged_against_tpm(limited: GatewayThread, upstream: Upstream) -> None:
    with client(limited.url, CAROL) as carol:
        assert carol.post("/v1/completions", json=body("tpm: a")).headers["x-gateway-cache"] == "miss"
        # The key's tokens per minute are spent: another upstream request is refused...
        refused = carol.post("/v1/completions", json=body("tpm: b"))
        assert refused.status_code == 429, refused.text
        # ...while the stored answer is served, again and again, at no token cost.
        for _ in range(3):
            hit = carol.post("/v1/completions", json=body("tpm: a"))
            assert hit.status_code == 200, hit.text
            assert hit.headers["x-gateway-cache"] == "hit"
    assert len(upstream.received) == 1


def test_hits_still_count_against_request_rate_limits(limited: GatewayThread, upstream: Upstream) -> None:
    with client(limited.url, DAVE) as dave:
        assert dave.post("/v1/completions", json=body("rpm: a")).status_code == 200
        assert dave.post("/v1/completions", json=body("rpm: a")).headers["x-gateway-cache"] == "hit"
        assert dave.post("/v1/completions", json=body("rpm: a")).status_code == 429


def test_hits_count_against_the_teams_request_rate(upstream: Upstream, tmp_path: Path) -> None:
    crew = f"""
  - {{name: erin, key: "{CAROL}", team: crew}}
  - {{name: frank, key: "{DAVE}", team: crew}}
"""
    text = config(upstream).replace("keys:\n", "keys:" + crew, 1) + "teams:\n  crew: {limits: {rpm: 2}}\n"
    with serve_config(tmp_path, text) as gw, client(gw.url, CAROL) as erin, client(gw.url, DAVE) as frank:
        assert erin.post("/v1/completions", json=body("team: a")).headers["x-gateway-cache"] == "miss"
        assert frank.post("/v1/completions", json=body("team: b")).headers["x-gateway-cache"] == "miss"
        # Erin's stored answer would be a hit, but the team's two requests of the minute are spent.
        refused = erin.post("/v1/completions", json=body("team: a"))
        assert refused.status_code == 429 and refused.headers["x-gateway-team"] == "crew", refused.text
    assert len(upstream.received) == 2


def _slow(upstream: Upstream, seconds: float) -> None:
    like = upstream.handler

    async def slow(request: web.Request, received: Received) -> web.StreamResponse:
        await asyncio.sleep(seconds)
        return await like(request, received)

    upstream.handler = slow


async def _together(url: str, payloads: list[dict[str, Any]]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(payloads))
    headers = {"authorization": f"Bearer {ALICE}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=20, limits=limits, trust_env=False) as c:
        return await asyncio.gather(*(c.post("/v1/completions", json=p) for p in payloads))


def test_100_identical_concurrent_requests_make_one_upstream_call(gateway: GatewayThread, upstream: Upstream) -> None:
    _slow(upstream, 0.5)
    for stream in (False, True):
        upstream.received.clear()
        payload = body(f"coalesce: {stream}", max_tokens=5, stream=stream)
        answers = asyncio.run(_together(gateway.url, [payload] * 100))
        assert [r.status_code for r in answers] == [200] * 100
        states = sorted(r.headers["x-gateway-cache"] for r in answers)
        assert states == ["coalesced"] * 99 + ["miss"], states
        assert len(upstream.received) == 1
        # Every one of them got the same answer (each with its own id).
        assert len({json.dumps(_choices(r, stream)) for r in answers}) == 1


def _choices(resp: httpx.Response, stream: bool) -> Any:
    if not stream:
        return resp.json()["choices"]
    return [json.loads(line[6:])["choices"] for line in resp.text.split("\n") if line.startswith("data: {")]


def test_a_coalesced_request_waits_no_longer_than_its_own_deadline(gateway: GatewayThread, upstream: Upstream) -> None:
    _slow(upstream, 1.5)
    patient, hasty = body("deadline: x", max_tokens=5), body("deadline: x", max_tokens=5, inference_timeout=0.3)

    async def both() -> list[httpx.Response]:
        first = asyncio.ensure_future(_together(gateway.url, [patient]))
        await asyncio.sleep(0.2)  # the first request is in flight; the second coalesces onto it
        second = await _together(gateway.url, [hasty])
        return [*(await first), *second]

    leader, follower = asyncio.run(both())
    assert leader.status_code == 200
    assert follower.status_code == 504, follower.text
    assert len(upstream.received) == 1


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(_loglikelihood_body(1), id="loglikelihood"),
        pytest.param(_loglikelihood_body(0), id="loglikelihood-max-tokens-0"),
        pytest.param(_generate_body(GSM8K_STOPS), id="generate-until"),
        pytest.param(_generate_body(GSM8K_STOPS, ID_PROMPTS), id="generate-until-token-ids"),
    ],
)
def test_lm_eval_rerun_makes_no_upstream_call_and_returns_identical_choices(
    tmp_path: Path, upstream: Upstream, payload: dict[str, Any]
) -> None:
    with serve_config(tmp_path, config(upstream)) as gw, client(gw.url) as c:
        first = c.post("/v1/completions", json=payload)
        assert first.status_code == 200, first.text
        assert len(upstream.received) == 1
        rerun = c.post("/v1/completions", json=payload)
        assert rerun.status_code == 200 and rerun.headers["x-gateway-cache"] == "hit"
        assert len(upstream.received) == 1
        # Byte for byte: the choices' own JSON text in both answers.
        assert _choices_bytes(rerun.content) == _choices_bytes(first.content)


def _choices_bytes(raw: bytes) -> bytes:
    start = raw.index(b'"choices":')
    end = raw.index(b',"usage":', start) if b',"usage":' in raw[start:] else len(raw)
    return raw[start:end]


def test_a_hit_is_booked_as_cached_at_cost_0(upstream: Upstream, tmp_path: Path) -> None:
    priced = config(upstream, f'prices: {{"{MODEL}": {{prompt_per_1m: 1000000, completion_per_1m: 1000000}}}}')
    with serve_config(tmp_path, priced) as gw, client(gw.url) as c:
        first = c.post("/v1/completions", json=body("books: a", max_tokens=5)).json()
        assert c.post("/v1/completions", json=body("books: a", max_tokens=5)).headers["x-gateway-cache"] == "hit"
        books = c.get("/admin/usage", headers={"authorization": f"Bearer {ADMIN}"}).json()["keys"]["alice"]
    usage = first["usage"]
    assert books["requests"] == 2 and books["cached"] == 1
    assert books["prompt_tokens"] == 2 * usage["prompt_tokens"]  # the hit carries the stored usage...
    assert books["cost"] == usage["prompt_tokens"] + usage["completion_tokens"]  # ...and costs nothing


ERIN = "gk-cache-erin-2b7c"


def test_hits_are_not_charged_against_the_providers_quota(upstream: Upstream, tmp_path: Path) -> None:
    # Alice has no limits of her own (her hits are answered before any admission), Erin a request rate (hers
    # are admitted for it): neither hit is an upstream call, so neither spends the provider's quota.
    text = config(upstream).replace("keys:\n", f'keys:\n  - {{name: erin, key: "{ERIN}", limits: {{rpm: 50}}}}\n', 1)
    text = text.replace(f"base_url: {upstream.url}/v1}}", f"base_url: {upstream.url}/v1, limits: {{rpm: 2}}}}", 1)
    assert "limits: {rpm: 2}" in text
    with serve_config(tmp_path, text) as gw, client(gw.url, ALICE) as alice, client(gw.url, ERIN) as erin:
        for c in (alice, erin):
            assert c.post("/v1/completions", json=body("quota: a")).headers["x-gateway-cache"] == "miss"
        for _ in range(3):
            for c in (alice, erin):
                hit = c.post("/v1/completions", json=body("quota: a"))
                assert hit.status_code == 200, hit.text
                assert hit.headers["x-gateway-cache"] == "hit"
        # The quota is in force: the provider's two requests this minute are spent.
        assert alice.post("/v1/completions", json=body("quota: b")).status_code == 429
    assert len(upstream.received) == 2


def test_a_hit_answered_early_is_logged_counted_and_booked(upstream: Upstream, tmp_path: Path) -> None:
    with serve_config(tmp_path, config(upstream)) as gw, client(gw.url) as c, listening() as access:
        first = c.post("/v1/completions", json=body("early: a"), headers={"x-request-id": "early-miss"})
        hit = c.post("/v1/completions", json=body("early: a"), headers={"x-request-id": "early-hit"})
        assert hit.status_code == 200 and hit.headers["x-gateway-cache"] == "hit"
        assert hit.headers["x-request-id"] == "early-hit" and hit.headers["x-gateway-attempts"] == "0"
        assert hit.json()["choices"] == first.json()["choices"]
        metrics = c.get("/metrics").text
        books = c.get("/admin/usage", headers={"authorization": f"Bearer {ADMIN}"}).json()["keys"]["alice"]
    line = next(x for x in access.lines if x["request_id"] == "early-hit")
    assert (line["status"], line["provider"], line["target"], line["attempts"]) == (200, "local", MODEL, 0)
    assert line["completion_tokens"] == first.json()["usage"]["completion_tokens"]
    assert (
        'gateway_requests_total{dialect="openai",endpoint="completions",'
        'model="local/facebook/opt-125m",provider="local",status="200"} 2.0'
    ) in metrics
    assert books["requests"] == 2 and books["cached"] == 1
