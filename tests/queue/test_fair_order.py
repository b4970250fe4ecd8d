"""The order a saturated server's queue serves in: priority classes, then the least weighted token service
among the tenants waiting. Each test fills the queue while the engine holds one request (cap 1), then lets
the engine run and reads the order requests reached it in."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from tests.helpers.engine import Engine
from tests.helpers.servers import GatewayThread, serve_config
from tests.queue.conftest import ask, ask_chat, config, gate, hold_one, until

Ask = tuple[str, int, dict[str, str]]  # a request to queue: its key, its max_tokens, its headers


def many(key: str, tokens: int, count: int, **headers: str) -> list[Ask]:
    return [(key, tokens, dict(headers))] * count


async def _queued(
    gw: GatewayThread, engine: Engine, client: httpx.AsyncClient, asks: list[Ask]
) -> list[httpx.Response]:
    """Hold the one slot with a blocker, queue `asks` (key, tokens, headers) one by one in that order, then let
    the engine run; the answers, and `engine.order` without the blocker."""
    blocker = await hold_one(client, engine, "blocker")
    g = gate(gw)
    tasks = []
    for i, (key, tokens, headers) in enumerate(asks):
        tasks.append(asyncio.ensure_future(ask(client, key, tokens=tokens, **headers)))
        await until(lambda i=i: g.order.depth == i + 1)
    engine.running.set()
    answers = await asyncio.gather(*tasks)
    assert (await blocker).status_code == 200
    engine.order.remove("blocker")
    return list(answers)


async def test_a_quiet_tenant_is_served_beside_a_flood_not_after_it(tmp_path: Path, engine: Engine) -> None:
    with serve_config(tmp_path, config(engine, 1)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            flood = many("noisy", 1, 12)
            answers = await _queued(gw, engine, client, flood + many("quiet", 1, 3))
    assert [r.status_code for r in answers] == [200] * 15
    # First come, first served would put the quiet tenant's three last (positions 12 to 14).
    quiet_at = [i for i, t in enumerate(engine.order) if t == "quiet"]
    assert max(quiet_at) <= 6, engine.order


async def test_service_is_counted_in_tokens_so_long_generations_do_not_take_short_ones_share(
    tmp_path: Path, engine: Engine
) -> None:
    with serve_config(tmp_path, config(engine, 1)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            asks = many("noisy", 90, 8) + many("quiet", 9, 16)
            await _queued(gw, engine, client, asks)
    # Equal token shares: while both wait, the short tenant gets about ten requests per long one.
    first = engine.order[:12]
    assert first.count("quiet") >= 9, engine.order


async def test_weights_set_the_shares(tmp_path: Path, engine: Engine) -> None:
    with serve_config(tmp_path, config(engine, 1)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            asks = many("noisy", 10, 12) + many("heavy", 10, 12)
            await _queued(gw, engine, client, asks)
    first = engine.order[:16]  # both tenants still waiting throughout
    assert 11 <= first.count("heavy") <= 13, engine.order  # weight 3 against 1: three quarters


async def test_the_lowest_weight_is_served_last_never_first(tmp_path: Path, engine: Engine) -> None:
    """Tokens / weight is the service charged: at the floor (0.001) it is large yet finite. A weight near zero
    (5e-324, refused now) charged infinity, and its credit made the service NaN, which no comparison orders:
    that key, waiting first, went ahead of everyone else for as long as it kept sending."""
    tiny = "  - {name: noisy, key: k-noisy}\n  - {name: tiny, key: k-tiny, weight: 0.001}"
    with serve_config(tmp_path, config(engine, 1).replace("  - {name: noisy, key: k-noisy}", tiny)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            assert (await ask(client, "tiny", tokens=10)).status_code == 200  # served alone: its service and credit
            await _queued(gw, engine, client, many("tiny", 10, 6) + many("noisy", 10, 6) + many("heavy", 10, 6))
    # Lifted to the others' service as it starts waiting, one of its requests may go among theirs: no more.
    queued = engine.order[1:]
    assert queued[:12].count("tiny") <= 1 and queued[-5:] == ["tiny"] * 5, engine.order


async def test_teams_share_when_fair_by_team(tmp_path: Path, engine: Engine) -> None:
    extra = "teams: {red: {weight: 1}, blue: {weight: 1}}"
    text = config(engine, 1, queue="fair_by: team", extra=extra)
    text = text.replace("{name: noisy, key: k-noisy}", "{name: noisy, key: k-noisy, team: red}")
    text = text.replace("{name: heavy, key: k-heavy, weight: 3}", "{name: heavy, key: k-heavy, team: red}")
    text = text.replace("{name: quiet, key: k-quiet}", "{name: quiet, key: k-quiet, team: blue}")
    with serve_config(tmp_path, text) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            asks = many("noisy", 5, 8) + many("heavy", 5, 8) + many("quiet", 5, 8)
            await _queued(gw, engine, client, asks)
    first = engine.order[:12]
    # Two keys of team red against one of team blue: blue still gets half, not a third.
    assert 5 <= first.count("quiet") <= 7, engine.order


async def test_a_teams_weight_sets_its_share_when_fair_by_team(tmp_path: Path, engine: Engine) -> None:
    extra = "teams: {red: {weight: 3}, blue: {weight: 1}}"
    text = config(engine, 1, queue="fair_by: team", extra=extra)
    text = text.replace("{name: noisy, key: k-noisy}", "{name: noisy, key: k-noisy, team: red}")
    # A key's own weight does not count when the team is the tenant.
    text = text.replace("{name: heavy, key: k-heavy, weight: 3}", "{name: heavy, key: k-heavy, weight: 3, team: blue}")
    with serve_config(tmp_path, text) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            await _queued(gw, engine, client, many("noisy", 10, 12) + many("heavy", 10, 12))
    first = engine.order[:16]  # both teams still waiting throughout
    assert 11 <= first.count("noisy") <= 13, engine.order  # team red, weight 3 against 1: three quarters


async def test_higher_classes_go_first_and_low_only_when_nothing_else_waits(tmp_path: Path, engine: Engine) -> None:
    with serve_config(tmp_path, config(engine, 1)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            asks = (
                many("batch", 1, 2)  # low by the key's own default
                + many("quiet", 1, 2, x_gateway_priority="low")
                + many("noisy", 1, 2)
                + many("boss", 1, 2, x_gateway_priority="high")
            )
            answers = await _queued(gw, engine, client, asks)
    assert [r.status_code for r in answers] == [200] * 8
    assert engine.order[:2] == ["boss", "boss"]
    assert engine.order[2:4] == ["noisy", "noisy"]
    assert sorted(engine.order[4:]) == ["batch", "batch", "quiet", "quiet"]


async def test_chat_requests_wait_in_the_queue_in_their_priority_class(tmp_path: Path, engine: Engine) -> None:
    """Chat requests queue behind a full server like completions, and `x-gateway-priority` orders them."""
    with serve_config(tmp_path, config(engine, 1)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            blocker = await hold_one(client, engine, "blocker")
            g = gate(gw)
            asks = [("batch", {}), ("noisy", {}), ("boss", {"x_gateway_priority": "high"}), ("noisy", {})]
            tasks = []
            for i, (key, headers) in enumerate(asks):
                tasks.append(asyncio.ensure_future(ask_chat(client, key, **headers)))
                await until(lambda i=i: g.order.depth == i + 1)  # waiting in the gateway, not at the engine
            assert engine.inflight == 1
            engine.running.set()
            answers = await asyncio.gather(*tasks)
            assert (await blocker).status_code == 200
    assert [r.status_code for r in answers] == [200] * 4
    assert {r.json()["object"] for r in answers} == {"chat.completion"}
    assert engine.order == ["blocker", "boss", "noisy", "noisy", "batch"]


async def test_low_starves_under_steady_normal_traffic_by_design(tmp_path: Path, engine: Engine) -> None:
    engine.hold_s = 0.02
    queue = "max_wait_ms: 5000, max_wait_by_priority: {low: 400}"
    with serve_config(tmp_path, config(engine, 1, queue=queue)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            stop = asyncio.Event()

            async def steady() -> None:
                while not stop.is_set():
                    await ask(client, "noisy")

            workers = [asyncio.ensure_future(steady()) for _ in range(3)]
            await until(lambda: gate(gw).order.depth >= 1)
            low = await ask(client, "batch")
            stop.set()
            await asyncio.gather(*workers)
            after = await ask(client, "batch")  # nothing else waits now: low runs
    assert low.status_code == 429
    assert low.json()["error"]["code"] == "queue_timeout"
    assert "batch" not in engine.order[:-1]
    assert after.status_code == 200 and engine.order[-1] == "batch"


async def test_a_tenant_that_was_idle_does_not_bank_credit(tmp_path: Path, engine: Engine) -> None:
    with serve_config(tmp_path, config(engine, 1)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            for _ in range(8):  # `noisy` alone, never waiting: 8 requests of service while `quiet` is idle
                assert (await ask(client, "noisy", tokens=20)).status_code == 200
            engine.order.clear()
            await _queued(gw, engine, client, many("noisy", 20, 6) + many("quiet", 20, 6))
    # Had `quiet` kept its zero while `noisy` was served, it would now take its six first.
    assert engine.order[:6].count("noisy") >= 2, engine.order
    assert engine.order[:4].count("quiet") >= 1, engine.order
