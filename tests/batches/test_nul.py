"""A NUL character (which no PostgreSQL text value holds) in anything a client sends the Batch API: an id or
a cursor is one that does not exist, a query's `purpose` or an upload's filename a 400 naming the field, and
`metadata` holds it as any other character; never a 500. The same answers on SQLite and on PostgreSQL."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Final

import httpx

from tests.helpers.servers import GatewayThread

from .conftest import ADMIN_KEY, ENV, EVAL_KEY, config, jsonl, line

FILE: Final = jsonl([line("a")])
FORM: Final = {"content-type": "multipart/form-data; boundary=x"}


def _raw_form(filename: bytes) -> bytes:
    return (
        b'--x\r\ncontent-disposition: form-data; name="file"; filename="' + filename + b'"\r\n\r\n' + FILE
        + b'\r\n--x\r\ncontent-disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--x--\r\n'
    )  # fmt: skip


def test_a_nul_anywhere_a_client_writes_is_a_404_or_a_400_never_a_500(tmp_path: Path, url: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config(url))
    auth = {"authorization": f"Bearer {EVAL_KEY}"}
    with GatewayThread(path, ENV) as gw, httpx.Client(base_url=gw.url, headers=auth, timeout=10) as c:
        file_id = c.post("/v1/files", data={"purpose": "batch"}, files={"file": ("a.jsonl", FILE)}).json()["id"]
        batch = {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"}
        made = c.post("/v1/batches", json={**batch, "metadata": {"k\x00": "v\x00"}})
        deadline = time.monotonic() + 30
        while c.get(f"/v1/batches/{made.json()['id']}").json()["status"] != "completed":  # no file made later
            assert time.monotonic() < deadline
            time.sleep(0.05)
        unknown = [
            c.get("/v1/files/a%00b"),
            c.get("/v1/files/a%00b/content"),
            c.delete("/v1/files/a%00b"),
            c.get("/v1/batches/a%00b"),
            c.post("/v1/batches/a%00b/cancel"),
            c.get("/admin/batches/a%00b", headers={"authorization": f"Bearer {ADMIN_KEY}"}),
            c.post("/admin/batches/a%00b/cancel", headers={"authorization": f"Bearer {ADMIN_KEY}"}),
            c.post("/v1/batches", json={**batch, "input_file_id": file_id + "\x00"}),
        ]
        pages = {
            route: (c.get(route, params={"after": "\x00"}, headers=headers), c.get(route, headers=headers))
            for route, headers in [
                ("/v1/files", auth),
                ("/v1/batches", auth),
                ("/admin/batches", {"authorization": f"Bearer {ADMIN_KEY}"}),
            ]
        }
        refused = {
            "purpose": c.get("/v1/files", params={"purpose": "\x00"}),
            "endpoint": c.post("/v1/batches", json={**batch, "endpoint": "/v1/completions\x00"}),
            "completion_window": c.post("/v1/batches", json={**batch, "completion_window": "24h\x00"}),
        }
        raw = c.post("/v1/files", content=_raw_form(b"a\x00b.jsonl"), headers=FORM)
        odd_name = c.post("/v1/files", content=_raw_form(b"a\xffb.jsonl"), headers=FORM)  # not UTF-8
        files_after = c.get("/v1/files").json()["data"]
    assert made.status_code == 200 and made.json()["metadata"] == {"k\x00": "v\x00"}, made.text
    for resp in unknown:
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found", resp.text
    for route, (after, first) in pages.items():
        assert after.status_code == 200 and after.json()["data"] == first.json()["data"], (route, after.text)
    for param, resp in refused.items():
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, (param, resp.text)
    assert raw.status_code == 400 and raw.json()["error"]["param"] == "file", raw.text
    assert odd_name.status_code in (200, 400), odd_name.text
    assert all("\x00" not in f["filename"] for f in files_after)
