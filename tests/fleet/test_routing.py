"""Replicas and the routing policies over real sockets: affinity, bounded loads, sessions, engine load,
and a second gateway process choosing as the first (docs/fleets.md)."""

from __future__ import annotations

import asyncio
import ssl
from collections import Counter
from pathlib import Path

import httpx
import trustme
from aiohttp import web

from tests.helpers.servers import GatewayProcess, cli_env, serve_config
from tests.helpers.upstreams import Received, Upstream
from tests.helpers.waiting import wait_until

from .conftest import completion, fleet_config, served

SHARED = "You are grading answers. Example: the sky is blue because of Rayleigh scattering. " * 20


def prompt(i: int, tail: int = 0) -> str:
    return f"[task {i}] " + SHARED + f" question {tail}?"


def ask(gw_url: str, text: str, **extra: object) -> httpx.Response:
    with httpx.Client(trust_env=False, timeout=15) as c:
        return c.post(f"{gw_url}/v1/completions", json={"model": "engine/m", "prompt": text, **extra})


def which(ups: list[Upstream], before: list[int]) -> int:
    now = served(ups)
    changed = [i for i, (a, b) in enumerate(zip(before, now, strict=True)) if b != a]
    assert len(changed) == 1, (before, now)
    return changed[0]


def test_the_same_prefix_lands_on_the_same_replica(tmp_path: Path, replicas: list[Upstream]) -> None:
    with serve_config(tmp_path, fleet_config(replicas, "policy: prefix")) as gw:
        homes: dict[int, Counter[int]] = {i: Counter() for i in range(24)}
        for tail in range(4):
            for i in range(24):
                before = served(replicas)
                r = ask(gw.url, prompt(i, tail))
                assert r.status_code == 200
                home = which(replicas, before)
                homes[i][home] += 1
                assert r.headers["x-gateway-model"] == f"engine@{home}/m"  # the answer names its replica
    same = sum(c.most_common(1)[0][1] for c in homes.values())
    assert same / 96 >= 0.95
    # The prefixes spread over the replicas rather than all sharing one.
    assert len({c.most_common(1)[0][0] for c in homes.values()}) == 3


async def test_a_hot_prefix_spills_over_the_load_bound(tmp_path: Path, replicas: list[Upstream]) -> None:
    async def slow(request: web.Request, received: Received) -> web.StreamResponse:
        await asyncio.sleep(0.4)
        return web.Response(body=completion(), content_type="application/json")

    for u in replicas:
        u.handler = slow
    with serve_config(tmp_path, fleet_config(replicas, "policy: prefix, epsilon: 0.25")) as gw:
        async with httpx.AsyncClient(trust_env=False, timeout=15) as c:
            body = {"model": "engine/m", "prompt": prompt(7)}
            answers = await asyncio.gather(*(c.post(f"{gw.url}/v1/completions", json=body) for _ in range(12)))
    assert all(a.status_code == 200 for a in answers)
    counts = sorted(served(replicas), reverse=True)
    # Without the bound all twelve would go to the prefix's replica; with it none holds more than
    # ceil((1 + 0.25) x 12 / 3) = 5 at once, so the hot prefix spills over to the others.
    assert counts[0] <= 5 and counts[2] >= 1, counts


def test_sessions_stick_and_rehome_when_their_replica_cools(tmp_path: Path, replicas: list[Upstream]) -> None:
    with serve_config(tmp_path, fleet_config(replicas, "policy: session")) as gw:
        home: dict[str, int] = {}
        for turn in range(3):
            for s in range(9):
                before = served(replicas)
                r = ask(gw.url, f"turn {turn} of a conversation", **({"user": f"u{s}"} if s % 2 else {}))
                if not s % 2:
                    before = served(replicas)
                    with httpx.Client(trust_env=False, timeout=15) as c:
                        r = c.post(
                            f"{gw.url}/v1/completions",
                            json={"model": "engine/m", "prompt": f"turn {turn}"},
                            headers={"x-session-id": f"s{s}"},
                        )
                assert r.status_code == 200
                got = which(replicas, before)
                assert home.setdefault(f"s{s}", got) == got
        assert len(set(home.values())) > 1
        # The home of session s0 rate-limits: it cools at once, and the session moves to one other replica.
        old = home["s0"]

        async def limited(request: web.Request, received: Received) -> web.StreamResponse:
            return web.Response(status=429, headers={"retry-after": "30"}, text='{"error": {"message": "busy"}}')

        replicas[old].handler = limited
        landed = set()
        for _ in range(4):
            before = served(replicas)
            with httpx.Client(trust_env=False, timeout=15) as c:
                r = c.post(
                    f"{gw.url}/v1/completions",
                    json={"model": "engine/m", "prompt": "again"},
                    headers={"x-session-id": "s0"},
                )
            assert r.status_code == 200
            now = served(replicas)
            landed |= {i for i in range(3) if i != old and now[i] != before[i]}
        assert len(landed) == 1
        # Metrics name the replica that cooled (declared models keep their name per replica).
        with httpx.Client(trust_env=False, timeout=15) as c:
            exposition = c.get(f"{gw.url}/metrics").text
        assert f'gateway_cooldowns_total{{cause="429",target="engine@{old}/m"}}' in exposition


async def test_a_replicas_load_counts_every_model_it_serves(tmp_path: Path, replicas: list[Upstream]) -> None:
    """vLLM serves LoRA adapters as more model names on one server: a replica busy with one model is busy
    for the others too, so requests of another model go to the idle replica."""

    async def slow(request: web.Request, received: Received) -> web.StreamResponse:
        await asyncio.sleep(0.8)
        return web.Response(body=completion(), content_type="application/json")

    for u in replicas[:2]:
        u.handler = slow
    # One session's requests stay on its replica (epsilon: no load bound); requests without one go to the
    # replica with the fewest in flight.
    routing = "policy: session, epsilon: 100"
    config = fleet_config(replicas[:2], routing).replace("models: [m]", "models: [m, lora]")
    with serve_config(tmp_path, config) as gw:
        async with httpx.AsyncClient(base_url=gw.url, trust_env=False, timeout=15) as c:
            url = "/v1/completions"
            held = [
                asyncio.create_task(c.post(url, json={"model": "engine/m", "prompt": "a", "user": "s"}))
                for _ in range(3)
            ]
            await asyncio.sleep(0.3)  # all three in flight on the session's replica
            busy = served(replicas[:2]).index(3)
            others = await asyncio.gather(
                *(c.post(url, json={"model": "engine/lora", "prompt": "b"}) for _ in range(2))
            )
            assert all(r.status_code == 200 for r in [*await asyncio.gather(*held), *others])
    assert [r.headers["x-gateway-model"] for r in others] == [f"engine@{1 - busy}/lora"] * 2


def test_engine_metrics_steer_away_from_a_long_queue(tmp_path: Path, replicas: list[Upstream]) -> None:
    waiting = {0: 40, 1: 0}  # replica 2 exposes no metrics: unknown, routed as idle, not as dead

    def engine(i: int) -> object:
        async def handler(request: web.Request, received: Received) -> web.StreamResponse:
            if received.path == "/metrics":
                if i not in waiting:
                    return web.Response(status=404)
                text = (
                    "# TYPE vllm:num_requests_waiting gauge\n"
                    f'vllm:num_requests_waiting{{model_name="m"}} {waiting[i]}.0\n'
                    f'vllm:num_requests_running{{model_name="m"}} 3.0\n'
                    f'vllm:kv_cache_usage_perc{{model_name="m"}} 0.5\n'
                )
                return web.Response(text=text)
            return web.Response(body=completion(), content_type="application/json")

        return handler

    for i, u in enumerate(replicas):
        u.handler = engine(i)  # type: ignore[assignment]
    routing = "policy: least_outstanding, engine_metrics: true, metrics_interval_ms: 50, max_waiting: 8"
    with serve_config(tmp_path, fleet_config(replicas, routing)) as gw:
        fleet = gw.pipeline.router.fleets["engine"]
        wait_until(lambda: fleet.engine[0] is not None and fleet.engine[1] is not None)
        assert fleet.engine[0].waiting == 40 and fleet.engine[0].kv_usage == 0.5  # type: ignore[union-attr]
        assert fleet.engine[2] is None
        for n in range(12):
            assert ask(gw.url, f"p{n}").status_code == 200
        counts = served(replicas)
        assert counts[0] == 0 and counts[1] > 0 and counts[2] > 0, counts
        waiting[0] = 0  # the queue drained: the replica is back in rotation
        wait_until(lambda: fleet.engine[0] is not None and fleet.engine[0].waiting == 0)
        for n in range(6):
            assert ask(gw.url, f"q{n}").status_code == 200
        assert served(replicas)[0] > 0


def test_engine_metrics_are_read_over_the_providers_tls(tmp_path: Path) -> None:
    """HTTPS replicas behind a private CA: the metrics are read with the provider's `ca_bundle`, as its
    completions are, so the loaded replica is avoided (a plain transport could not read them at all)."""
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_tls)

    def engine(waiting: int) -> object:
        async def handler(request: web.Request, received: Received) -> web.StreamResponse:
            if received.path == "/metrics":
                return web.Response(text=f'vllm:num_requests_waiting{{model_name="m"}} {waiting}.0\n')
            return web.Response(body=completion(), content_type="application/json")

        return handler

    ups = [Upstream(server_tls), Upstream(server_tls)]
    for u, waiting in zip(ups, (40, 0), strict=True):
        u.handler = engine(waiting)  # type: ignore[assignment]
        u.start()
    try:
        routing = "policy: least_outstanding, engine_metrics: true, metrics_interval_ms: 50, max_waiting: 8"
        config = fleet_config(ups, routing).replace(
            "    discover: false\n", f"    discover: false\n    ca_bundle: {ca_file}\n"
        )
        with serve_config(tmp_path, config) as gw:
            fleet = gw.pipeline.router.fleets["engine"]
            wait_until(lambda: fleet.engine[0] is not None and fleet.engine[1] is not None)
            assert fleet.engine[0].waiting == 40 and fleet.engine_error == [None, None]  # type: ignore[union-attr]
            for n in range(6):
                assert ask(gw.url, f"t{n}").status_code == 200
            assert served(ups) == [0, 6]
    finally:
        for u in ups:
            u.stop()


def test_a_second_gateway_process_picks_the_same_replicas(tmp_path: Path, replicas: list[Upstream]) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text(fleet_config(replicas, "policy: prefix"))
    second = GatewayProcess(config, cli_env())
    try:
        second.wait_ready()
        with serve_config(tmp_path, fleet_config(replicas, "policy: prefix")) as first:
            for i in range(12):
                before = served(replicas)
                assert ask(first.url, prompt(100 + i)).status_code == 200
                a = which(replicas, before)
                before = served(replicas)
                assert ask(second.url, prompt(100 + i, tail=9)).status_code == 200
                assert which(replicas, before) == a
    finally:
        second.stop()
