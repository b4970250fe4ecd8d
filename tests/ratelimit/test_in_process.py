"""Rate limits without Redis: each gateway process keeps them in its own memory, exactly.

The fake provider reports usage.prompt_tokens = the prompt's words and `demo/long` always generates exactly
max_tokens, so a request of `words(3)` and max_tokens 7 reserves 10 tokens and uses 10.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.helpers.clients import body, client
from tests.helpers.identity import bucket
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.waiting import wait_until


def post(gw: GatewayThread, key: str, payload: dict[str, object]) -> httpx.Response:
    with client(gw.url, key) as c:
        return c.post("/v1/completions", json=payload)


NO_REDIS = """
keys:
  - {name: burst, key: k-burst, limits: {rpm: 5, tpd: 8640}}
  - {name: slots, key: k-slots, limits: {concurrent: 3}}
  - {name: tok, key: k-tok, limits: {tpd: 8640}}
providers:
  demo: {kind: fake}
"""


def test_in_process_limits_are_exact(tmp_path: Path) -> None:
    with serve_config(tmp_path, NO_REDIS) as gwt:
        with client(gwt.url) as c:
            assert c.get("/ready").json() == {"status": "ready", "redis": "disabled"}

        def one(i: int) -> httpx.Response:
            return post(gwt, "k-burst", body("demo/long", prompt_words=3, max_tokens=7))

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, range(20)))
        ok = [r for r in results if r.status_code == 200]
        assert len(ok) == 5 and sum(r.status_code == 429 for r in results) == 15
        assert sorted(r.headers["x-ratelimit-remaining-requests"] for r in ok) == ["0", "1", "2", "3", "4"]
        assert sorted(int(r.headers["x-ratelimit-remaining-tokens"]) for r in ok) == [
            8640 - 10 * k for k in range(5, 0, -1)
        ]
        local = gwt.pipeline.admission.limiter.local
        assert local.tat[bucket("k-burst", "tpd")][1] == 50

        def slow(i: int) -> httpx.Response:
            return post(gwt, "k-slots", body("demo/slow-400ms"))

        with ThreadPoolExecutor(6) as pool:
            slowed = list(pool.map(slow, range(6)))
        assert sorted(r.status_code for r in slowed) == [200] * 3 + [429] * 3
        wait_until(lambda: len(local.leases.get(bucket("k-slots", "concurrent"), {})) == 0)
        assert post(gwt, "k-slots", body("demo/long")).status_code == 200

        # A reservation is settled to the reported usage in process memory too.
        resp = post(gwt, "k-tok", body("demo/text", max_tokens=200))
        assert resp.headers["x-ratelimit-remaining-tokens"] == str(8640 - 203)
        used = resp.json()["usage"]["total_tokens"]
        assert 3 + 8 <= used <= 3 + 47  # the fake's `text` writes 8 to 47 words
        wait_until(lambda: local.tat[bucket("k-tok", "tpd")][1] == used)
        nxt = post(gwt, "k-tok", body("demo/long", max_tokens=1))
        assert nxt.headers["x-ratelimit-remaining-tokens"] == str(8640 - used - 4)
