"""A config reload keeps what the gateway knows of each server, and only of the same server: the failures
counted in the cooldown window carry over (a target failing steadily is cooled however often the operator
reloads), and a provider pointed at another `base_url` starts clean (its old server's cooldown is not the new
one's). Real loopback upstreams, the gateway in a thread, reloads by the file poll; in process and through
a real Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread, rewrite
from tests.helpers.upstreams import Received, Upstream
from tests.helpers.waiting import wait_until

from ..fleet.conftest import answering, served

BODY = {"model": "up/m", "prompt": "q", "max_tokens": 4}


async def failing(request: web.Request, received: Received) -> web.StreamResponse:
    return web.json_response({"error": {"message": "overloaded", "type": "server_error"}}, status=500)


async def rate_limited(request: web.Request, received: Received) -> web.StreamResponse:
    return web.json_response({"error": {"message": "slow down"}}, status=429, headers={"retry-after": "60"})


@pytest.fixture
def ups() -> Iterator[list[Upstream]]:
    servers = [Upstream() for _ in range(2)]
    for u in servers:
        u.start()
        u.handler = answering()
    try:
        yield servers
    finally:
        for u in servers:
            u.stop()


def config(provider: str, *, top: str = "", note: int = 0) -> str:
    # `note` only changes the file, so that the poll reloads it.
    return f"""# reload {note}
server: {{host: 127.0.0.1, port: 0}}
timeouts: {{connect_ms: 2000, first_byte_ms: 10000, total_ms: 20000}}
retries: {{attempts: 1}}
logging: {{requests: false}}
cooldown: {{min_requests: 3, window_ms: 600000, base_ms: 60000, max_ms: 60000}}
{top}
providers:
  up:
    kind: vllm
    discover: false
    models: [m]
{provider}
"""


def reloaded(gw: GatewayThread, path: Path, text: str) -> None:
    before = gw.pipeline
    rewrite(path, text)
    wait_until(lambda: gw.pipeline is not before, timeout=15)


def _post(c: httpx.Client, gw: GatewayThread, body: dict[str, Any] = BODY) -> httpx.Response:
    return c.post(f"{gw.url}/v1/completions", json=body)


@pytest.mark.parametrize("shape", ["base_url", "replicas"])
def test_failures_counted_before_a_reload_still_count_after_it(shape: str, tmp_path: Path, ups: list[Upstream]) -> None:
    """Three failures with a reload between each: the third cools the target (min_requests: 3), as without
    reloads. A replica keeps its count though the reload lists the replicas the other way round."""
    bad, good = ups
    bad.handler = failing
    if shape == "base_url":
        layouts = [f"    base_url: {bad.url}/v1"] * 3
    else:
        layouts = [
            f"    replicas: [{bad.url}/v1, {good.url}/v1]\n    routing: {{policy: round_robin}}",
            f"    replicas: [{good.url}/v1, {bad.url}/v1]\n    routing: {{policy: round_robin}}",
        ] * 2
    path = tmp_path / "gw.yaml"
    path.write_text(config(layouts[0]))
    with GatewayThread(path, {}, poll_every=0.1) as gw, httpx.Client(trust_env=False, timeout=15) as c:
        for turn in range(3):
            if turn:
                reloaded(gw, path, config(layouts[turn], note=turn))
            for _ in range(4):  # round robin: ask until the failing replica has been asked once more
                if served([bad])[0] > turn:
                    break
                r = _post(c, gw)
                assert r.status_code in (200, 502), r.text
        assert served([bad]) == [3]
        # Cooled on the third failure: nothing reaches it now, however the requests come.
        for _ in range(4):
            r = _post(c, gw)
            assert r.status_code == (503 if shape == "base_url" else 200), r.text
        assert served([bad]) == [3]


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_a_provider_pointed_at_another_server_starts_clean(
    store: str, tmp_path: Path, ups: list[Upstream], request: pytest.FixtureRequest
) -> None:
    old, new = ups
    old.handler = rate_limited
    top = ""
    if store == "redis":
        redis: RedisServer = request.getfixturevalue("redis")
        top = f"redis: {{url: '{redis.url}'}}"
    path = tmp_path / "gw.yaml"
    path.write_text(config(f"    base_url: {old.url}/v1", top=top))
    with GatewayThread(path, {}, poll_every=0.1) as gw, httpx.Client(trust_env=False, timeout=15) as c:
        assert _post(c, gw).status_code == 429  # the old server's Retry-After: 60 s of cooldown
        assert _post(c, gw).status_code == 429 and served([old]) == [1]  # cooling: not asked again
        # A reload that keeps the URL keeps the cooldown.
        reloaded(gw, path, config(f"    base_url: {old.url}/v1", top=top, note=1))
        assert _post(c, gw).status_code == 429 and served([old]) == [1]
        # Another server under the same provider name: not cooling, served at once.
        reloaded(gw, path, config(f"    base_url: {new.url}/v1", top=top, note=2))
        r = _post(c, gw)
        assert r.status_code == 200, r.text
        assert served([old, new]) == [1, 1]
        # Back to the first server within its Retry-After: its cooldown is still its own.
        reloaded(gw, path, config(f"    base_url: {old.url}/v1", top=top, note=3))
        assert _post(c, gw).status_code == 429 and served([old, new]) == [1, 1]
