"""An upstream that says its quota is used up is skipped by every replica until the reset."""

from __future__ import annotations

from tests.helpers.faults import RECORDED_JSON, FaultServer, respond
from tests.helpers.pipelines import VirtualTime, ask, key, state
from tests.helpers.redis import RedisServer

from .conftest import MakePipeline

ORDERED_AB = """
  - name: smart
    strategy: ordered
    targets: [{model: alpha/davinci-002}, {model: beta/davinci-002}]
"""
# The recorded completion, answered with OpenAI's headers saying no request is left for 20 s.
USED_UP = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "20s"}


async def test_an_exhausted_quota_reported_by_a_success_moves_every_replica_on(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, redis: RedisServer
) -> None:
    top = f"redis: {{url: '{redis.url}', refresh_ms: 0}}\n"
    one, two = make(ORDERED_AB, top=top), make(ORDERED_AB, top=top)
    faults["alpha"].script(respond(RECORDED_JSON, 200, USED_UP))
    # The answer itself is served: the quota was not exceeded, it is now used up.
    first = await ask(one)
    assert first.error is None and first.served_by == key("alpha")
    cooled = await state(two, "alpha")
    assert cooled.cause == "429" and 19_000 < cooled.cooling_ms <= 20_000 and cooled.failures == 0
    # The other replica does not send alpha the request it would refuse: beta serves, with no wasted call.
    second = await ask(two)
    assert second.served_by == key("beta") and second.attempts == 1
    assert faults.order() == ["alpha", "beta"]


async def test_an_exhausted_only_target_answers_429_until_its_reset(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    only_a = """
  - name: smart
    targets: [{model: alpha/davinci-002}]
"""
    p = make(only_a)
    faults["alpha"].script(respond(RECORDED_JSON, 200, USED_UP))
    assert (await ask(p)).served_by == key("alpha")
    refused = await ask(p)
    assert refused.error is not None and refused.error.status == 429 and refused.attempts == 0
    assert refused.error.retry_after is not None and 19 < refused.error.retry_after <= 20
    assert faults.order() == ["alpha"]
    vtime.advance(20.0)
    assert (await ask(p)).served_by == key("alpha")
    assert faults.order() == ["alpha", "alpha"]
