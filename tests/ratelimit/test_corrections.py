"""Token corrections across a Redis outage: each goes where its reservation is, once.

Redis "away" here is its default user switched off and its connections dropped (ACL, through an admin
user the test made): the gateway cannot use it, and Redis keeps every bucket, as after a network cut or
while it refuses writes. The key has `tpd: 100000` (a day's period: nothing drips back while a test
runs), the upstream answers 2 + 8 = 10 tokens, and a request of "Hello world" with max_tokens 500
reserves 2 (or 3, by the bytes estimate) + 500.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis
from aiohttp import web

from tests.helpers.clients import client
from tests.helpers.identity import bucket
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream
from tests.helpers.waiting import wait_until

CONFIG = """
redis: {{url: "{redis}", on_failure: fail_open}}
keys:
  - {{name: day, key: k-day, limits: {{tpd: 100000}}}}
providers:
  up: {{kind: openai, api_key: sk-up, base_url: "{upstream}/v1"}}
"""
TPD = bucket("k-day", "tpd")
PAYLOAD = {"model": "up/davinci-002", "prompt": "Hello world", "max_tokens": 500}


class Outage:
    """Switches the default user (the gateway's) off and on, through an admin user of the test's own."""

    def __init__(self, server: RedisServer) -> None:
        with server.client() as r:
            r.execute_command("ACL", "SETUSER", "admin", "on", ">admin-pw", "~*", "&*", "+@all")
        self.admin: redis.Redis = redis.Redis(
            host="127.0.0.1", port=server.port, username="admin", password="admin-pw", decode_responses=True
        )

    def begin(self) -> None:
        self.admin.acl_setuser("default", enabled=False)
        self.admin.client_kill_filter(user="default")

    def end(self) -> None:
        self.admin.acl_setuser("default", enabled=True)

    def units(self) -> float:
        """Tokens the key's tpd bucket holds (the script stores `ms:units`; nothing rolls over below the limit)."""
        raw = self.admin.get(TPD)
        return 0.0 if raw is None else float(str(raw).split(":")[1])


class Held:
    """The upstream's answers, each held until the test lets it go (in the order the calls came)."""

    def __init__(self, upstream: Upstream) -> None:
        self.gates: list[threading.Event] = [threading.Event() for _ in range(8)]
        self.upstream = upstream
        upstream.handler = self.handler

    async def handler(self, request: web.Request, received: Received) -> web.StreamResponse:
        gate = self.gates[len(self.upstream.received) - 1]
        while not gate.is_set():
            await asyncio.sleep(0.01)
        return web.json_response(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 1,
                "model": "davinci-002",
                "choices": [{"text": " hi", "index": 0, "logprobs": None, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 2, "completion_tokens": 8, "total_tokens": 10},
            }
        )


@pytest.fixture
def gw(redis: RedisServer, upstream: Upstream, tmp_path: Path) -> Iterator[GatewayThread]:
    with serve_config(tmp_path, CONFIG.format(redis=redis.url, upstream=upstream.url)) as g:
        yield g


def send(gw: GatewayThread, answers: list[httpx.Response]) -> threading.Thread:
    def run() -> None:
        with client(gw.url, "k-day") as c:
            answers.append(c.post("/v1/completions", json=PAYLOAD))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def settled(check: Callable[[], bool]) -> None:
    wait_until(check, timeout=5, interval=0.05)


def back(gw: GatewayThread) -> None:
    """Until the gateway uses Redis again (a failure during the outage took it for down for a second)."""

    def ready() -> bool:
        with client(gw.url) as c:
            return bool(c.get("/ready").json() == {"status": "ready", "redis": "ok"})

    settled(ready)


def test_a_correction_redis_could_not_take_is_sent_once_it_answers(
    gw: GatewayThread, redis: RedisServer, upstream: Upstream
) -> None:
    """A request admitted in Redis ends while Redis is away: its correction (10 used of about 502 reserved)
    is sent once Redis answers. Before, it was applied to the process's own state and lost for Redis, where
    the whole reservation stayed charged: for `tpd`, the rest of the day."""
    outage, held = Outage(redis), Held(upstream)
    answers: list[httpx.Response] = []
    first = send(gw, answers)
    settled(lambda: len(upstream.received) == 1)
    reserved = outage.units()
    assert 502 <= reserved <= 503
    outage.begin()
    held.gates[0].set()
    first.join(10)
    assert answers[0].status_code == 200, answers[0].text
    time.sleep(0.5)  # the correction is batched for 50 ms, then sent: Redis refuses it
    assert outage.units() == reserved
    outage.end()
    settled(lambda: outage.units() == 10)


def test_a_reservation_made_while_redis_was_away_is_corrected_where_it_was_made(
    gw: GatewayThread, redis: RedisServer, upstream: Upstream
) -> None:
    """A request admitted on the process's own state (fail_open, Redis away) ends once Redis is back, beside
    one admitted in Redis: its correction is the process's, and Redis keeps the other's reservation. Before,
    its refund of about 492 tokens was taken off Redis's bucket, which had never been charged for it, so the
    key could use that much more than its limit."""
    outage, held = Outage(redis), Held(upstream)
    answers: list[httpx.Response] = []
    outage.begin()
    first = send(gw, answers)
    settled(lambda: len(upstream.received) == 1)  # admitted here, on the process's own state
    assert outage.units() == 0
    outage.end()
    back(gw)
    second = send(gw, answers)
    settled(lambda: len(upstream.received) == 2)  # admitted in Redis
    reserved = outage.units()
    assert 502 <= reserved <= 503
    held.gates[0].set()
    first.join(10)
    assert answers[0].status_code == 200, answers[0].text
    time.sleep(0.5)  # the first one's correction, batched for 50 ms, has been applied
    assert outage.units() == reserved
    held.gates[1].set()
    second.join(10)
    settled(lambda: outage.units() == 10)
