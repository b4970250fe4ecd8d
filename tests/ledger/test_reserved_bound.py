"""A budget's reservations in Redis stop at the largest 64-bit integer instead of overflowing, and are exact
again as they are given back: what goes past the bound is kept beside the counter (`reserved_past`).

Before, more than 16 reservations at `CALL_COST_MAX` in flight at once made Redis refuse the HINCRBY, which
the gateway cannot tell from an outage (Redis taken for unreachable, every budget counted in process).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

import httpx
import pytest
from aiohttp import web

from gateway.limits import saturating
from gateway.limits.prices import CALL_COST_MAX
from gateway.limits.saturating import INT64_MAX
from tests.helpers.clients import client
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Received, Upstream
from tests.helpers.waiting import wait_until

BUDGETED: Final = "gk-reserved-bound-5d21"
IN_FLIGHT: Final = 2**63 // CALL_COST_MAX + 2  # reservations at the cap whose sum is past a 64-bit integer
HELD_S: Final = 60.0  # how long the upstream holds a request at most (the test releases them far sooner)

CONFIG: Final = """
redis: {{url: "{redis}"}}
logging: {{requests: false}}
retries: {{attempts: 1}}
keys:
  - {{name: budgeted, key: "${{RB_BUDGETED}}", max_cost_per_day: 1000000000}}
prices:
  "llm/*": {{prompt_per_1m: 1000000, completion_per_1m: 1000000}}
providers:
  llm: {{kind: vllm, base_url: "{upstream}/v1", models: [m], discover: false}}
"""


def test_reserve_saturates_and_gives_back_exactly(rds: RedisServer) -> None:
    with rds.client() as r:
        assert [int(saturating.reserve(r, "c", CALL_COST_MAX)) for _ in range(IN_FLIGHT)][-3:] == [INT64_MAX] * 3
        assert int(r.hget("c", "reserved_past") or 0) == IN_FLIGHT * CALL_COST_MAX - INT64_MAX
        given = [int(saturating.reserve(r, "c", -CALL_COST_MAX)) for _ in range(IN_FLIGHT)]
        assert given[:2] == [INT64_MAX, INT64_MAX]  # still past the bound with 2 fewer
        assert given[-3:] == [2 * CALL_COST_MAX, CALL_COST_MAX, 0]  # exact once they fit in 64 bits
        assert r.hgetall("c") == {"reserved": "0"}
        # Below the bound it is HINCRBY: a change given back before its reservation reaches Redis stays exact.
        assert [int(saturating.reserve(r, "d", by)) for by in (-5, 7, 2**62, -(2**62))] == [-5, 2, 2 + 2**62, 2]


@pytest.fixture
def held() -> Iterator[tuple[Upstream, threading.Event]]:
    release = threading.Event()

    async def hold(request: web.Request, received: Received) -> web.StreamResponse:
        deadline = time.monotonic() + HELD_S
        while not release.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        choice = {"index": 0, "text": " x", "finish_reason": "length", "logprobs": None}
        body = {"id": "c", "object": "text_completion", "created": 1, "model": "m", "choices": [choice]}
        return web.json_response({**body, "usage": usage})

    with Upstream() as up:
        up.handler = hold
        yield up, release
        release.set()


def test_reservations_past_64_bits_in_flight_stay_in_redis(
    tmp_path: Path, held: tuple[Upstream, threading.Event], rds: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    upstream, release = held
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(redis=rds.url, upstream=upstream.url))
    caplog.set_level(logging.WARNING, logger="gateway")

    def counter() -> dict[str, str]:
        with rds.client() as r:
            names = list(r.scan_iter("budget:key_id:*"))
            assert len(names) <= 1, names
            return r.hgetall(names[0]) if names else {}

    with GatewayThread(path, {"RB_BUDGETED": BUDGETED}) as gw:

        def send(_: int) -> httpx.Response:
            with client(gw.url, BUDGETED) as c:
                # Its worst case (10**9 tokens at $1 each) is reserved at the cap.
                body = {"model": "llm/m", "prompt": "hi", "max_tokens": 10**9}
                return c.post("/v1/completions", json=body, timeout=HELD_S + 30)

        with ThreadPoolExecutor(IN_FLIGHT) as pool:
            sent = [pool.submit(send, i) for i in range(IN_FLIGHT)]
            try:
                wait_until(lambda: len(upstream.received) == IN_FLIGHT, timeout=30)
                held_now = counter()
            finally:
                release.set()
            answers = [f.result() for f in sent]
        assert [a.status_code for a in answers] == [200] * IN_FLIGHT, answers[0].text
        assert int(held_now["reserved"]) == INT64_MAX
        assert int(held_now["reserved_past"]) == IN_FLIGHT * CALL_COST_MAX - INT64_MAX
        wait_until(lambda: int(counter().get("reserved", -1)) == 0, timeout=10)  # every reservation given back
        assert "reserved_past" not in counter()
    assert [r.getMessage() for r in caplog.records if "redis" in r.getMessage().lower()] == []
