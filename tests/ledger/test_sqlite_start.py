"""Replicas starting together on one new SQLite file: the one that comes second waits for the first's lock.

SQLite answers the switch to WAL mode "database is locked" at once, without its busy wait, while another
process holds a write lock on a file still in rollback mode. A gateway starting then used to exit with that
line as a config error; it now waits for the lock, as it does for any other.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.ledger.engine import Database

HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
print("held", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


def _hold(path: Path, seconds: float) -> subprocess.Popen[str]:
    """Another process holding the file's write lock, in rollback mode, for `seconds`."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _done(proc: subprocess.Popen[str]) -> None:
    assert proc.wait(10) == 0
    assert proc.stdout is not None
    proc.stdout.close()


def test_a_file_another_process_holds_in_rollback_mode_is_waited_for(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    holder = _hold(path, 0.5)
    try:
        start = time.monotonic()
        db = Database(f"sqlite:///{path}")
        try:
            assert db.migrate() == 0
        finally:
            db.close()
        assert time.monotonic() - start >= 0.3  # it waited for the lock rather than failing at once
    finally:
        _done(holder)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("SELECT count(*) FROM schema_version").fetchone()[0] > 0


def test_a_lock_held_past_the_bound_is_still_an_error(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    holder = _hold(path, 3)
    try:
        db = Database(f"sqlite:///{path}", timeout_ms=300)
        start = time.monotonic()
        with pytest.raises(Exception, match="locked"):
            db.migrate()
        assert 0.25 <= time.monotonic() - start < 2.5  # its bound, not the holder's time
        db.close()
    finally:
        _done(holder)
