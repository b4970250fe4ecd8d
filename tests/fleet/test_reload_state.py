"""A config reload keeps each replica's in-process state: streams still open count on their replica, and a
cooling replica stays cooling, though the new `replicas:` lists the same URLs in another order."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import httpx
from aiohttp import web

from tests.helpers.servers import GatewayThread, rewrite
from tests.helpers.upstreams import Received, Upstream
from tests.helpers.waiting import wait_until

from .conftest import answering, fleet_config, served
from .test_open_streams import holding, inflight, open_stream


def reloaded(gw: GatewayThread, path: Path, config: str) -> None:
    """Rewrite the config and wait until the file poll has swapped in the new pipeline."""
    before = gw.pipeline
    rewrite(path, config)
    wait_until(lambda: gw.pipeline is not before, timeout=15)


def test_a_stream_open_across_a_reload_still_counts_on_its_replica(tmp_path: Path, replicas: list[Upstream]) -> None:
    two = replicas[:2]
    release = threading.Event()
    for u in two:
        u.handler = holding(release)
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet_config(two, "policy: least_outstanding"))
    with GatewayThread(path, {}, poll_every=0.1) as gw, httpx.Client(trust_env=False, timeout=15) as c:
        with open_stream(c, gw.url) as (stream, lines):
            busy = two[int(stream.headers["x-gateway-model"].split("@")[1].split("/")[0])]
            idle = two[1] if busy is two[0] else two[0]
            # The same replicas, listed the other way round: `engine@0` is now the other URL.
            reloaded(
                gw, path, fleet_config(two, "policy: least_outstanding", replicas=f"{two[1].url}/v1, {two[0].url}/v1")
            )
            now_busy = 0 if gw.pipeline.router.fleets["engine"].urls[0] == f"{busy.url}/v1" else 1
            assert inflight(c, gw.url) == {f"engine@{now_busy}/m": 1, f"engine@{1 - now_busy}/m": 0}
            before = served(two)
            for _ in range(4):
                assert c.post(f"{gw.url}/v1/completions", json={"model": "engine/m", "prompt": "q"}).status_code == 200
            after = served(two)
            # Every request went to the replica without the open stream.
            assert after[two.index(busy)] == before[two.index(busy)]
            assert after[two.index(idle)] == before[two.index(idle)] + 4
            release.set()
            assert "[DONE]" in "".join(lines)
        # The stream ended on the old pipeline: the new one sees its count go back to 0.
        wait_until(lambda: set(inflight(c, gw.url).values()) == {0})


def test_a_cooling_replica_stays_cooling_across_a_reload(tmp_path: Path, replicas: list[Upstream]) -> None:
    two = replicas[:2]
    limited = two[0]

    async def rate_limited(request: web.Request, received: Received) -> web.StreamResponse:
        return web.json_response({"error": {"message": "slow down"}}, status=429, headers={"retry-after": "60"})

    limited.handler = rate_limited
    two[1].handler = answering()
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet_config(two, "policy: round_robin"))
    with GatewayThread(path, {}, poll_every=0.1) as gw, httpx.Client(trust_env=False, timeout=15) as c:
        body = {"model": "engine/m", "prompt": "q"}
        for _ in range(2):  # round robin: one of them reached the rate-limited replica, which is cooling now
            assert c.post(f"{gw.url}/v1/completions", json=body).status_code == 200
        assert served(two)[0] == 1
        reloaded(gw, path, fleet_config(two, "policy: round_robin", replicas=f"{two[1].url}/v1, {two[0].url}/v1"))
        for _ in range(4):
            assert c.post(f"{gw.url}/v1/completions", json=body).status_code == 200
        assert served(two)[0] == 1  # still cooling for its Retry-After: not asked again


def service_tokens(c: httpx.Client, url: str) -> dict[str, float]:
    """`gateway_queue_service_tokens_total` per target, over every tenant."""
    out: dict[str, float] = {}
    for target, value in re.findall(
        r'gateway_queue_service_tokens_total\{[^}]*target="([^"]+)"[^}]*\} (\S+)', c.get(f"{url}/metrics").text
    ):
        out[target] = out.get(target, 0.0) + float(value)
    return out


def test_a_kept_queue_takes_its_replicas_new_name(tmp_path: Path, replicas: list[Upstream]) -> None:
    two = replicas[:2]
    capped = ", ".join(f"{{url: {u.url}/v1, max_concurrency: 1}}" for u in two)
    reordered = ", ".join(f"{{url: {u.url}/v1, max_concurrency: 1}}" for u in reversed(two))
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet_config(two, "policy: round_robin", replicas=capped))
    with GatewayThread(path, {}, poll_every=0.1) as gw, httpx.Client(trust_env=False, timeout=15) as c:
        reloaded(gw, path, fleet_config(two, "policy: round_robin", replicas=reordered))
        r = c.post(f"{gw.url}/v1/completions", json={"model": "engine/m", "prompt": "q"})
        assert r.status_code == 200
        name = r.headers["x-gateway-model"].split("/")[0]  # the replica's name in the new config
        # The replica's queue was kept (its waiters and slots carry over) and is named as the new config names it.
        wait_until(lambda: service_tokens(c, gw.url).get(name, 0.0) > 0, timeout=5)
        assert set(service_tokens(c, gw.url)) == {name}
