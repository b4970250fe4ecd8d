"""Every answer's `content-type` is one header naming its charset at most once, over a real socket.

Litestar appends `; charset=utf-8` to any text/ media type, also to one that already names its charset;
the Prometheus exposition and the usage CSV did, and went out as `...; charset=utf-8; charset=utf-8`.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from gateway.ops.metrics import CONTENT_TYPE
from tests.helpers.servers import serve_config

ADMIN = {"authorization": "Bearer admin-ct"}


def test_every_route_names_its_charset_once(tmp_path: Path) -> None:
    config = f"""
server: {{host: 127.0.0.1, port: 0}}
admin: {{key: admin-ct}}
ledger: {{url: "sqlite:///{tmp_path}/ledger.db"}}
providers:
  f: {{kind: fake}}
"""
    gets = {
        "/metrics": CONTENT_TYPE,
        "/admin/usage?format=csv": "text/csv; charset=utf-8",
        "/": "text/html; charset=utf-8",
        "/health": "application/json",
        "/admin/status": "application/json",
        "/admin/usage": "application/json",
        "/v1/models": "application/json",
        "/no/such/route": "application/json",
    }
    with serve_config(tmp_path, config) as gw, httpx.Client(trust_env=False, timeout=10) as c:
        seen = {path: c.get(gw.url + path, headers=ADMIN).headers.get_list("content-type") for path in gets}
        done = c.post(f"{gw.url}/v1/completions", json={"model": "f/echo", "prompt": "hi"}, headers=ADMIN)
        assert done.status_code == 200, done.text
        seen["/v1/completions"] = done.headers.get_list("content-type")
        with c.stream(
            "POST", f"{gw.url}/v1/completions", json={"model": "f/echo", "prompt": "hi", "stream": True}, headers=ADMIN
        ) as streamed:
            assert streamed.status_code == 200
            seen["/v1/completions stream"] = streamed.headers.get_list("content-type")
    assert seen == {
        **{path: [media] for path, media in gets.items()},
        "/v1/completions": ["application/json"],
        "/v1/completions stream": ["text/event-stream"],
    }
