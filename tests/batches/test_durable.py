"""A batch survives its gateway: SIGKILLed mid-run three times, `python -m gateway serve` resumes it at start-up
(without waiting for the dead process's lease) and every custom_id is answered exactly once; a line booked is
never sent again."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from tests.helpers.servers import GatewayChild, cli_env

from .conftest import ENV, EVAL_KEY, config, jsonl, line, results, sdk, upload, wait_batch


def _progress(db: Path, batch_id: str) -> tuple[str, int]:
    with sqlite3.connect(db, timeout=10) as conn:
        row = conn.execute("SELECT status, completed FROM batches WHERE id = ?", (batch_id,)).fetchone()
    return (str(row[0]), int(row[1])) if row else ("", 0)


def test_sigkill_three_times_then_exactly_once(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    path = tmp_path / "config.yaml"
    concurrency = 4
    # A lease far longer than the test: the restarted gateway resumes because the holder's process is gone.
    path.write_text(config(f"sqlite:///{db}", lease_ms=600_000, concurrency=concurrency))
    lines = [line(f"k-{i}", model="slow", prompt=f"prompt number {i}") for i in range(160)]
    gw = GatewayChild(path, env=cli_env(**ENV))
    kills = 0
    try:
        gw.wait_ready()
        client = sdk(gw.url, EVAL_KEY)
        made = client.batches.create(
            input_file_id=upload(client, jsonl(lines)), endpoint="/v1/completions", completion_window="24h"
        )
        for threshold in (15, 55, 100):
            deadline = time.monotonic() + 60
            while _progress(db, made.id)[1] < threshold:
                assert time.monotonic() < deadline, _progress(db, made.id)
                time.sleep(0.02)
            gw.stop()  # SIGKILL
            kills += 1
            assert _progress(db, made.id)[0] == "in_progress"
            gw = GatewayChild(path, env=cli_env(**ENV))
            gw.wait_ready()
        client = sdk(gw.url, EVAL_KEY)
        batch = wait_batch(client, made.id)
        assert batch.status == "completed"
        out, err = results(client, batch.output_file_id), results(client, batch.error_file_id)
    finally:
        gw.stop()
    assert err == []
    assert [o["custom_id"] for o in out] == [x["custom_id"] for x in lines]  # each once, in the file's order
    assert all(o["response"]["status_code"] == 200 for o in out)
    with sqlite3.connect(db) as conn:
        sends = [r[0] for r in conn.execute("SELECT sends FROM batch_lines WHERE batch_id = ?", (made.id,))]
    # A line is sent again only when it was in flight at a kill: at most `concurrency` lines per kill, once each.
    assert all(1 <= s <= 1 + kills for s in sends)
    assert len(sends) < sum(sends) <= len(sends) + kills * concurrency


def test_sigterm_hands_the_batch_back_for_the_next_gateway(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    path = tmp_path / "config.yaml"
    path.write_text(config(f"sqlite:///{db}", lease_ms=600_000, concurrency=4))
    lines = [line(f"t-{i}", model="slow", prompt=f"prompt {i}") for i in range(80)]
    gw = GatewayChild(path, env=cli_env(**ENV))
    try:
        gw.wait_ready()
        client = sdk(gw.url, EVAL_KEY)
        made = client.batches.create(
            input_file_id=upload(client, jsonl(lines)), endpoint="/v1/completions", completion_window="24h"
        )
        deadline = time.monotonic() + 60
        while _progress(db, made.id)[1] < 20:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        gw.sigterm()
        gw.proc.wait(20)
        gw.stop()  # closes its log
        with sqlite3.connect(db) as conn:
            until, sent = conn.execute(
                "SELECT lease_until, (SELECT count(*) FROM batch_lines WHERE batch_id = ? AND sends > 0 "
                "AND result IS NULL) FROM batches WHERE id = ?",
                (made.id, made.id),
            ).fetchone()
        assert until == 0  # handed back: no process waits for the lease to run out
        assert sent <= 4  # only lines in flight at the signal are unanswered: every answer that came is booked
        gw = GatewayChild(path, env=cli_env(**ENV))
        gw.wait_ready()
        batch = wait_batch(sdk(gw.url, EVAL_KEY), made.id)
        out = results(sdk(gw.url, EVAL_KEY), batch.output_file_id)
    finally:
        gw.stop()
    assert batch.status == "completed" and [o["custom_id"] for o in out] == [x["custom_id"] for x in lines]


def test_two_workers_each_line_sent_once(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    path = tmp_path / "config.yaml"
    path.write_text(config(f"sqlite:///{db}", concurrency=4, more="server: {workers: 2}"))
    gw = GatewayChild(path, env=cli_env(**ENV))
    try:
        gw.wait_ready()
        client = sdk(gw.url, EVAL_KEY)
        made = [
            client.batches.create(
                input_file_id=upload(
                    client, jsonl([line(f"{b}-{i}", model="slow", prompt=f"{b} {i}") for i in range(40)])
                ),
                endpoint="/v1/completions",
                completion_window="24h",
            ).id
            for b in "ab"
        ]
        batches = [wait_batch(client, m) for m in made]
        outs = [results(client, b.output_file_id) for b in batches]
    finally:
        gw.stop()
    for b, out in zip("ab", outs, strict=True):
        assert [o["custom_id"] for o in out] == [f"{b}-{i}" for i in range(40)]
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT max(sends) FROM batch_lines").fetchone() == (1,)
