"""A key made through `/admin/keys` with limits of its own is held to them on the tokenizer routes too, where
the config itself sets no limits: its requests past `rpm` are a 429 that never reaches the upstream, like
its completions, and its `concurrent` cap holds there as well."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import httpx
from aiohttp import web

from tests.helpers.servers import serve_config
from tests.helpers.upstreams import Received, Upstream

ADMIN = "adm-runtime-tokenizer-1"

CONFIG = """
admin: {{key: "{admin}"}}
logging: {{requests: false}}
keyless: closed
ledger: {{url: "sqlite:///{db}", flush_ms: 100, keys_poll_ms: 200}}
providers:
  vl: {{kind: vllm, base_url: {u}/vl/v1}}
  demo: {{kind: fake, models: [text]}}
"""

RELEASE = threading.Event()


async def vllm(request: web.Request, rec: Received) -> web.StreamResponse:
    body = rec.json() if rec.body else {}
    if rec.path.endswith("/tokenize"):
        if body.get("prompt") == "hold":
            while not RELEASE.is_set():
                await asyncio.sleep(0.01)
        ids = [ord(c) for c in body.get("prompt", "")]
        return web.json_response({"count": len(ids), "max_model_len": 2048, "tokens": ids, "token_strs": None})
    if rec.path.endswith("/detokenize"):
        return web.json_response({"prompt": "".join(chr(t) for t in body.get("tokens", []))})
    return web.json_response({"detail": "Not Found"}, status=404)


def made(c: httpx.Client, name: str, limits: dict[str, int]) -> dict[str, str]:
    resp = c.post("/admin/keys", headers={"authorization": f"Bearer {ADMIN}"}, json={"name": name, "limits": limits})
    assert resp.status_code == 201, resp.text
    return {"authorization": f"Bearer {resp.json()['secret']}"}


def test_a_runtime_keys_rpm_and_concurrency_hold_on_the_tokenizer_routes(tmp_path: Path) -> None:
    RELEASE.clear()
    with Upstream() as up:
        up.handler = vllm
        cfg = CONFIG.format(admin=ADMIN, db=tmp_path / "l.db", u=up.url)
        with serve_config(tmp_path, cfg) as gw, httpx.Client(base_url=gw.url, trust_env=False, timeout=15) as c:
            slow = made(c, "slowbot", {"rpm": 1})
            answers = [c.post("/tokenize", headers=slow, json={"model": "vl/m", "prompt": "hi"}) for _ in range(3)]
            assert [a.status_code for a in answers] == [200, 429, 429]
            assert answers[0].json()["tokens"] == [104, 105]
            assert answers[0].headers["x-ratelimit-limit-requests"] == "1"
            refused = answers[1]
            assert refused.json()["error"]["code"] == "rate_limit_exceeded" and "retry-after" in refused.headers
            again = c.post("/detokenize", headers=slow, json={"model": "vl/m", "tokens": [104]})
            assert again.status_code == 429
            assert sum(1 for r in up.received if r.path.endswith("/tokenize")) == 1  # the 429s cost the server nothing

            # The same key's completions share its one request a minute.
            completion = c.post("/v1/completions", headers=slow, json={"model": "demo/text", "prompt": "x"})
            assert completion.status_code == 429

            # `concurrent: 1`: a second tokenize while the first is held upstream is refused at once.
            one = made(c, "onebot", {"concurrent": 1})
            held: list[int] = []
            first = threading.Thread(
                target=lambda: held.append(
                    c.post("/tokenize", headers=one, json={"model": "vl/m", "prompt": "hold"}).status_code
                )
            )
            first.start()
            try:
                for _ in range(200):
                    if any(r.json().get("prompt") == "hold" for r in up.received if r.path.endswith("/tokenize")):
                        break
                    threading.Event().wait(0.01)
                second = c.post("/tokenize", headers=one, json={"model": "vl/m", "prompt": "hi"})
                assert second.status_code == 429, second.text
            finally:
                RELEASE.set()
                first.join(10)
            assert held == [200]
            assert c.post("/tokenize", headers=one, json={"model": "vl/m", "prompt": "hi"}).status_code == 200
