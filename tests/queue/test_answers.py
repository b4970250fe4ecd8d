"""What a client of a saturated server sees: the priority header's refusals, the queue's 429s, its own
deadline counted in the queue, a client that leaves never reaching the upstream, a reload that keeps the
requests waiting, and an alias that spills to a target with room."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.engine import Engine
from tests.helpers.servers import rewrite, serve_config
from tests.queue.conftest import ask, body, config, gate, hold_one, provider, until

ROUTES = ["/v1/completions", "/v4/beta/completions", "/api/v1/compatibility/openai/v1/completions"]


@pytest.mark.parametrize("route", ROUTES)
async def test_a_priority_above_the_keys_max_is_a_403_naming_both_on_every_dialect(
    tmp_path: Path, engine: Engine, route: str
) -> None:
    with serve_config(tmp_path, config(engine, 1)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            refused = await client.post(
                route, json=body("noisy"), headers={"authorization": "Bearer k-noisy", "x-gateway-priority": "high"}
            )
            allowed = await client.post(
                route, json=body("boss"), headers={"authorization": "Bearer k-boss", "x-gateway-priority": "high"}
            )
    assert refused.status_code == 403
    text = refused.text
    assert "'high'" in text and "max_priority is 'normal'" in text
    if route == "/v1/completions":
        assert refused.json()["error"]["code"] == "priority_not_allowed"
    assert allowed.status_code == 200
    assert engine.order == ["boss"]  # the refused request never reached the upstream


async def test_an_unknown_priority_is_a_400_naming_the_header(tmp_path: Path, engine: Engine) -> None:
    with serve_config(tmp_path, config(engine, 1)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            resp = await ask(client, "noisy", x_gateway_priority="urgent")
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert (err["code"], err["param"]) == ("invalid_priority", "x-gateway-priority")
    assert engine.order == []


async def test_a_full_queue_answers_429_queue_full_at_once(tmp_path: Path, engine: Engine) -> None:
    with serve_config(tmp_path, config(engine, 1, queue="max_depth: 2")) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            engine.running.clear()
            held = [asyncio.ensure_future(ask(client, "noisy")) for _ in range(3)]
            await until(lambda: engine.inflight == 1 and gate(gw).order.depth == 2)
            started = time.monotonic()
            full = await ask(client, "noisy")  # the tenant with the most waiting: refused, not let in
            took = time.monotonic() - started
            engine.running.set()
            answers = await asyncio.gather(*held)
    assert full.status_code == 429 and took < 1.0
    assert full.json()["error"]["code"] == "queue_full"
    assert float(full.headers["retry-after"]) >= 1
    assert [r.status_code for r in answers] == [200] * 3
    assert engine.order == ["noisy"] * 3


async def test_one_tenant_filling_the_queue_cannot_keep_another_out(tmp_path: Path, engine: Engine) -> None:
    """A newcomer of a tenant with fewer waiting takes the place of the newest waiter of the tenant with the
    most: that one is refused `queue_full`, and the newcomer waits its fair turn."""
    with serve_config(tmp_path, config(engine, 1, queue="max_depth: 3")) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            engine.running.clear()
            noisy = []
            for _ in range(4):  # one in the slot, three waiting: the queue is full
                noisy.append(asyncio.ensure_future(ask(client, "noisy")))
                await until(lambda: engine.inflight == 1 and gate(gw).order.depth == len(noisy) - 1)
            quiet = asyncio.ensure_future(ask(client, "quiet"))
            displaced = await noisy[-1]  # the newest of noisy's waiters
            assert gate(gw).order.depth == 3
            engine.running.set()
            answers = await asyncio.gather(*noisy[:-1], quiet)
    assert (displaced.status_code, displaced.json()["error"]["code"]) == (429, "queue_full")
    assert [r.status_code for r in answers] == [200] * 4
    assert engine.order[:2] == ["noisy", "quiet"]  # the quiet tenant's turn comes first among the waiters


@pytest.mark.parametrize(
    ("queue", "extra", "status", "code"),
    [
        # Past queue.max_wait_ms: a 429 with Retry-After.
        ("max_wait_ms: 300", {}, 429, "queue_timeout"),
        # The request's own deadline ran out first: its time in the queue counted.
        ("", {"inference_timeout": 0.3}, 504, "deadline_exceeded"),
    ],
)
async def test_a_wait_ends_at_max_wait_or_at_the_requests_own_deadline(
    tmp_path: Path, engine: Engine, queue: str, extra: dict[str, Any], status: int, code: str
) -> None:
    with serve_config(tmp_path, config(engine, 1, queue=queue)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            blocker = await hold_one(client, engine)
            started = time.monotonic()
            late = await client.post(
                "/v1/completions", json=body("quiet", **extra), headers={"authorization": "Bearer k-quiet"}
            )
            waited = time.monotonic() - started
            assert gate(gw).order.depth == 0  # out of the queue once refused
            engine.running.set()
            assert (await blocker).status_code == 200
    assert late.status_code == status
    assert late.json()["error"]["code"] == code
    if status == 429:
        assert float(late.headers["retry-after"]) >= 1
    assert 0.25 < waited < 2.0
    assert engine.order == ["noisy"]


async def test_a_client_that_leaves_while_queued_never_reaches_the_upstream(tmp_path: Path, engine: Engine) -> None:
    with serve_config(tmp_path, config(engine, 1)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            blocker = await hold_one(client, engine)
            async with httpx.AsyncClient(base_url=gw.url, timeout=0.3) as impatient:
                with pytest.raises(httpx.ReadTimeout):
                    await ask(impatient, "quiet")
            await until(lambda: gate(gw).order.depth == 0)  # removed at once, before any slot freed
            engine.running.set()
            assert (await blocker).status_code == 200
            after = await ask(client, "noisy")
            await until(lambda: gate(gw).in_use == 0)
    assert after.status_code == 200
    assert engine.order == ["noisy", "noisy"]


@pytest.mark.parametrize("cap", [2, None])
async def test_a_reload_keeps_the_requests_that_wait(tmp_path: Path, engine: Engine, cap: int | None) -> None:
    """Under a raised cap the same queue goes on (one waiter goes at once); with no cap left, all go."""
    with serve_config(tmp_path, config(engine, 1), poll_every=0.1) as gw:
        first = gw.pipeline
        old = gate(gw)
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            blocker = await hold_one(client, engine)
            waiting = [asyncio.ensure_future(ask(client, "quiet")) for _ in range(3)]
            await until(lambda: old.order.depth == 3)
            text = config(engine, cap) if cap is not None else config(engine, 1).replace("    max_concurrency: 1\n", "")
            # The gateway's own poll of the file reloads it, on the gateway's loop (not this test's).
            rewrite(Path(gw.app.state.reloader.path), text + "# edited\n")
            await until(lambda: gw.pipeline is not first, timeout=15)
            if cap is not None:
                assert gate(gw) is old and old.cap == cap  # the same queue, under the new cap
            else:
                assert gw.pipeline.queues is None
            await until(lambda: engine.inflight == (cap or 4))
            engine.running.set()
            answers = await asyncio.gather(blocker, *waiting)
    assert [r.status_code for r in answers] == [200] * 4
    assert engine.peak == (cap or 4)
    assert sorted(engine.order) == ["noisy", "quiet", "quiet", "quiet"]


@pytest.mark.parametrize("frees_first", ["engine", "spare"])
async def test_an_alias_takes_the_first_of_its_targets_with_a_slot(
    tmp_path: Path, engine: Engine, frees_first: str
) -> None:
    """A full primary spills to a fallback with room at once; with both full, the request waits on the
    primary and takes whichever frees a slot first."""
    with Engine() as spare:
        models = """models:
  - name: shared
    strategy: ordered
    targets: [{model: engine/m}, {model: spare/m}]
retries: {attempts: 2}
"""
        text = config(engine, 1, provider=provider("spare", spare, 1), extra=models).replace(
            "retries: {attempts: 1}\n", ""
        )
        with serve_config(tmp_path, text) as gw:
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
                engine.running.clear()
                spare.running.clear()
                hdrs = {"authorization": "Bearer k-noisy"}
                req = {**body("noisy"), "model": "shared"}
                a = asyncio.ensure_future(client.post("/v1/completions", json=req, headers=hdrs))
                await until(lambda: engine.inflight == 1)
                b = asyncio.ensure_future(client.post("/v1/completions", json=req, headers=hdrs))
                await until(lambda: spare.inflight == 1)  # went to the spare at once, no wait
                c = asyncio.ensure_future(client.post("/v1/completions", json={**req, "prompt": "quiet"}, headers=hdrs))
                await until(lambda: gate(gw).order.depth == 1)  # both full: it waits on the primary
                first, other = (engine, spare) if frees_first == "engine" else (spare, engine)
                first.running.set()
                await until(lambda: c.done())
                assert other.inflight == 1  # the other target still holds its one request
                other.running.set()
                answers = await asyncio.gather(a, b, c)
    assert [r.status_code for r in answers] == [200] * 3
    assert answers[1].headers["x-gateway-provider"] == "spare"
    assert answers[2].headers["x-gateway-provider"] == frees_first
    assert answers[2].headers["x-gateway-attempts"] == "1"  # moving on was no attempt: no call was made
    assert first.order == ["noisy", "quiet"] and other.order == ["noisy"]
    assert engine.peak == 1 and spare.peak == 1
    assert gate(gw).order.depth == 0


async def test_a_cache_hit_checks_the_priority_asked_for_as_a_miss_does(tmp_path: Path, engine: Engine) -> None:
    """A hit takes no slot, but the header is the client's request all the same: a value the key may not ask
    for, or that does not exist, is refused whether or not the answer is stored."""
    with serve_config(tmp_path, config(engine, 1, extra="cache: {mode: always}")) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            stored = await ask(client, "noisy")
            hit = await ask(client, "noisy")
            unknown = await ask(client, "noisy", x_gateway_priority="urgent")
            above = await ask(client, "noisy", x_gateway_priority="high")
            allowed = await ask(client, "noisy", x_gateway_priority="low")
    assert stored.headers["x-gateway-cache"] == "miss" and hit.headers["x-gateway-cache"] == "hit"
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (400, "invalid_priority")
    assert (above.status_code, above.json()["error"]["code"]) == (403, "priority_not_allowed")
    assert (allowed.status_code, allowed.headers["x-gateway-cache"]) == (200, "hit")
    assert engine.order == ["noisy"]
