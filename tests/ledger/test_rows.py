"""Every answered request is a row, and the daily rollups always equal the sum of their rows.

Served by the real gateway (uvicorn in a thread, or `python -m gateway serve` as a child) booking into a
real SQLite file; the PostgreSQL engine is exercised by tests/ledger/test_postgres.py.
"""

from __future__ import annotations

import signal
from pathlib import Path

from gateway.ledger.engine import Database
from gateway.ledger.schema import MIGRATIONS, VERSION
from tests.helpers.clients import body, client
from tests.helpers.servers import GatewayProcess, GatewayThread, cli_env, run_cli
from tests.helpers.sqlite import opened

from .conftest import COST_PICO, ENV, SOLO_KEY, TEAM_KEY, config, query, totals


def test_rows_and_rollups(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    path.write_text(config(url))
    with GatewayThread(path, ENV) as gw:
        with client(gw.url, TEAM_KEY) as c:
            for _ in range(5):
                assert c.post("/v1/completions", json=body(model="fast")).status_code == 200
            # Refused before any upstream call: a row too, without a target or cost.
            assert c.post("/v1/completions", json=body(model="nope/x")).status_code == 404
        with client(gw.url, SOLO_KEY) as c:
            for _ in range(3):
                with c.stream("POST", "/v1/completions", json=body(stream=True)) as resp:
                    assert resp.status_code == 200
                    assert resp.read().endswith(b"data: [DONE]\n\n")
        with client(gw.url, "gk-wrong") as c:
            assert c.post("/v1/completions", json=body()).status_code == 401
    # Stopping the gateway drained the queue: every answered request is there, nothing twice.
    rows, rolled = totals(url)
    assert rows == (10, 2, 8 * 3, 8 * 7, 8 * COST_PICO)
    assert rolled == rows
    served = query(
        url,
        "SELECT key_name, team, model, target, provider, dialect, stream, status, error, attempts, cost_pico "
        "FROM requests WHERE status = 200 ORDER BY ts",
    )
    assert served[0] == ("alice", "blue", "fast", "demo/long", "demo", "openai", 0, 200, None, 1, COST_PICO)
    assert served[-1] == ("solo", "", "demo/long", "demo/long", "demo", "openai", 1, 200, None, 1, COST_PICO)
    refused = query(url, "SELECT key_name, status, error, target, cost_pico FROM requests WHERE status >= 400")
    assert sorted(refused) == [("alice", 404, "model_not_found", "", 0), ("anonymous", 401, "invalid_api_key", "", 0)]
    # Request ids are the ones the client saw; bodies are not stored unless logging.prompts asks.
    assert query(url, "SELECT count(DISTINCT request_id), count(prompt), count(completion) FROM requests") == [
        (10, 0, 0)
    ]
    by_key = dict(query(url, "SELECT key_name || '/' || team || '/' || model, requests FROM daily WHERE errors = 0"))
    assert by_key == {"alice/blue/fast": 5, "solo//demo/long": 3}


def test_sigterm_loses_nothing(tmp_path: Path) -> None:
    """A flush interval far longer than the test: only the drain at SIGTERM can book these rows."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    path.write_text(config(url, flush_ms=60_000))
    gw = GatewayProcess(path, cli_env(**ENV))
    try:
        gw.wait_ready()
        with client(gw.url, TEAM_KEY) as c:
            for _ in range(40):
                assert c.post("/v1/completions", json=body()).status_code == 200
        assert totals(url)[0][0] == 0  # nothing written yet: the rows wait in the queue
        gw.proc.send_signal(signal.SIGTERM)
        gw.proc.wait(20)  # uvicorn re-raises the signal once it has shut down: the status is -15
    finally:
        gw.stop()
    rows, rolled = totals(url)
    assert rows == (40, 0, 40 * 3, 40 * 7, 40 * COST_PICO) == rolled


def test_a_newer_schema_is_one_line_at_start_up(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    path = tmp_path / "config.yaml"
    path.write_text(config(f"sqlite:///{db}"))
    with opened(db) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO schema_version VALUES (99)")
    result = run_cli(["serve", "--config", str(path), "--port", "0"], env=cli_env(**ENV))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"config error: {path}: ledger: the ledger's schema is at version 99, newer than this gateway's {VERSION}: "
        "run a gateway at least as new as the one that migrated it"
    )


def test_a_sqlite_file_whose_directory_cannot_be_made_is_one_line_at_start_up(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("a file where the ledger's directory would go")
    db = tmp_path / "plain" / "ledger" / "ledger.db"
    path = tmp_path / "config.yaml"
    path.write_text(config(f"sqlite:///{db}"))
    for workers in ("1", "2"):
        result = run_cli(["serve", "--config", str(path), "--port", "0", "--workers", workers], env=cli_env(**ENV))
        assert (result.returncode, result.stdout) == (1, ""), result.stderr
        assert result.stderr.strip().splitlines()[-1] == (
            f"config error: {path}: ledger: sqlite file {db}: cannot make the directory {db.parent}: Not a directory"
        ), result.stderr


def test_a_ledger_of_version_1_is_migrated_without_the_request_id_index(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    with opened(db) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for statement in MIGRATIONS[0]:
            conn.execute(statement if isinstance(statement, str) else statement["sqlite"])
        conn.execute("INSERT INTO schema_version VALUES (1)")
    conn.close()
    ledger = Database(f"sqlite:///{db}")
    assert ledger.migrate() == 1
    assert ledger.migrate() == VERSION  # every later migration applied by the first call
    ledger.close()
    with opened(db) as conn:
        indexes = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")]
    conn.close()
    assert "requests_request_id" not in indexes
    assert indexes  # the primary key's, which deduplicates replays, stays


def test_a_cached_answer_is_booked_with_the_cache_outcome_at_no_cost(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    path.write_text(config(url) + "cache: {mode: always}\n")
    with GatewayThread(path, ENV) as gw, client(gw.url, TEAM_KEY) as c:
        seen = [c.post("/v1/completions", json=body(model="fast")).headers.get("x-gateway-cache") for _ in range(2)]
    assert seen == ["miss", "hit"]
    rows = query(url, "SELECT cache, cost_pico, prompt_tokens, completion_tokens FROM requests ORDER BY ts")
    assert rows == [("miss", COST_PICO, 3, 7), ("hit", 0, 3, 7)]
    assert totals(url)[1][4] == COST_PICO  # the rollup charges the upstream's answer only
