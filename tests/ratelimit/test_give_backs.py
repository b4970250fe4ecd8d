"""Request units given back for an emulated fan-out's calls never made, across a Redis outage: each goes where
its charge is, as token corrections do (tests/ratelimit/test_corrections.py).

The give-back follows its charge within one request, so the outage is switched between them here, on the
admission a gateway runs, over a real redis-server: Redis "away" is its default user switched off and its
connections dropped (`Outage`), Redis keeping every bucket. The provider has `rpm: 10` (nothing drips back
while a test runs).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.config import parse_config
from gateway.limits.admission import Admission
from gateway.path.routing import Router
from gateway.state import SharedState
from gateway.upstream.plan import Route
from tests.helpers.redis import RedisServer
from tests.helpers.waiting import wait_until
from tests.ratelimit.test_corrections import Outage

CONFIG = """
redis: {{url: "{redis}", on_failure: fail_open}}
providers:
  hf: {{kind: tgi, base_url: "http://127.0.0.1:9", limits: {{rpm: 10}}}}
"""
RPM = "rl:{provider:hf}:rpm"


class Setup:
    def __init__(self, redis: RedisServer) -> None:
        loaded = parse_config(CONFIG.format(redis=redis.url))
        self.outage = Outage(redis)
        self.shared = SharedState(redis.url)
        self.admission = Admission(loaded, self.shared)
        route = Router(loaded).resolve("hf/m")
        assert isinstance(route, Route)
        self.route = route

    def units(self) -> float:
        """Units Redis's rpm bucket holds (the script stores `ms:units`; nothing rolls over below the limit)."""
        raw = self.outage.admin.get(RPM)
        return 0.0 if raw is None else float(str(raw).split(":")[1])

    def local_units(self) -> float:
        """Units the process's own rpm bucket holds (what it decides on while Redis is away)."""
        (state,) = self.admission.limiter.local.peek(self.admission.providers["hf"])
        return float(state.bucket.limit - state.remaining)


@pytest.fixture
async def setup(redis: RedisServer) -> AsyncIterator[Setup]:
    made = Setup(redis)
    try:
        yield made
    finally:
        await made.admission.drain()
        await made.admission.limiter.close()
        await made.shared.close()


async def back(setup: Setup) -> None:
    """Until the process uses Redis again (the failure during the outage took it for down for a second)."""
    for _ in range(50):
        if await setup.shared.ping():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("Redis did not answer again")


async def test_units_charged_while_redis_was_away_go_back_to_the_process_state(setup: Setup) -> None:
    """Three calls charged on the process's own state during the outage, never made, given back once Redis is
    back: the process's state gets them, and Redis keeps the two it was charged. Before, they were taken off
    Redis's bucket, which had never been charged for them: the provider got three calls more than its limit."""
    assert await setup.admission.charge_calls(setup.route, 2) is False  # in Redis
    assert setup.units() == 2
    setup.outage.begin()
    assert await setup.admission.charge_calls(setup.route, 3) is True  # here
    assert setup.local_units() == 3
    setup.outage.end()
    await back(setup)
    setup.admission.give_back_calls(setup.route, 3, here=3)
    await asyncio.sleep(0.3)  # given back within the corrections' 50 ms batch
    assert setup.units() == 2
    assert setup.local_units() == 0


async def test_units_redis_could_not_take_back_are_sent_once_it_answers(setup: Setup) -> None:
    """Three calls charged in Redis, given back while Redis is away: they are kept, and Redis gets them once
    it answers. Before, they went to the process's own state (which had not been charged them) and Redis
    kept them charged for the rest of the minute."""
    assert await setup.admission.charge_calls(setup.route, 3) is False
    assert setup.units() == 3
    setup.outage.begin()
    setup.admission.give_back_calls(setup.route, 3)
    await asyncio.sleep(0.3)  # batched for 50 ms, then sent: Redis refuses them
    assert setup.units() == 3
    setup.outage.end()
    await asyncio.to_thread(wait_until, lambda: setup.units() == 0, 5)
