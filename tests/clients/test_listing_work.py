"""A model listing just under its byte cap costs the event loop a few milliseconds at a time, not a stall.

The gateway (uvicorn in a thread) refreshes a loopback vLLM-like upstream's listing every 300 ms. The
listing is a few bytes short of its cap (`discovery.max_models` x 1 KiB + 64 KiB) and made of the
smallest entries there are, millions of them: entries with ids, then entries without. While it refreshes,
`/health` is asked every 10 ms and must answer within 300 ms each time (the upstream and the client share
the test's process, whose threads take the interpreter in turns: on a VM slowed to a third of its speed, an
answer took up to 202 ms; decoded whole, such a listing held /health 0.46 to 3.4 s per refresh here).
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from gateway.edge.discovery import listing_cap
from tests.helpers.servers import serve_config
from tests.helpers.upstreams import Upstream, reply
from tests.helpers.waiting import wait_until

MAX_MODELS = 40_000
CAP = listing_cap(MAX_MODELS, 64 * 1024 * 1024)


def just_under_the_cap(card: bytes) -> bytes:
    """`card` (with `%d` for its number, if any) over and over, up to a few bytes short of the cap."""
    head, tail = b'{"object":"list","data":[', b"]}"
    size = len(card % 9_999_999) if b"%d" in card else len(card)
    n = (CAP - len(head) - len(tail)) // (size + 1)
    cards = [card % (1_000_000 + i) for i in range(n)] if b"%d" in card else [card] * n
    body = head + b",".join(cards) + tail
    assert CAP - 64 < len(body) <= CAP
    return body


@pytest.mark.parametrize("card", [b'{"id":"%d"}', b"{}"], ids=["ids", "no-ids"])
def test_a_listing_just_under_its_cap_does_not_stall_health(tmp_path: Path, card: bytes) -> None:
    body = just_under_the_cap(card)
    config = (
        f"server: {{host: 127.0.0.1, port: 0}}\ndiscovery: {{max_models: {MAX_MODELS}, ttl_ms: 300}}\n"
        "providers:\n  vl: {kind: vllm, base_url: URL/v1}\n"
    )
    with Upstream() as upstream:
        upstream.listings = reply(body)
        with serve_config(tmp_path, config.replace("URL", upstream.url)) as gw:
            wait_until(lambda: len(upstream.listed) >= 1, timeout=10)
            slowest = 0.0
            with httpx.Client(trust_env=False, timeout=5) as c:
                while len(upstream.listed) < 6:
                    t = time.perf_counter()
                    assert c.get(f"{gw.url}/health").status_code == 200
                    slowest = max(slowest, time.perf_counter() - t)
                    time.sleep(0.01)
                models = c.get(f"{gw.url}/v1/models").json()["data"]
    assert slowest < 0.3, slowest
    # The first max_models ids, in the upstream's order; of entries without ids, none.
    expected = [f"vl/{1_000_000 + i}" for i in range(MAX_MODELS)] if b"%d" in card else []
    assert [m["id"] for m in models if m["id"].startswith("vl/")] == expected
