"""A cache entry's tenant is the key that stored it, told apart by its secret, never by its name.

Three real gateways (uvicorn in threads) share one real redis-server and the in-process fake provider:
`a` and `b` are configured differently but each has a key named `tenant` (with different secrets); `c`
is a replica of `a` (the same key). `b`'s tenant must never be answered from what `a`'s tenant stored,
while `c` reads it: the scope follows the key, not the name.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.helpers.clients import client
from tests.helpers.redis import RedisServer
from tests.helpers.servers import serve_config
from tests.helpers.waiting import wait_until

CONFIG = """
redis: {{url: "{redis}"}}
retries: {{attempts: 1}}
keys:
  - {{name: tenant, key: "{secret}"}}
providers:
  demo: {{kind: fake, models: [long]}}
cache: {{mode: always, store: redis}}
"""
FIRST = "gk-tenant-of-gateway-a-3c71"
SECOND = "gk-tenant-of-gateway-b-94d0"
BODY = {"model": "demo/long", "prompt": "the quarterly numbers of tenant one", "max_tokens": 6}


def ask(url: str, key: str) -> httpx.Response:
    with client(url, key) as c:
        resp = c.post("/v1/completions", json=BODY)
    assert resp.status_code == 200, resp.text
    return resp


def test_two_gateways_sharing_redis_never_serve_each_others_same_named_keys(tmp_path: Path, rds: RedisServer) -> None:
    with (
        serve_config(tmp_path, CONFIG.format(redis=rds.url, secret=FIRST)) as a,
        serve_config(tmp_path, CONFIG.format(redis=rds.url, secret=SECOND)) as b,
        serve_config(tmp_path, CONFIG.format(redis=rds.url, secret=FIRST)) as c,
    ):
        assert ask(a.url, FIRST).headers["x-gateway-cache"] == "miss"
        # The same key on a replica reads the stored answer (written to Redis in the background).
        wait_until(lambda: ask(c.url, FIRST).headers["x-gateway-cache"] == "hit")
        assert rds.client().dbsize() > 0
        # Another gateway's key of the same name asks for itself.
        assert ask(b.url, SECOND).headers["x-gateway-cache"] == "miss"
        wait_until(lambda: ask(b.url, SECOND).headers["x-gateway-cache"] == "hit")  # its own entry, then
