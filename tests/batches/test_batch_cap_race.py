"""A key's cap on batches not ended (`batches.max_batches`) holds when it makes batches on two replicas at the
same moment (PostgreSQL): each replica counts the other's batch, made a moment before or after, never neither.

The replicas are two processes, as in production: two gateways in one process would take each other's batch
leases for a dead process's (a lease of this pid under another name)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import GatewayChild, cli_env

from .conftest import ENV, config, jsonl, line

MAX_BATCHES = 2
ROUNDS = 60
PER_REPLICA = 4
# One line far slower than the test: no batch ends in the test (one that did would make room, and a batch
# over the count would be allowed, not raced in).
STALLED = "slow-120000ms"


def _keys() -> dict[str, str]:
    """A key of its own for each round, its variable: its secret. A round starts with none of its batches,
    and nothing needs ending between rounds."""
    return {f"BATCH_RACE_KEY_{i}": f"gk-batches-race-{i}-4d7e" for i in range(ROUNDS)}


def _config(url: str) -> str:
    text = config(url, concurrency=2, extra=f", max_batches: {MAX_BATCHES}")
    for old, new in [
        ("slow-400ms]", f"slow-400ms, {STALLED}]"),
        ("keys:\n", "keys:\n" + "".join(f'  - {{name: race-{i}, key: "${{{v}}}"}}\n' for i, v in enumerate(_keys()))),
    ]:
        assert old in text
        text = text.replace(old, new, 1)
    return text


def _make(http: httpx.Client, key: str, file_id: str) -> httpx.Response:
    body = {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"}
    return http.post("/v1/batches", json=body, headers={"authorization": f"Bearer {key}"})


def _at_once(clients: list[httpx.Client], key: str, file_id: str) -> list[httpx.Response]:
    """A batch made on each client (replica) at the same moment."""
    gate = threading.Barrier(len(clients))

    def send(http: httpx.Client) -> httpx.Response:
        gate.wait()
        return _make(http, key, file_id)

    with ThreadPoolExecutor(len(clients)) as pool:
        return list(pool.map(send, clients))


def _round(clients: list[httpx.Client], key: str) -> tuple[int, list[str], int]:
    """Upload, make one batch, so one more fits, then batches on both replicas at once: how many were made,
    the codes of those refused, and the key's batches not ended. A replica adds batches one after another (its
    store has one thread), so only the two replicas' first adds race: with the key one short of its cap, that
    race is the one that decides."""
    auth = {"authorization": f"Bearer {key}"}
    uploaded = clients[0].post(
        "/v1/files",
        files={"file": ("in.jsonl", jsonl([line("stalled", model=f"demo/{STALLED}")]))},
        data={"purpose": "batch"},
        headers=auth,
    )
    assert uploaded.status_code == 200, uploaded.text
    file_id = uploaded.json()["id"]
    for _ in range(MAX_BATCHES - 1):
        assert _make(clients[0], key, file_id).status_code == 200
    answers = _at_once(clients, key, file_id)
    assert {a.status_code for a in answers} <= {200, 409}, [a.text for a in answers]
    refused = [a.json()["error"]["code"] for a in answers if a.status_code == 409]
    listed = clients[1].get("/v1/batches", params={"limit": 100}, headers=auth).json()["data"]
    ended = ("completed", "failed", "expired", "cancelled")
    return len(answers) - len(refused), refused, sum(b["status"] not in ended for b in listed)


def test_one_key_making_batches_on_two_replicas_at_once_never_passes_max_batches(
    tmp_path: Path, pg: PostgresServer
) -> None:
    """Each round: exactly one of the batches made at once is made, the rest refused with 409
    `too_many_batches`, never two (a batch over the cap)."""
    env = cli_env(**ENV, **_keys())
    replicas = []
    for name in "ab":
        path = tmp_path / f"{name}.yaml"  # a config (and a log) each
        path.write_text(_config(pg.url))
        replicas.append(GatewayChild(path, env=env))
    rounds = []
    clients: list[httpx.Client] = []
    try:
        for replica in replicas:
            replica.wait_ready()
        clients += [
            httpx.Client(base_url=r.url, timeout=30, trust_env=False) for r in replicas for _ in range(PER_REPLICA)
        ]
        started = time.monotonic()
        for secret in _keys().values():
            rounds.append(_round(clients, secret))
        took = time.monotonic() - started
    finally:
        for http in clients:
            http.close()
        for replica in replicas:
            replica.stop()
    expected = (1, ["too_many_batches"] * (len(clients) - 1), MAX_BATCHES)
    assert [r for r in rounds if r != expected] == [], f"{len(rounds)} rounds in {took:.1f} s"
