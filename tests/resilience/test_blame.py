"""Whom a failure blames (docs/resilience.md, "What cools a target"): a request's own failure must not
cool a target other tenants share, and a target that was down comes back within the recovery bound.

The tenant tests run over real sockets end to end: two client keys (`red` misbehaves, `blue` is
well-behaved) against the gateway under uvicorn, over one scripted upstream; they take real time
(each well under two seconds). The recovery tests drive the in-process pipeline on virtual time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from gateway.resilience.health import TargetState
from tests.helpers.clients import sse_data
from tests.helpers.faults import (
    CHUNKS,
    Behaviour,
    FaultServer,
    Hit,
    cut,
    good,
    respond,
    server_error,
    slow,
    stream,
    unavailable,
)
from tests.helpers.pipelines import PROMPT, VirtualTime, ask, config_yaml, key, state
from tests.helpers.servers import GatewayThread
from tests.helpers.waiting import wait_for

from .conftest import MakePipeline

ONLY_A = """
  - name: smart
    targets: [{model: alpha/davinci-002}]
"""
ORDERED_AB = """
  - name: smart
    strategy: ordered
    targets: [{model: alpha/davinci-002}, {model: beta/davinci-002}]
"""
KEYS = "keys: [{name: red, key: k-red}, {name: blue, key: k-blue}]\n"
# Short real backoffs: the misbehaving tenant's own retries must not make the test slow.
RETRIES = "retries: {attempts: 2, initial_backoff_ms: 5, max_backoff_ms: 10}\n"
UNAUTHORIZED = b'{"error": {"message": "No such organization", "type": "invalid_request_error", "code": null}}'
ROUNDS = 12


def when(test: Any, then: Behaviour, otherwise: Behaviour | None = None) -> Behaviour:
    """Answer like `then` a request `test(hit)` picks, like `otherwise` (good) any other."""
    other = otherwise or good()

    async def behave(request: web.Request, hit: Hit) -> web.StreamResponse:
        return await (then if test(hit) else other)(request, hit)

    return behave


def token_ids(hit: Hit) -> bool:
    """llama-cpp-python answers a prompt of token ids with a 500; text prompts are served."""
    return isinstance(hit.json()["prompt"], list)


@pytest.fixture
def gateway(faults: FaultServer, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[GatewayThread]:
    top: str = getattr(request, "param", "")
    path = tmp_path / "gateway.yaml"
    path.write_text(config_yaml(faults, ONLY_A, top=KEYS + RETRIES + top))
    with GatewayThread(path, {}) as gw:
        yield gw


def post(http: httpx.Client, gw: GatewayThread, tenant: str, **extra: Any) -> httpx.Response:
    body = {"model": "smart", "prompt": PROMPT, "max_tokens": 16, **extra}
    return http.post(gw.url + "/v1/completions", json=body, headers={"authorization": f"Bearer k-{tenant}"})


def client() -> httpx.Client:
    return httpx.Client(trust_env=False, timeout=10)


def test_one_tenants_input_that_the_upstream_answers_with_500_does_not_cool_it_for_another(
    faults: FaultServer, gateway: GatewayThread
) -> None:
    faults["alpha"].script(then=when(token_ids, server_error()))
    served = 0
    with client() as http:
        for _ in range(ROUNDS):
            served += post(http, gateway, "blue").status_code == 200
            # Three bad requests for each good one: more than `min_requests` failures in a row.
            for _ in range(3):
                bad = post(http, gateway, "red", prompt=[1, 2, 3])
                assert bad.status_code == 502 and bad.json()["error"]["code"] != "all_targets_cooling", bad.text
    assert served == ROUNDS  # 100 % for the well-behaved tenant while the other one fails
    # Every failing request reached the upstream: the target was never taken out of service.
    assert faults["alpha"].count == ROUNDS * 7  # red: three calls and their same-target retries; blue: one


def test_a_target_cooled_on_one_tenants_failures_alone_still_serves_another(
    faults: FaultServer, gateway: GatewayThread
) -> None:
    # red is alone on the target (blue is idle): its three failing requests are all the window has, and
    # cool the target. blue never failed there: its request probes the target at once and is served.
    faults["alpha"].script(then=when(token_ids, server_error()))
    with client() as http:
        for _ in range(3):
            assert post(http, gateway, "red", prompt=[1, 2, 3]).status_code == 502
        cooled = post(http, gateway, "red")
        assert cooled.json()["error"]["code"] == "all_targets_cooling"  # cooled for red's own requests
        served = [post(http, gateway, "blue").status_code for _ in range(ROUNDS)]
        assert post(http, gateway, "red").status_code == 200  # blue's probe ended the cooldown for all
    assert served == [200] * ROUNDS


def test_a_target_that_fails_the_probing_tenant_too_stays_cooled_for_it(
    faults: FaultServer, gateway: GatewayThread
) -> None:
    faults["alpha"].script(then=server_error())
    with client() as http:
        for _ in range(3):
            assert post(http, gateway, "red").status_code == 502
        probe = post(http, gateway, "blue")  # blue may probe once; the target fails it as well
        assert probe.status_code == 502
        after = post(http, gateway, "blue")
    assert (after.status_code, after.json()["error"]["code"]) == (503, "all_targets_cooling")
    assert faults["alpha"].count == 4 * 2  # red's three requests and blue's probe, each with its retry


@pytest.mark.parametrize("gateway", ["cooldown: {min_requests: 3}\n"], indirect=True)
def test_a_target_that_fails_every_tenants_requests_is_cooled(faults: FaultServer, gateway: GatewayThread) -> None:
    faults["alpha"].script(then=server_error())
    with client() as http:
        answers = [post(http, gateway, tenant) for tenant in ("red", "blue", "red", "blue")]
    # Three distinct requests of both tenants failed (each with its same-target retry): the fourth is
    # refused without calling the upstream, which fails for everyone.
    assert [a.status_code for a in answers] == [502, 502, 502, 503]
    assert answers[3].json()["error"]["code"] == "all_targets_cooling"
    assert faults["alpha"].count == 6


@pytest.mark.parametrize("gateway", ["cooldown: {min_requests: 1}\n"], indirect=True)
def test_a_clients_own_short_deadline_does_not_cool_the_target(faults: FaultServer, gateway: GatewayThread) -> None:
    # Even with the most eager breaker (one failure is enough), the client's own deadline blames no target.
    faults["alpha"].script(then=slow(0.05))
    served = 0
    with client() as http:
        for _ in range(ROUNDS // 2):
            late = post(http, gateway, "red", inference_timeout=0.001)
            assert late.status_code == 504, late.text
            served += post(http, gateway, "blue").status_code == 200
    assert served == ROUNDS // 2


def streamed(http: httpx.Client, gw: GatewayThread, tenant: str, **extra: Any) -> list[str]:
    """A stream's `data:` payloads; it began, so its status is 200 whatever broke it."""
    resp = post(http, gw, tenant, stream=True, **extra)
    assert resp.status_code == 200, resp.text
    return sse_data(resp.text)


@pytest.mark.parametrize("gateway", ["cooldown: {min_requests: 1}\n"], indirect=True)
def test_a_clients_own_deadline_ending_its_stream_mid_way_does_not_cool_the_target(
    faults: FaultServer, gateway: GatewayThread
) -> None:
    # The first event at once, then one every 50 ms: red's own 120 ms deadline ends its stream mid-way.
    faults["alpha"].script(then=when(lambda hit: hit.json().get("stream"), stream(gap=0.05)))
    served = 0
    with client() as http:
        for _ in range(ROUNDS // 2):
            events = streamed(http, gateway, "red", inference_timeout=0.12)
            assert '"upstream_total_timeout"' in events[-2] and events[-1] == "[DONE]", events[-2:]
            served += post(http, gateway, "blue").status_code == 200
    assert served == ROUNDS // 2


@pytest.mark.parametrize("gateway", ["timeouts: {first_byte_ms: 150}\n"], indirect=True)
def test_one_tenants_streams_that_stall_mid_way_do_not_cool_the_target_for_another(
    faults: FaultServer, gateway: GatewayThread
) -> None:
    # red's prompts of token ids make the target stall after its first event (past first_byte_ms): evidence
    # against the target only if every key's requests fail there, and blue's are served.
    stalls = stream(gap=0.5)
    faults["alpha"].script(then=when(token_ids, stalls))
    served = 0
    with client() as http:
        for _ in range(ROUNDS // 3):
            for _ in range(2):
                events = streamed(http, gateway, "red", prompt=[1, 2, 3])
                assert '"upstream_read_timeout"' in events[-2], events[-2:]
            served += post(http, gateway, "blue").status_code == 200
    assert served == ROUNDS // 3


def test_a_stream_whose_connection_drops_mid_way_cools_the_target_at_once(
    faults: FaultServer, gateway: GatewayThread
) -> None:
    faults["alpha"].script(then=cut(5))
    with client() as http:
        events = streamed(http, gateway, "red")
        assert len(events) == 7 and events[-1] == "[DONE]", events
        after = post(http, gateway, "blue")
    assert (after.status_code, after.json()["error"]["code"]) == (503, "all_targets_cooling")


def test_a_client_header_the_upstream_refuses_does_not_cool_the_target(
    faults: FaultServer, gateway: GatewayThread
) -> None:
    refused = respond(UNAUTHORIZED, 401)
    faults["alpha"].script(then=when(lambda hit: "openai-organization" in hit.headers, refused))
    served = 0
    with client() as http:
        for _ in range(ROUNDS // 2):
            other_org = post(http, gateway, "red", inference_extra_headers={"OpenAI-Organization": "org-not-ours"})
            assert other_org.status_code == 502, other_org.text
            served += post(http, gateway, "blue").status_code == 200
    assert served == ROUNDS // 2
    assert faults["alpha"].count == ROUNDS  # every one of red's requests was still sent


def test_the_gateways_own_credential_refused_cools_the_target_at_once(
    faults: FaultServer, gateway: GatewayThread
) -> None:
    faults["alpha"].script(then=respond(UNAUTHORIZED, 401))
    with client() as http:
        first = post(http, gateway, "red")
        second = post(http, gateway, "blue")
    assert first.status_code == 502
    assert (second.status_code, second.json()["error"]["code"]) == (503, "all_targets_cooling")
    assert faults["alpha"].count == 1


# --------------------------------------------------------------------------------------------------
# Recovery


@pytest.mark.parametrize("every_s", [4.0, 0.5])
async def test_a_flapping_primary_is_back_within_30_s_of_its_recovery(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, every_s: float
) -> None:
    # The primary answers 503 for 60 s, then is healthy; a request every 4 s (the benchmark's scenario),
    # or every 0.5 s, which escalates its cooldown to the cap.
    start = vtime.now
    recovered_at = start + 60.0
    faults["alpha"].script(then=when(lambda hit: vtime.now < recovered_at, unavailable()))
    p = make(ORDERED_AB)  # the default cooldown and retries
    back: float | None = None
    while vtime.now < recovered_at + 60:
        answer = await ask(p)
        assert answer.error is None  # the secondary serves while the primary is down
        if vtime.now >= recovered_at and answer.served_by == key("alpha") and back is None:
            back = vtime.now
        vtime.advance(every_s)
    assert back is not None and back - recovered_at <= 30.0, back - recovered_at if back else None


async def test_a_probe_that_failed_by_its_own_deadline_hands_the_probe_to_the_next_request(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    # The probe's deadline (0.2 s) is long enough for its call to reach alpha on a loaded machine, and far
    # shorter than alpha's (and then beta's) silence.
    faults["alpha"].script(unavailable(), slow(1.0))
    faults["beta"].script(good(), then=slow(1.0))
    p = make(ORDERED_AB, top="retries: {attempts: 2, same_target: 0}\ncooldown: {base_ms: 1000, min_requests: 1}\n")
    assert (await ask(p)).served_by == key("beta")
    assert await state(p, "alpha") == TargetState(cooling_ms=1000, cause="error", failures=1)
    vtime.advance(1.0)
    # The cooldown is over: this request is alpha's probe, and its own deadline runs out there.
    late = await ask(p, inference_timeout=0.2)
    assert late.error is not None and late.error.status == 504
    # Whether beta is still reached with what is left of the deadline depends on how busy the machine is.
    assert faults.order()[:3] == ["alpha", "beta", "alpha"] and faults.order()[3:] in ([], ["beta"])
    # That said nothing about alpha: it is not cooled again, and the next request is its probe at once.
    assert (await state(p, "alpha")).cooling_ms == 0
    answer = await ask(p)
    assert answer.served_by == key("alpha")
    assert await state(p, "alpha") == TargetState()


async def test_5xx_cools_only_with_min_requests_failures_within_the_window(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(then=server_error())
    p = make(ONLY_A, top="retries: {attempts: 1}\n")  # the defaults: 3 failed requests within 10 s
    for _ in range(3):  # 6 s apart: never three within one window
        assert (await ask(p)).error is not None
        assert await state(p, "alpha") == TargetState()
        vtime.advance(6.0)
    # Failures at 12 s, 18 s and now 19 s: three within 10 s is the evidence, and the target is cooled.
    await ask(p)
    vtime.advance(1.0)
    await ask(p)
    assert await state(p, "alpha") == TargetState(cooling_ms=1000, cause="error", failures=1)
    refused = await ask(p)
    assert refused.error is not None and refused.error.code == "all_targets_cooling"
    assert faults["alpha"].count == 5


async def test_a_probe_that_lost_a_hedge_race_hands_the_probe_to_the_next_request(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(unavailable(), slow(3.0))
    hedged = ORDERED_AB.replace("strategy: ordered", "strategy: ordered\n    hedge_after_ms: 100")
    top = "retries: {attempts: 3, same_target: 0}\ntimeouts: {first_byte_ms: 5000}\ncooldown: {min_requests: 1}\n"
    p = make(hedged, top=top)
    assert (await ask(p)).served_by == key("beta")
    vtime.advance(1.0)  # alpha's cooldown is over: the next request is its probe
    # The probe is slow, so the request is hedged to beta, which wins; the probe is cancelled.
    assert (await ask(p)).served_by == key("beta")
    assert faults.order() == ["alpha", "beta", "alpha", "beta"]
    assert await wait_for(faults["alpha"].hits[1].disconnected, 2.0)  # the loser was cancelled
    # Not held for first_byte_ms by a call that no longer exists: the next request probes alpha.
    answer = await ask(p)
    assert answer.served_by == key("alpha")
    assert await state(p, "alpha") == TargetState()


def _ends_early(request: web.Request, hit: Hit) -> Awaitable[web.StreamResponse]:
    """Five recorded events, then the end of the body: no finish reason, no [DONE]."""

    async def behave() -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for event in CHUNKS[:5]:
            await resp.write(event + b"\n\n")
        await resp.write_eof()
        return resp

    return behave()


@pytest.mark.parametrize(
    ("broken", "code"),
    [
        (stream([*CHUNKS[:5], b"data: {not json"]), "invalid_upstream_response"),
        (_ends_early, "upstream_stream_ended_early"),
    ],
    ids=["unreadable-event", "ended-early"],
)
@pytest.mark.parametrize("gateway", ["cooldown: {min_requests: 3}\n"], indirect=True)
def test_streams_that_break_mid_way_for_every_tenant_are_evidence_against_the_target(
    faults: FaultServer, gateway: GatewayThread, broken: Behaviour, code: str
) -> None:
    # As the same failure before the first event would: three distinct requests of both tenants broke there.
    faults["alpha"].script(then=broken)
    with client() as http:
        for tenant in ("red", "blue", "red"):
            events = streamed(http, gateway, tenant)
            assert f'"{code}"' in events[-2] and events[-1] == "[DONE]", events[-2:]
        after = post(http, gateway, "blue")
    assert (after.status_code, after.json()["error"]["code"]) == (503, "all_targets_cooling")
    assert faults["alpha"].count == 3
