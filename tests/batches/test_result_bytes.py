"""A batch's output and error files count toward the bytes a key keeps (`batches.max_key_bytes`) and its team
keeps (`teams.<name>.max_batch_bytes`), as uploads do: without it, batches of short lines with long answers
would fill the ledger's disk, which every tenant shares, however low the caps. A batch is never cut for it (its
results are stored whole, past the cap): the next upload is refused with a 409 until files are deleted, and
deleting a result file makes room at once. On SQLite and on PostgreSQL."""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import openai
import pytest

from tests.helpers.servers import GatewayThread

from .conftest import ADMIN_KEY, ENV, EVAL_KEY, config, jsonl, line, results, sdk, start, wait_batch, written

CAP = 2048
ANSWERED = 8


def _config(tmp_path: Path, url: str, scope: str) -> Path:
    """The suite's config on `url`, the eval key in the team `evals`; CAP bytes for the key (`scope` "key") or
    for the team ("team", each key's own cap well above it)."""
    key_cap, team_cap = (CAP, 1 << 20) if scope == "key" else (1 << 20, CAP)
    text = config(url, extra=f", max_key_bytes: {key_cap}", more=f"teams: {{evals: {{max_batch_bytes: {team_cap}}}}}")
    return written(tmp_path, text.replace('key: "${BATCH_EVAL_KEY}"', 'key: "${BATCH_EVAL_KEY}", team: evals'))


def _uploader(gw: GatewayThread, scope: str) -> openai.OpenAI:
    """Who uploads after the batch: the batch's own key, or another key of its team (a runtime key)."""
    if scope == "key":
        return sdk(gw.url, EVAL_KEY)
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    made = httpx.post(gw.url + "/admin/keys", json={"name": "second", "team": "evals"}, headers=headers)
    assert made.status_code == 201, made.text
    return sdk(gw.url, made.json()["secret"])


def _sized(size: int) -> bytes:
    """One batch line of exactly `size` bytes."""
    data = jsonl([line("pad", prompt="")])
    assert size >= len(data), size
    return jsonl([line("pad", prompt="x" * (size - len(data)))])


def _refused(client: openai.OpenAI, size: int) -> str:
    """The message of the 409 `too_many_bytes` refusing an upload of `size` bytes."""
    with pytest.raises(openai.ConflictError) as refused:
        client.files.create(file=("over.jsonl", io.BytesIO(_sized(size))), purpose="batch")
    body = refused.value.body
    assert isinstance(body, dict) and body["code"] == "too_many_bytes" and body["param"] == "file", body
    return str(body["message"])


@pytest.mark.parametrize("scope", ["key", "team"])
def test_a_batchs_results_count_toward_the_bytes_held(tmp_path: Path, url: str, scope: str) -> None:
    lines = [line(f"r-{i}", max_tokens=16) for i in range(ANSWERED)] + [line("r-bad", model="nope/nothing")]
    inputs = len(jsonl(lines))
    with GatewayThread(_config(tmp_path, url, scope), ENV) as gw:
        owner = sdk(gw.url, EVAL_KEY)
        batch = wait_batch(owner, start(owner, lines))
        assert batch.output_file_id is not None and batch.error_file_id is not None
        out, err = owner.files.retrieve(batch.output_file_id), owner.files.retrieve(batch.error_file_id)
        # The answers are stored whole though they pass the cap: it refuses new uploads, never a batch's results.
        answers = results(owner, out.id)
        assert out.bytes > CAP and out.bytes == len(owner.files.content(out.id).content)
        assert err.bytes == len(owner.files.content(err.id).content)
        # Room left by the input and the error file: an upload this size fits were the answers not counted.
        room = CAP - inputs - err.bytes
        uploader = _uploader(gw, scope)
        message = _refused(uploader, room)
        assert owner.files.delete(out.id).deleted
        # Gone to its key, though the batch still names it.
        with pytest.raises(openai.NotFoundError):
            owner.files.content(out.id)
        assert owner.batches.retrieve(batch.id).output_file_id == out.id
        # The error file still counts, to the byte.
        _refused(uploader, room + 1)
        stored = uploader.files.create(file=("fits.jsonl", io.BytesIO(_sized(room))), purpose="batch")
    assert batch.status == "completed" and len(answers) == ANSWERED
    assert batch.request_counts is not None and batch.request_counts.failed == 1
    setting = "batches.max_key_bytes" if scope == "key" else "teams.evals.max_batch_bytes"
    assert setting in message and str(CAP) in message, message
    assert stored.bytes == room
