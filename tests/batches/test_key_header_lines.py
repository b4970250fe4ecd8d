"""A key header sent on two lines is one comma-joined value on the Litestar routes too (`/v1/models`,
`/admin/*`, the Batch API, `/metrics`), as on the completion and tokenizer routes: no key reads like that, so
a 401, never the first line's key picked."""

from __future__ import annotations

import http.client
from pathlib import Path
from typing import Final

import pytest

from tests.helpers.servers import GatewayThread

from .conftest import ADMIN_KEY, ENV, EVAL_KEY, OTHER_KEY, config

METRICS_KEY: Final = "mk-batches-lines-31f0"


def _send(port: int, method: str, path: str, header: str, *values: str) -> tuple[int, bytes]:
    # http.client writes each `putheader` as its own line: what two proxies each adding the header make.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.putrequest(method, path)
        for value in values:
            conn.putheader(header, value)
        conn.putheader("content-length", "0")
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("header", ["authorization", "x-api-key"])
def test_a_key_header_on_two_lines_is_no_key_on_the_litestar_routes(tmp_path: Path, header: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config(f"sqlite:///{tmp_path / 'ledger.db'}", more=f'metrics: {{key: "{METRICS_KEY}"}}'))
    value = "Bearer {}" if header == "authorization" else "{}"
    routes = [
        ("GET", "/v1/models", EVAL_KEY),
        ("GET", "/v1/batches", EVAL_KEY),
        ("GET", "/v1/files", EVAL_KEY),
        ("GET", "/admin/usage", ADMIN_KEY),
        ("GET", "/admin/status", ADMIN_KEY),
    ]
    if header == "authorization":  # the metrics key is read from `Authorization: Bearer` alone
        routes.append(("GET", "/metrics", METRICS_KEY))
    with GatewayThread(path, ENV) as gw:
        for method, route, key in routes:
            # The first line alone is let in: the refusal below is the two lines', not the key's.
            alone, body = _send(gw.port, method, route, header, value.format(key))
            assert alone == 200, (route, alone, body)
            status, body = _send(gw.port, method, route, header, value.format(key), value.format(OTHER_KEY))
            assert status == 401, (route, status, body)
        # `/ready` reads no key: two lines change nothing there.
        assert _send(gw.port, "GET", "/ready", header, value.format(EVAL_KEY), value.format(OTHER_KEY))[0] == 200
