"""The Batch API as the unmodified `openai` SDK calls it, over a real socket, booking into a real SQLite file."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.helpers.accesslog import listening
from tests.helpers.servers import GatewayProcess, GatewayThread, cli_env
from tests.helpers.sqlite import opened
from tests.helpers.waiting import wait_until

from .conftest import (
    ADMIN_KEY,
    ENV,
    EVAL_KEY,
    OTHER_KEY,
    config,
    jsonl,
    line,
    results,
    sdk,
    served,
    start,
    upload,
    wait_batch,
)


def test_a_batch_completes_every_line_once_with_the_direct_answer(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config(f"sqlite:///{tmp_path / 'ledger.db'}"))
    lines = [line(f"q-{i}", prompt=f"question {i} about foxes") for i in range(300)]
    with GatewayThread(path, ENV) as gw:
        client = sdk(gw.url, EVAL_KEY)
        file_id = upload(client, jsonl(lines))
        made = client.batches.create(
            input_file_id=file_id, endpoint="/v1/completions", completion_window="24h", metadata={"suite": "mmlu"}
        )
        assert made.status == "validating" and made.metadata == {"suite": "mmlu"}
        batch = wait_batch(client, made.id)
        assert batch.status == "completed", batch
        assert batch.request_counts is not None
        assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (
            300,
            300,
            0,
        )
        assert batch.error_file_id is None and batch.output_file_id is not None
        out = results(client, batch.output_file_id)
        assert [o["custom_id"] for o in out] == [f"q-{i}" for i in range(300)]
        with httpx.Client(base_url=gw.url, headers={"authorization": f"Bearer {EVAL_KEY}"}) as c:
            for o in out[::37]:
                i = int(o["custom_id"][2:])
                direct = c.post("/v1/completions", json=lines[i]["body"]).json()
                got = o["response"]["body"]
                assert o["response"]["status_code"] == 200 and o["error"] is None
                assert got["choices"] == direct["choices"] and got["usage"] == direct["usage"]
        assert client.files.retrieve(batch.output_file_id).bytes == len(
            client.files.content(batch.output_file_id).content
        )
        assert made.id in [b.id for b in client.batches.list()]
    # Every line is a row of the ledger naming its batch; the direct requests name none.
    with opened(tmp_path / "ledger.db") as conn:
        booked = conn.execute(
            "SELECT batch_id, count(*), count(DISTINCT request_id), min(status), max(status) FROM requests "
            "GROUP BY batch_id ORDER BY batch_id NULLS FIRST"
        ).fetchall()
    assert booked == [(None, 9, 9, 200, 200), (made.id, 300, 300, 200, 200)]


def _errors(batch: object) -> list[tuple[str, int | None]]:
    errors = getattr(batch, "errors", None)
    assert errors is not None and errors.data
    return [(e.code, e.line) for e in errors.data]


def test_bad_files_fail_the_batch_naming_the_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():  # a reload reads the process's environment
        monkeypatch.setenv(name, value)
    path = tmp_path / "config.yaml"
    path.write_text(config(f"sqlite:///{tmp_path / 'ledger.db'}", extra=", max_lines: 5, max_file_bytes: 4096"))
    good = jsonl([line("a"), line("b")])
    cases = {
        "not json": (good + b"this is not json\n", [("invalid_json_line", 3)]),
        "no custom_id": (
            jsonl([line("a"), {"method": "POST", "url": "/v1/completions", "body": {}}]),
            [("missing_required_parameter", 2)],
        ),
        "duplicate": (jsonl([line("a"), line("b"), line("a")]), [("duplicate_custom_id", 3)]),
        "other endpoint": (jsonl([line("a"), {**line("b"), "url": "/v1/chat/completions"}]), [("invalid_url", 2)]),
        "too many": (jsonl([line(f"x{i}") for i in range(6)]), [("too_many_lines", 6)]),
        # Each of these once kept the batch `validating` for good, its file read again at every lease.
        "not utf-8": (
            good + jsonl([line("c", prompt="PROMPT")]).replace(b"PROMPT", b"\xff\xfe"),
            [("invalid_json_line", 3)],
        ),
        "too deep": (
            good
            + b'{"custom_id":"d","method":"POST","url":"/v1/completions","body":{"x":'
            + b"[" * 1500
            + b"]" * 1500
            + b"}}\n",
            [("invalid_json_line", 3)],
        ),
        "NUL in custom_id": (jsonl([line("a\u0000b")]), [("invalid_value", 1)]),
    }
    with GatewayThread(path, ENV) as gw:
        client = sdk(gw.url, EVAL_KEY)
        for name, (data, expected) in cases.items():
            made = client.batches.create(
                input_file_id=upload(client, data), endpoint="/v1/completions", completion_window="24h"
            )
            batch = wait_batch(client, made.id)
            assert batch.status == "failed", name
            assert batch.failed_at is not None and batch.output_file_id is None
            assert _errors(batch) == expected, name
        # Over batches.max_file_bytes: the upload itself is refused, naming the limit.
        try:
            upload(client, jsonl([line(f"y{i}", prompt="p" * 1000) for i in range(5)]))
            raise AssertionError("a file over max_file_bytes was stored")
        except openai.APIStatusError as exc:
            assert exc.status_code == 413 and "batches.max_file_bytes" in exc.message
        for bad, param in (
            ({"endpoint": "/v1/embeddings"}, "endpoint"),
            ({"completion_window": "soon"}, "completion_window"),
            ({"completion_window": "24h\n"}, "completion_window"),
            ({"completion_window": "\u0662\u0664h"}, "completion_window"),  # Arabic-Indic digits: not OpenAI's
            ({"extra_body": {"foo": 1}}, "foo"),
            ({"metadata": {"a": 1}}, "metadata"),
        ):
            try:
                spec: dict[str, Any] = {
                    "input_file_id": upload(client, good),
                    "endpoint": "/v1/completions",
                    "completion_window": "24h",
                    **bad,
                }
                client.batches.create(**spec)
                raise AssertionError(f"accepted {bad}")
            except openai.BadRequestError as exc:
                assert exc.status_code == 400 and exc.param == param
        # A file stored under a larger cap, then a reload lowers it: the batch fails naming the first line over.
        stored = upload(client, jsonl([line(f"z{i}", prompt="p" * 300) for i in range(5)]))  # 5 lines of 422 bytes
        path.write_text(config(f"sqlite:///{tmp_path / 'ledger.db'}", extra=", max_lines: 5, max_file_bytes: 1024"))
        wait_until(lambda: gw.pipeline.loaded.config.batches.max_file_bytes == 1024, timeout=10)
        made = client.batches.create(input_file_id=stored, endpoint="/v1/completions", completion_window="24h")
        batch = wait_batch(client, made.id)
        assert batch.status == "failed" and _errors(batch) == [("file_too_large", 3)]


def test_refused_lines_go_to_the_error_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config(f"sqlite:///{tmp_path / 'ledger.db'}"))
    lines = [
        line("ok-1"),
        line("unknown-model", model="nope/nothing"),
        line("bad-field", max_tokens="many"),
        line("streams", stream=True),
        line("ok-2", prompt="another"),
    ]
    with GatewayThread(path, ENV) as gw:
        client = sdk(gw.url, EVAL_KEY)
        made = client.batches.create(
            input_file_id=upload(client, jsonl(lines)), endpoint="/v1/completions", completion_window="24h"
        )
        batch = wait_batch(client, made.id)
        assert batch.status == "completed"
        assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (5, 2, 3)
        out, err = results(client, batch.output_file_id), results(client, batch.error_file_id)
        assert [o["custom_id"] for o in out] == ["ok-1", "ok-2"]
        refused = {e["custom_id"]: e["response"] for e in err}
        assert sorted(refused) == ["bad-field", "streams", "unknown-model"]
        assert refused["unknown-model"]["status_code"] == 404
        assert refused["unknown-model"]["body"]["error"]["code"] == "model_not_found"
        assert (
            refused["bad-field"]["status_code"] == 400
            and refused["bad-field"]["body"]["error"]["param"] == "max_tokens"
        )
        assert refused["streams"]["status_code"] == 400 and refused["streams"]["body"]["error"]["param"] == "stream"
        assert all(e["error"] is None and e["id"].startswith("batch_req_") for e in err)


def test_cancel_mid_run_reports_every_line_once(tmp_path: Path) -> None:
    lines = [line(f"c-{i}", model="slower", prompt=f"p {i}") for i in range(30)]
    with served(tmp_path, concurrency=2) as (gw, client):
        made_id = start(client, lines)
        wait_batch(client, made_id, lambda b: b.request_counts is not None and b.request_counts.completed >= 2)
        with httpx.Client(base_url=gw.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}) as c:
            shown = c.get("/admin/status").json()["batches"]
        assert [(b["id"], b["owner"], b["status"], b["total"]) for b in shown] == [(made_id, "eval", "in_progress", 30)]
        assert shown[0]["completed"] >= 2
        cancelling = client.batches.cancel(made_id)
        assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at is not None
        batch = wait_batch(client, made_id)
        assert batch.status == "cancelled" and batch.cancelled_at is not None
        out, err = results(client, batch.output_file_id), results(client, batch.error_file_id)
        ids = [o["custom_id"] for o in out] + [e["custom_id"] for e in err]
        assert sorted(ids) == sorted(x["custom_id"] for x in lines)
        assert 2 <= len(out) < 30
        assert {e["error"]["code"] for e in err} == {"batch_cancelled"}
        assert batch.request_counts.completed == len(out) and batch.request_counts.failed == len(err)


def test_expiry_reports_the_lines_left_expired(tmp_path: Path) -> None:
    lines = [line(f"e-{i}", model="slower", prompt=f"p {i}") for i in range(20)]
    with served(tmp_path, concurrency=1) as (gw, client):
        batch = wait_batch(client, start(client, lines, window="2s"))
        assert batch.status == "expired" and batch.expired_at is not None
        out, err = results(client, batch.output_file_id), results(client, batch.error_file_id)
        text = httpx.get(gw.url + "/metrics").text
        assert 1 <= len(out) < 20
        assert sorted([o["custom_id"] for o in out] + [e["custom_id"] for e in err]) == sorted(
            x["custom_id"] for x in lines
        )
        assert {e["error"]["code"] for e in err} == {"batch_expired"} and all(e["response"] is None for e in err)
    assert f'gateway_batch_lines_total{{status="expired"}} {float(len(err))}' in text


def test_a_key_sees_only_its_own(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config(f"sqlite:///{tmp_path / 'ledger.db'}"))
    with GatewayThread(path, ENV) as gw:
        mine, theirs = sdk(gw.url, EVAL_KEY), sdk(gw.url, OTHER_KEY)
        file_id = upload(mine, jsonl([line("t-1")]))
        made = mine.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h")
        batch = wait_batch(mine, made.id)
        for call in (
            lambda: theirs.files.retrieve(file_id),
            lambda: theirs.files.content(file_id),
            lambda: theirs.files.content(batch.output_file_id),
            lambda: theirs.files.delete(file_id),
            lambda: theirs.batches.retrieve(made.id),
            lambda: theirs.batches.cancel(made.id),
            lambda: theirs.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h"),
        ):
            try:
                call()
                raise AssertionError("another key's object was served")
            except openai.NotFoundError as exc:
                assert exc.status_code == 404
        assert list(theirs.batches.list()) == [] and list(theirs.files.list()) == []
        assert [f.id for f in mine.files.list()].count(file_id) == 1
        # Paged as the SDK pages: every file once, in either order.
        newest = [f.id for f in mine.files.list(limit=1)]  # auto-paging through `after`
        oldest = [f.id for f in mine.files.list(limit=1, order="asc")]
        assert len(newest) == 2 and newest == oldest[::-1] and file_id in newest
        with httpx.Client(base_url=gw.url) as c:
            assert c.get("/admin/batches", headers={"authorization": f"Bearer {EVAL_KEY}"}).status_code == 401
            admin = c.get("/admin/batches", headers={"authorization": f"Bearer {ADMIN_KEY}"}).json()
            assert [(b["id"], b["owner"]) for b in admin["data"]] == [(made.id, "eval")]
            assert c.get("/v1/batches").status_code == 401
        assert mine.files.delete(file_id).deleted
        try:
            mine.files.retrieve(file_id)
            raise AssertionError("a deleted file was served")
        except openai.NotFoundError:
            pass


def test_without_a_ledger_the_batch_api_says_it_needs_one(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("providers:\n  demo: {kind: fake, models: [text]}\n")
    with GatewayThread(path, {}) as gw:
        client = sdk(gw.url, "anything")
        try:
            client.batches.list()
            raise AssertionError("served without a ledger")
        except openai.NotFoundError as exc:
            assert "ledger" in exc.message


def test_a_budget_exhausted_mid_batch_fails_it_keeping_what_ran(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    text = config(f"sqlite:///{tmp_path / 'ledger.db'}", concurrency=1)
    text = text.replace(
        '  - {name: eval, key: "${BATCH_EVAL_KEY}"}',
        '  - {name: eval, key: "${BATCH_EVAL_KEY}", max_cost_per_day: 2.0}',
    )
    path.write_text(text + "prices:\n  demo/text: {prompt_per_1m: 0, completion_per_1m: 100000}\n")
    lines = [line(f"b-{i}", prompt=f"p {i}") for i in range(20)]  # 5 tokens each: $0.50 a line
    with GatewayThread(path, ENV) as gw:
        client = sdk(gw.url, EVAL_KEY)
        made = client.batches.create(
            input_file_id=upload(client, jsonl(lines)), endpoint="/v1/completions", completion_window="24h"
        )
        batch = wait_batch(client, made.id)
        assert batch.status == "failed" and batch.failed_at is not None
        assert batch.errors is not None and "budget" in (batch.errors.data[0].message or "")
        out, err = results(client, batch.output_file_id), results(client, batch.error_file_id)
    assert 1 <= len(out) <= 4
    assert [o["custom_id"] for o in out] == [f"b-{i}" for i in range(len(out))]
    assert sorted(o["custom_id"] for o in out + err) == sorted(x["custom_id"] for x in lines)
    refused = [e for e in err if e["response"] is not None]
    assert [e["response"]["body"]["error"]["code"] for e in refused] == ["budget_exceeded"]
    assert {e["error"]["code"] for e in err if e["response"] is None} == {"batch_failed"}


def test_files_are_bounded_and_old_ones_deleted(tmp_path: Path) -> None:
    with served(tmp_path, extra=", max_files: 3, retain_days: 1") as (_, client):
        batch = wait_batch(client, start(client, [line("old-1")]))  # its input and output: two files
        kept = upload(client, jsonl([line("new-1")]))
        try:
            upload(client, jsonl([line("one-too-many")]))
            raise AssertionError("a fourth file was stored")
        except openai.ConflictError as exc:
            assert exc.status_code == 409 and "batches.max_files" in exc.message
    # Two days pass for the first batch and its files (the clock of the rows, as an operator would move it).
    with opened(tmp_path / "ledger.db") as conn:
        conn.execute("UPDATE batches SET created_at = created_at - 2 * 86400")
        conn.execute("UPDATE batch_files SET created_at = created_at - 2 * 86400 WHERE id <> ?", (kept,))
    with served(tmp_path, extra=", max_files: 3, retain_days: 1") as (_, client):
        deadline = time.monotonic() + 10
        while True:  # retention runs at the runner's first turn
            try:
                client.batches.retrieve(batch.id)
            except openai.NotFoundError:
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert [f.id for f in client.files.list()] == [kept]
        with opened(tmp_path / "ledger.db") as conn:
            assert conn.execute("SELECT count(*) FROM batch_lines").fetchone() == (0,)


def test_batches_not_ended_are_bounded_per_key(tmp_path: Path) -> None:
    # Each batch copies its file's lines: one file cannot seed batches without end.
    with served(tmp_path, extra=", max_batches: 2") as (gw, client):
        file_id = upload(client, jsonl([line(f"b-{i}", model="slower") for i in range(3)]))
        made = [client.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h")]
        made.append(client.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h"))
        try:
            client.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h")
            raise AssertionError("a third batch was made")
        except openai.ConflictError as exc:
            assert exc.status_code == 409 and exc.code == "too_many_batches" and "batches.max_batches" in exc.message
        other = sdk(gw.url, OTHER_KEY)  # another key's own count
        start(other, [line("o-1")])
        client.batches.cancel(made[0].id)
        wait_batch(client, made[0].id)
        third = client.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h")
        assert third.status == "validating"


def test_lines_are_seen_in_the_access_log_and_the_metrics(tmp_path: Path) -> None:
    lines = [line(f"m-{i}") for i in range(6)] + [line("m-bad", model="nope/nothing")]
    with listening() as log, served(tmp_path, more="") as (gw, client):
        gw.pipeline.log_requests = True  # the suite's config turns the access log off; this test reads it
        batch = wait_batch(client, start(client, lines))
        with httpx.Client(base_url=gw.url) as c:
            text = c.get("/metrics").text
    entries = [e for e in log.lines if e.get("batch_id") == batch.id]
    assert len(entries) == 7 and sorted(e["status"] for e in entries) == [200] * 6 + [404]
    assert all(e["request_id"].startswith("batch_req_") and e["key"] == "eval" for e in entries)
    assert 'gateway_batch_lines_total{status="completed"} 6.0' in text
    assert 'gateway_batch_lines_total{status="failed"} 1.0' in text
    assert "gateway_batch_lines_in_flight 0.0" in text


def test_a_reload_applies_to_the_batches_running(tmp_path: Path) -> None:
    lines = [line(f"r-{i}", model="slower", prompt=f"p {i}") for i in range(30)]  # 400 ms each
    path = tmp_path / "config.yaml"
    path.write_text(config(f"sqlite:///{tmp_path / 'ledger.db'}", concurrency=1))
    gw = GatewayProcess(path, cli_env(**ENV))
    try:
        gw.wait_ready()
        client = sdk(gw.url, EVAL_KEY)
        made_id = start(client, lines)
        wait_batch(client, made_id, lambda b: b.request_counts is not None and b.request_counts.completed >= 2)
        path.write_text(config(f"sqlite:///{tmp_path / 'ledger.db'}", concurrency=10))
        gw.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "config reloaded (SIGHUP)" in gw.log.read_text(), timeout=5)
        reloaded = time.monotonic()
        batch = wait_batch(client, made_id)
    finally:
        gw.stop()
    # One at a time the lines left would take 11 s; ten at a time, about one.
    assert batch.status == "completed" and time.monotonic() - reloaded < 5


def test_a_file_of_several_megabytes_is_stored_whole_and_lines_meet_the_body_cap(tmp_path: Path) -> None:
    big = "word " * 200_000  # one line of about a megabyte: over the cap set below
    lines = [line(f"w-{i}", prompt=f"{i} " + "filler " * 150) for i in range(3000)] + [line("huge", prompt=big)]
    data = jsonl(lines)
    assert len(data) > 3 * 1024 * 1024  # stored in several chunks
    more = "caps: {request_body_bytes: 524288}"
    with served(tmp_path, more=more) as (_, client):
        file_id = upload(client, data)
        assert client.files.retrieve(file_id).bytes == len(data)
        assert client.files.content(file_id).content == data
        batch = wait_batch(client, start(client, lines))
        err = results(client, batch.error_file_id)
    assert batch.status == "completed" and batch.request_counts.completed == 3000
    assert [(e["custom_id"], e["response"]["status_code"]) for e in err] == [("huge", 413)]
    assert err[0]["response"]["body"]["error"]["code"] == "request_too_large"


def test_batches_are_listed_newest_first_page_by_page(tmp_path: Path) -> None:
    with served(tmp_path) as (gw, client):
        other = sdk(gw.url, OTHER_KEY)
        made = [start(client, [line(f"l-{i}")]) for i in range(3)]
        theirs = start(other, [line("theirs")])  # between two of eval's, in time and in id
        their_file = other.files.list().data[0].id
        made += [start(client, [line(f"l-{i}")]) for i in range(3, 5)]
        first = client.batches.list(limit=2)
        paged = [b.id for b in client.batches.list(limit=2)]  # the SDK follows `after` from page to page
        with httpx.Client(base_url=gw.url, headers={"authorization": f"Bearer {EVAL_KEY}"}) as c:
            tail = c.get("/v1/batches", params={"limit": 2, "after": made[1]}).json()
            too_many = c.get("/v1/batches", params={"limit": 101})
            # A number `int()` does not read ("²", more than 4,300 digits): refused like any other bad limit.
            odd = [
                c.get(route, params={"limit": limit})
                for route in ("/v1/batches", "/v1/files")
                for limit in ("\u00b2", "1" * 5000)
            ]
            # Another key's id is a cursor that does not exist: the page is the first, as for a made-up id.
            for path, cursor in (("/v1/batches", theirs), ("/v1/files", their_file)):
                unknown = c.get(path, params={"after": "batch_0000000000000000000000"}).json()
                assert c.get(path, params={"after": cursor}).json()["data"] == unknown["data"], path
    assert first.has_more and [b.id for b in first.data] == made[::-1][:2]
    assert paged == made[::-1] and theirs not in paged
    assert [b["id"] for b in tail["data"]] == [made[0]] and tail["has_more"] is False
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "limit"
    assert [(r.status_code, r.json()["error"]["param"]) for r in odd] == [(400, "limit")] * 4


FILE_PART = b'--x\r\ncontent-disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n{}\r\n'


@pytest.mark.parametrize(
    "fields",
    [
        b'--x\r\ncontent-disposition: form-data; name="purpose"\r\n\r\n\xff\r\n',
        b'--x\r\ncontent-disposition: form-data; name="purpose"\r\ncontent-type: text/plain; charset=no-such-codec'
        b"\r\n\r\nbatch\r\n",
        b'--x\r\ncontent-disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--x\r\ncontent-disposition: form-data; name="zzz"\r\n\r\n\xc3\x28\r\n',
        # idna and punycode fail with a bare UnicodeError, not a decode error.
        b'--x\r\ncontent-disposition: form-data; name="purpose"\r\ncontent-type: text/plain; charset=idna'
        b"\r\n\r\nxn--\r\n",
        b'--x\r\ncontent-disposition: form-data; name="purpose"\r\ncontent-type: text/plain; charset=base64'
        b"\r\n\r\nYmF0Y2g=\r\n",
    ],
    ids=["purpose-not-utf8", "unknown-charset", "other-field-not-utf8", "idna-not-text", "not-a-text-codec"],
)
def test_an_upload_whose_text_field_is_not_text_is_a_400_naming_it(tmp_path: Path, fields: bytes) -> None:
    with served(tmp_path) as (gw, _):
        resp = httpx.post(
            gw.url + "/v1/files",
            headers={"authorization": f"Bearer {EVAL_KEY}", "content-type": "multipart/form-data; boundary=x"},
            content=FILE_PART + fields + b"--x--\r\n",
            timeout=10,
        )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and "not text" in error["message"]
    assert error["param"] == ("zzz" if b'"zzz"' in fields else "purpose")


def test_an_upload_past_the_file_cap_stops_at_the_cap_and_bad_forms_are_400s(tmp_path: Path) -> None:
    with served(tmp_path, extra=", max_file_bytes: 1024") as (gw, _):
        auth = {"authorization": f"Bearer {EVAL_KEY}"}
        big = b'--x\r\ncontent-disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n' + b"x" * 4096
        form = {**auth, "content-type": "multipart/form-data; boundary=x"}
        resp = httpx.post(gw.url + "/v1/files", headers=form, content=big + b"\r\n--x--\r\n", timeout=10)
        assert resp.status_code == 413 and resp.json()["error"]["code"] == "file_too_large", resp.text
        for headers, body in [
            ({**auth, "content-type": "application/json"}, b"{}"),  # not a form
            ({**auth, "content-type": "multipart/form-data"}, FILE_PART + b"--x--\r\n"),  # no boundary
            (form, FILE_PART),  # cut short
            (form, b'--x\r\ncontent-disposition: form-data; name="purpose"\r\n\r\n' + b"b" * 5000 + b"\r\n--x--\r\n"),
        ]:
            resp = httpx.post(gw.url + "/v1/files", headers=headers, content=body, timeout=10)
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["type"] == "invalid_request_error"
