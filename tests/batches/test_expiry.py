"""Files that expire (`expires_after`, a batch's `output_expires_after`), as the unmodified `openai` SDK asks
for them, over a real socket, on a real SQLite file."""

from __future__ import annotations

import io
import sqlite3
from pathlib import Path

import httpx
import openai
import psycopg
import pytest

from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import GatewayThread
from tests.helpers.sqlite import opened
from tests.helpers.waiting import wait_until

from .conftest import ENV, EVAL_KEY, config, jsonl, line, results, sdk, served, start, upload, wait_batch

HOUR = 3600


def _upload_expiring(client: openai.OpenAI, seconds: int) -> openai.types.FileObject:
    return client.files.create(
        file=("input.jsonl", io.BytesIO(jsonl([line("e-1")]))),
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": seconds},
    )


def test_an_uploaded_file_carries_its_expiry_and_is_gone_once_past_it(tmp_path: Path) -> None:
    with served(tmp_path, extra=", max_files: 2") as (_, client):
        made = _upload_expiring(client, 2 * HOUR)
        assert made.expires_at == made.created_at + 2 * HOUR
        assert client.files.retrieve(made.id).expires_at == made.expires_at
        assert [f.expires_at for f in client.files.list()] == [made.expires_at]
        plain = upload(client, jsonl([line("p-1")]))
        assert client.files.retrieve(plain).expires_at is None  # none asked: kept for `retain_days`
        with opened(tmp_path / "ledger.db") as conn:  # its two hours pass
            conn.execute("UPDATE batch_files SET expires_at = expires_at - 3 * 3600 WHERE id = ?", (made.id,))
        for gone in (
            lambda: client.files.retrieve(made.id),
            lambda: client.files.content(made.id),
            lambda: client.files.delete(made.id),
            lambda: client.batches.create(input_file_id=made.id, endpoint="/v1/completions", completion_window="24h"),
        ):
            with pytest.raises(openai.NotFoundError):
                gone()
        assert [f.id for f in client.files.list()] == [plain]
        assert [f.id for f in client.files.list(purpose="batch")] == [plain]
        # It no longer counts against `max_files` (2): the next upload takes its place and deletes its rows.
        again = upload(client, jsonl([line("a-1")]))
        assert sorted(f.id for f in client.files.list()) == sorted([plain, again])
    with opened(tmp_path / "ledger.db") as conn:
        assert conn.execute("SELECT count(*) FROM batch_files WHERE id = ?", (made.id,)).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM batch_file_chunks WHERE file_id = ?", (made.id,)).fetchone() == (0,)


def _files(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT id FROM batch_files").fetchall()}


def test_the_sweep_deletes_expired_files_but_keeps_one_a_running_batch_reads(tmp_path: Path) -> None:
    with served(tmp_path) as (_, client):
        idle = _upload_expiring(client, HOUR).id
        read = _upload_expiring(client, HOUR).id
        running = client.batches.create(input_file_id=read, endpoint="/v1/completions", completion_window="24h")
    with opened(tmp_path / "ledger.db") as conn:
        conn.execute("UPDATE batch_files SET expires_at = expires_at - 2 * 3600")
        # The batch is held as running (a runner of another process would have it) while the sweep runs.
        conn.execute("UPDATE batches SET status = 'in_progress', lease_owner = 'elsewhere', lease_until = 1e12")
    with served(tmp_path) as (_, client), opened(tmp_path / "ledger.db") as conn:
        # The runner sweeps at its first turn: the idle file goes, the running batch's input stays.
        wait_until(lambda: idle not in _files(conn), timeout=10)
        assert read in _files(conn)  # beside the output file the batch made before the restart
        assert client.batches.retrieve(running.id).status == "in_progress"


def test_a_batch_gives_its_result_files_the_expiry_it_was_asked_for(tmp_path: Path) -> None:
    with served(tmp_path) as (_, client):
        file_id = upload(client, jsonl([line("r-1"), line("r-2", model="nope/nothing")]))
        made = client.batches.create(
            input_file_id=file_id,
            endpoint="/v1/completions",
            completion_window="24h",
            output_expires_after={"anchor": "created_at", "seconds": 5 * HOUR},
        )
        batch = wait_batch(client, made.id)
        assert batch.status == "completed" and batch.output_file_id and batch.error_file_id
        for result in (batch.output_file_id, batch.error_file_id):
            got = client.files.retrieve(result)
            assert got.expires_at == got.created_at + 5 * HOUR or got.expires_at == got.created_at + 5 * HOUR + 1
        plain = wait_batch(
            client,
            client.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h").id,
        )
        assert client.files.retrieve(plain.output_file_id).expires_at is None


def test_an_expiry_longer_than_retention_is_retentions(tmp_path: Path) -> None:
    with served(tmp_path, extra=", retain_days: 1") as (_, client):
        made = _upload_expiring(client, 30 * 86_400)
        assert made.expires_at == made.created_at + 86_400


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"expires_after[anchor]": "last_active_at", "expires_after[seconds]": "3600"}, "expires_after.anchor"),
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "60"}, "expires_after.seconds"),
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": str(31 * 86_400)}, "expires_after.seconds"),
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "1e4"}, "expires_after.seconds"),
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "٣٦٠٠"}, "expires_after.seconds"),
        ({"expires_after[anchor]": "created_at"}, "expires_after.seconds"),
        ({"expires_after[seconds]": "3600"}, "expires_after.anchor"),
        ({"expires_after": "3600"}, "expires_after.anchor"),
    ],
)
def test_a_bad_expires_after_is_a_400_naming_the_field(tmp_path: Path, fields: dict[str, str], param: str) -> None:
    with served(tmp_path) as (gw, client):
        with httpx.Client(base_url=gw.url, headers={"authorization": f"Bearer {EVAL_KEY}"}) as c:
            got = c.post(
                "/v1/files",
                data={"purpose": "batch", **fields},
                files={"file": ("input.jsonl", jsonl([line("b-1")]))},
            )
        assert got.status_code == 400, got.text
        assert got.json()["error"]["param"] == param
        assert client.files.list().data == []


@pytest.mark.parametrize(
    ("expiry", "param"),
    [
        ({"anchor": "completed_at", "seconds": 3600}, "output_expires_after.anchor"),
        ({"anchor": "created_at", "seconds": 3599}, "output_expires_after.seconds"),
        ({"anchor": "created_at", "seconds": 3600.5}, "output_expires_after.seconds"),
    ],
)
def test_a_bad_output_expires_after_is_a_400_naming_the_field(
    tmp_path: Path, expiry: dict[str, object], param: str
) -> None:
    with served(tmp_path) as (_, client):
        file_id = upload(client, jsonl([line("o-1")]))
        with pytest.raises(openai.BadRequestError) as err:
            client.batches.create(
                input_file_id=file_id,
                endpoint="/v1/completions",
                completion_window="24h",
                output_expires_after=expiry,  # type: ignore[arg-type]
            )
        assert err.value.status_code == 400
        assert isinstance(err.value.body, dict) and err.value.body.get("param") == param, err.value.body
        assert client.batches.list().data == []


def test_expiry_on_postgresql(tmp_path: Path, pg: PostgresServer) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config(pg.url, extra=", max_files: 3"))
    with GatewayThread(path, ENV) as gw:
        client = sdk(gw.url, EVAL_KEY)
        made = _upload_expiring(client, HOUR)
        assert made.expires_at == made.created_at + HOUR
        batch = wait_batch(
            client,
            client.batches.create(
                input_file_id=upload(client, jsonl([line("g-1")])),
                endpoint="/v1/completions",
                completion_window="24h",
                output_expires_after={"anchor": "created_at", "seconds": 2 * HOUR},
            ).id,
        )
        assert batch.output_file_id is not None
        out = client.files.retrieve(batch.output_file_id)
        assert out.expires_at in (out.created_at + 2 * HOUR, out.created_at + 2 * HOUR + 1)
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("UPDATE batch_files SET expires_at = expires_at - 3 * 3600 WHERE id = %s", (made.id,))
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(made.id)
        assert made.id not in [f.id for f in client.files.list()]
        upload(client, jsonl([line("g-2")]))  # three files held: the expired one no longer counts
        with psycopg.connect(pg.url, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM batch_files WHERE id = %s", (made.id,)).fetchone() == (0,)


def test_deleting_the_input_of_a_batch_waiting_for_a_runner_keeps_its_lines_until_it_ends(tmp_path: Path) -> None:
    with served(tmp_path, concurrency=4, extra=", max_files: 5") as (_, client):
        busy = [start(client, [line(f"{b}-{i}", model="slower") for i in range(8)]) for b in range(4)]
        file_id = upload(client, jsonl([line("x-1"), line("x-2")]))
        made = client.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h")
        assert client.batches.retrieve(made.id).status == "validating"  # every runner slot is busy
        assert client.files.delete(file_id).deleted
        # Gone to its key at once, and no longer counted against `max_files`.
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(file_id)
        assert file_id not in [f.id for f in client.files.list()]
        spare = upload(client, jsonl([line("y-1")]))
        for b in busy:
            client.batches.cancel(b)
        batch = wait_batch(client, made.id)
        assert batch.status == "completed", (batch.status, batch.errors)
        assert sorted(r["custom_id"] for r in results(client, batch.output_file_id)) == ["x-1", "x-2"]
        with opened(tmp_path / "ledger.db") as conn:  # its rows went when the batch ended
            assert file_id not in _files(conn) and spare in _files(conn)
            assert conn.execute("SELECT count(*) FROM batch_file_chunks WHERE file_id = ?", (file_id,)).fetchone() == (
                0,
            )
