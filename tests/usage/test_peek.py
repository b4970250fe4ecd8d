"""`Limiter.peek`: a bucket's headroom read without charging it, equal to what the next charge would report.

Each case charges a bucket through the real script (or its in-process twin), then peeks: a rate bucket's
remaining after n units equals the script's own `remaining` after that charge; peeking twice changes
nothing; a concurrency bucket counts live leases. Run on the in-process arithmetic and on a real redis-server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.limits.ratelimit import Bucket, Limiter, peek_state
from gateway.state import SharedState
from tests.helpers.redis import RedisServer


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def test_peek_state_mirrors_the_script_arithmetic() -> None:
    rpm = Bucket("key:a", "rpm", 30)  # one unit drips back every 2000 ms
    now = 1_000_000
    assert peek_state(rpm, now).remaining == 30
    # TAT 10 units ahead (20 s): 20 left, full again in 20 s.
    s = peek_state(rpm, now, (now + 20_000, 0.0))
    assert (s.remaining, s.reset_ms) == (20, 20_000)
    # The TAT as ms + units * period / limit: 5 ms and 3 units (6 s) ahead -> 6005 ms ahead: 3 used, and a bit.
    s = peek_state(rpm, now, (now + 5, 3.0))
    assert (s.remaining, s.reset_ms) == (26, 6005)
    assert peek_state(rpm, now, (now - 50_000, 0.0)).remaining == 30  # an old TAT is a full bucket
    tpm = Bucket("key:a", "tpm", 7)  # a period that is not a whole number of ms per unit
    s = peek_state(tpm, now, (now, 7.0))
    assert (s.remaining, s.reset_ms) == (0, 60_000)
    assert peek_state(Bucket("key:a", "concurrent", 3), now, held=2).remaining == 1


@pytest.fixture(params=["local", "redis"])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[Limiter]:
    if request.param == "local":
        yield Limiter(SharedState(""), clock=Clock())
        return
    rds: RedisServer = request.getfixturevalue("rds")
    shared = SharedState(rds.url)
    made = Limiter(shared, fail_open=False)
    try:
        yield made
    finally:
        await made.close()
        await shared.close()


async def test_peek_reads_without_charging(limiter: Limiter) -> None:
    rpm, tpd, slots = Bucket("key:p", "rpm", 100), Bucket("key:p", "tpd", 1000), Bucket("key:p", "concurrent", 3)
    fresh = await limiter.peek([rpm, tpd, slots])
    assert [s.remaining for s in fresh] == [100, 1000, 3]
    decisions = [await limiter.acquire([rpm, tpd, slots], 10) for _ in range(4)]
    assert all(d.allowed for d in decisions[:3]) and not decisions[3].allowed  # the fourth: no slot left
    charged = decisions[2].states
    peeked = await limiter.peek([rpm, tpd, slots])
    # At most one rpm unit can have dripped back (600 ms) while the test ran; tpd drips once per 86.4 s.
    assert peeked[0].remaining - charged[0].remaining in (0, 1)
    assert peeked[1].remaining == charged[1].remaining == 970
    assert peeked[1].reset_ms == pytest.approx(charged[1].reset_ms, abs=5)
    assert peeked[2].remaining == 0  # three leases held
    assert [s.remaining for s in await limiter.peek([tpd, slots])] == [970, 0]  # peeking charged nothing
    await limiter.release([slots], decisions[0].lease)
    await limiter.adjust([tpd], -10)
    assert [s.remaining for s in await limiter.peek([tpd, slots])] == [980, 1]
