"""Bookings on their way to Redis are still counted: a report (and a budget's read) taken while this process
writes its last half second of bookings finds them there, not in neither place.

A real `gateway serve` and a real redis-server: `CLIENT PAUSE ... WRITE` holds the gateway's write of its
bookings (reads go on), so the window a loaded Redis makes for a millisecond lasts long enough to look into.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.clients import body, client
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayProcess, cli_env

from .conftest import ENV, FREE_KEY, config, usage, wait_requests


@pytest.fixture
def gateway(rds: RedisServer, tmp_path: Path) -> Iterator[GatewayProcess]:
    path = tmp_path / "config.yaml"
    path.write_text(config(rds.url))
    gw = GatewayProcess(path, cli_env(**ENV))
    try:
        gw.wait_ready()
        yield gw
    finally:
        gw.stop()


def test_bookings_being_written_to_redis_are_still_in_the_report(gateway: GatewayProcess, rds: RedisServer) -> None:
    with client(gateway.url, FREE_KEY) as c:
        assert c.post("/v1/completions", json=body(model="demo/text", max_tokens=4)).status_code == 200
    wait_requests(gateway.url, "free", 1)
    with rds.client() as r:
        r.execute_command("CLIENT", "PAUSE", "1500", "WRITE")  # the booking's write (due within 0.5 s) waits
    seen = []
    until = time.monotonic() + 1.2
    while time.monotonic() < until:
        free = usage(gateway.url)["keys"]["free"]
        seen.append((free["requests"], free["cost"]))
        time.sleep(0.05)
    assert set(seen) == {(1, 0.0007)}, sorted(set(seen))
    time.sleep(0.5)  # the pause over, the write lands: counted once, from Redis
    free = usage(gateway.url)["keys"]["free"]
    assert (free["requests"], free["cost"]) == (1, 0.0007)
