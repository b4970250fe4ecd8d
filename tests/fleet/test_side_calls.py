"""Model discovery and the tokenizer routes of a replicated provider use any replica that answers."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from aiohttp import web

from tests.helpers.servers import free_port, serve_config
from tests.helpers.upstreams import Received, Upstream
from tests.helpers.waiting import wait_for, wait_until

from .conftest import answering, fleet_config, served

ADMIN_KEY = "admin-side-calls-key"

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
discovery: {{ttl_ms: 200, timeout_ms: 2000}}
retries: {{attempts: 1}}
admin: {{key: {admin}}}
logging: {{requests: false}}
providers:
  engine:
    kind: vllm
    replicas: [{listed}]
"""


async def listing(request: web.Request, received: Received) -> web.StreamResponse:
    return web.json_response({"object": "list", "data": [{"id": "served-model", "object": "model"}]})


async def tokenizer(request: web.Request, received: Received) -> web.StreamResponse:
    if received.path == "/tokenize":
        prompt = received.json()["prompt"]
        return web.json_response({"count": len(prompt), "max_model_len": 4096, "tokens": [ord(c) for c in prompt]})
    if received.path == "/detokenize":
        return web.json_response({"prompt": "".join(chr(t) for t in received.json()["tokens"])})
    return web.Response(status=404, text=json.dumps({"detail": "Not Found"}), content_type="application/json")


def models(c: httpx.Client, url: str) -> set[str]:
    return {m["id"] for m in c.get(f"{url}/v1/models").json()["data"]}


def test_a_down_replica_hides_nothing_and_tokenizes_through_the_next(tmp_path: Path) -> None:
    """The first replica refuses connections (a closed port); the second serves the list and the tokenizer."""
    live = Upstream()
    live.start()
    live.listings = listing
    live.handler = tokenizer
    listed = f"http://127.0.0.1:{free_port()}/v1, {live.url}/v1"
    try:
        with serve_config(tmp_path, CONFIG.format(admin=ADMIN_KEY, listed=listed)) as gw:
            with httpx.Client(trust_env=False, timeout=15) as c:
                wait_until(lambda: "engine/served-model" in models(c, gw.url), timeout=10, interval=0.05)
                # Several refreshes later the provider's models are still there, the down replica not counted.
                asked = len(live.listed)
                wait_until(lambda: len(live.listed) >= asked + 2, timeout=10, interval=0.05)
                assert "engine/served-model" in models(c, gw.url)
                r = c.post(f"{gw.url}/m/engine/served-model/tokenize", json={"prompt": "hi"})
                assert r.status_code == 200 and r.json()["tokens"] == [104, 105], r.text
                r = c.post(f"{gw.url}/m/engine/served-model/detokenize", json={"tokens": [104, 105]})
                assert r.status_code == 200 and r.json()["prompt"] == "hi", r.text
                assert [x.path for x in live.received] == ["/tokenize", "/detokenize"]
    finally:
        live.stop()


def test_discovery_skips_a_drained_replica(tmp_path: Path) -> None:
    """A replica drained through the admin route is no longer asked for the list; the other one is."""
    ups = [Upstream(), Upstream()]
    for u in ups:
        u.start()
        u.listings = listing
    listed = ", ".join(f"{u.url}/v1" for u in ups)
    try:
        with serve_config(tmp_path, CONFIG.format(admin=ADMIN_KEY, listed=listed)) as gw:
            with httpx.Client(trust_env=False, timeout=15) as c:
                wait_until(lambda: "engine/served-model" in models(c, gw.url), timeout=10, interval=0.05)
                r = c.post(
                    f"{gw.url}/admin/providers/engine/replicas/0/drain",
                    headers={"authorization": f"Bearer {ADMIN_KEY}"},
                )
                assert r.status_code == 200
                first = len(ups[0].listed)
                wait_until(lambda: len(ups[1].listed) >= 2, timeout=10, interval=0.05)
                # A refresh already under way when the drain came may still reach replica 0, at most one.
                assert len(ups[0].listed) <= first + 1
                assert "engine/served-model" in models(c, gw.url)
    finally:
        for u in ups:
            u.stop()


def test_least_busy_counts_a_fleet_in_flight_across_its_replicas(tmp_path: Path, replicas: list[Upstream]) -> None:
    """An alias choosing the least busy of a replicated provider and a single server sees the fleet's
    request in flight (it is counted on a replica, not on the provider's own route)."""
    release = threading.Event()

    async def held(request: web.Request, received: Received) -> web.StreamResponse:
        if received.json()["prompt"] == "held":
            assert await wait_for(release, 10)
        return await answering()(request, received)

    fleet, solo = replicas[:2], replicas[2]
    for u in replicas:
        u.handler = held
    extra = f"""  solo: {{kind: vllm, base_url: {solo.url}/v1, discover: false, models: [m]}}
models:
  - name: busy
    strategy: least-busy
    targets: [{{model: engine/m}}, {{model: solo/m}}]
"""
    with serve_config(tmp_path, fleet_config(fleet, "policy: least_outstanding", extra=extra)) as gw:
        with httpx.Client(trust_env=False, timeout=15) as c, ThreadPoolExecutor(1) as pool:
            url = f"{gw.url}/v1/completions"
            first = pool.submit(c.post, url, json={"model": "busy", "prompt": "held"})
            wait_until(lambda: sum(served(fleet)) == 1, timeout=10)  # a tie: the first target took it
            try:
                r = c.post(url, json={"model": "busy", "prompt": "q"})
                assert r.status_code == 200, r.text
                assert (r.headers["x-gateway-model"], sum(served(fleet)), len(solo.received)) == ("solo/m", 1, 1)
            finally:
                release.set()
            assert first.result(timeout=10).headers["x-gateway-model"].startswith("engine@")
