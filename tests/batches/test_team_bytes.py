"""A team's keys keep their uploads under one cap together (`teams.<name>.max_batch_bytes`), on top of each
key's own (`batches.max_key_bytes`): a team admin making more keys gets no more of the ledger's disk. Two keys
of a team, each under its own cap, are refused together past the team's with a 409 naming it; a key of another
team is not; deleting a file makes room again. The team's file count (`max_batch_files`) is held the same way.
On SQLite and on PostgreSQL."""

from __future__ import annotations

import io
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import GatewayThread

from .conftest import ADMIN_KEY, ENV, EVAL_KEY, OTHER_KEY, config, jsonl, line, sdk, upload, written

KEY_CAP = 3000
TEAM_CAP = 3000
ROUNDS = 40


def _config(tmp_path: Path, url: str, team: str, key_cap: int = KEY_CAP) -> Path:
    """The suite's config on the ledger `url`: the eval key in the team `evals` (whose caps are `team`, YAML
    flow), the other key in the team `others` (the defaults)."""
    text = config(
        url,
        extra=f", max_key_bytes: {key_cap}",
        more=f"teams: {{evals: {{{team}}}, others: {{}}}}",
    )
    text = text.replace('key: "${BATCH_EVAL_KEY}"', 'key: "${BATCH_EVAL_KEY}", team: evals')
    text = text.replace('key: "${BATCH_OTHER_KEY}"', 'key: "${BATCH_OTHER_KEY}", team: others')
    return written(tmp_path, text)


def _team_key(gw: GatewayThread) -> openai.OpenAI:
    """A runtime key of the team `evals`, made by the operator: the SDK as it."""
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    made = httpx.post(gw.url + "/admin/keys", json={"name": "second", "team": "evals"}, headers=headers)
    assert made.status_code == 201, made.text
    return sdk(gw.url, made.json()["secret"])


def _refused(client: openai.OpenAI, data: bytes) -> dict[str, object]:
    with pytest.raises(openai.ConflictError) as refused:
        client.files.create(file=("over.jsonl", io.BytesIO(data)), purpose="batch")
    body = refused.value.body
    assert isinstance(body, dict)
    return body


def test_a_teams_keys_uploads_past_the_teams_bytes_are_refused(tmp_path: Path, url: str) -> None:
    data = jsonl([line(f"k-{i}", prompt="x" * 200) for i in range(4)])
    assert TEAM_CAP // 3 < len(data) < TEAM_CAP // 2 and 2 * len(data) < KEY_CAP
    with GatewayThread(_config(tmp_path, url, f"max_batch_bytes: {TEAM_CAP}"), ENV) as gw:
        eval_key, other_key = sdk(gw.url, EVAL_KEY), sdk(gw.url, OTHER_KEY)
        first = upload(eval_key, data)
        upload(eval_key, data)
        # A key of another team: its team's cap and its own are its own.
        kept = [upload(other_key, data), upload(other_key, data)]
        # A runtime key of the team: under its own cap, over the team's with the eval key's files.
        second = _team_key(gw)
        body = _refused(second, data)
        eval_key.files.delete(first)
        third = upload(second, data)
        listed = [f.id for f in second.files.list()]
    assert body["code"] == "too_many_bytes" and body["param"] == "file", body
    assert "teams.evals.max_batch_bytes" in str(body["message"]) and str(TEAM_CAP) in str(body["message"]), body
    assert listed == [third] and len(set(kept)) == 2


def test_a_teams_keys_files_past_the_teams_count_are_refused(tmp_path: Path, url: str) -> None:
    data = jsonl([line("k-0")])
    with GatewayThread(_config(tmp_path, url, "max_batch_files: 2"), ENV) as gw:
        eval_key, other_key = sdk(gw.url, EVAL_KEY), sdk(gw.url, OTHER_KEY)
        first = upload(eval_key, data)
        second = _team_key(gw)
        upload(second, data)
        body = _refused(second, data)
        assert [upload(other_key, data) for _ in range(3)]
        eval_key.files.delete(first)
        upload(second, data)
    assert body["code"] == "too_many_files", body
    assert "teams.evals.max_batch_files" in str(body["message"]), body


def test_two_replicas_uploading_at_once_for_one_team_never_pass_its_cap_together(
    tmp_path: Path, pg: PostgresServer
) -> None:
    """Two keys of the team on two replicas upload at the same moment, again and again, with room for one of
    them: one is stored and the other refused each time, never both (each replica counts its own upload and
    the other's, stored a moment before or after, never neither)."""
    data = jsonl([line(f"k-{i}", prompt="x" * 200) for i in range(4)])
    path = _config(tmp_path, pg.url, f"max_batch_bytes: {len(data) * 3 // 2}", key_cap=1 << 20)
    with GatewayThread(path, ENV) as one, GatewayThread(path, ENV) as two:
        clients = [sdk(one.url, EVAL_KEY), _team_key(two)]
        stored: list[list[str]] = []
        with ThreadPoolExecutor(2) as pool:
            for _ in range(ROUNDS):
                gate = threading.Barrier(2)

                def send(client: openai.OpenAI, gate: threading.Barrier = gate) -> str | None:
                    gate.wait()
                    try:
                        return upload(client, data)
                    except openai.ConflictError:
                        return None

                made = list(pool.map(send, clients))
                stored.append([f for f in made if f is not None])
                for client, file_id in zip(clients, made, strict=True):
                    if file_id is not None:
                        client.files.delete(file_id)
    assert [len(s) for s in stored] == [1] * ROUNDS
