"""The ledger's PostgreSQL sessions against what a server does to them: two replicas making a key of one name at
the same moment (READ COMMITTED lets both pass the name check before either inserts: one gets the key, the
other the conflict, never a database error), the keys read back while a rotation commits, and a session the
server ended while it idled."""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

from gateway.ledger import keys as keystore
from gateway.ledger.engine import Cursor, Database
from tests.helpers.postgres import PostgresServer


def test_the_second_of_two_racing_creations_is_a_conflict(pg: PostgresServer) -> None:
    first, second = Database(pg.url, timeout_ms=5000), Database(pg.url, timeout_ms=5000)
    first.migrate()
    checked = threading.Event()
    inserted = threading.Event()
    outcome: dict[str, Any] = {}

    def slow_first(cur: Cursor) -> keystore.Issued:
        # The first one inserts, then holds its transaction open until the second has passed its check.
        issued = keystore.create(cur, "racer", None, ["**"], None, None)
        inserted.set()
        assert checked.wait(10)
        return issued

    def racing_second(cur: Cursor) -> keystore.Issued:
        assert inserted.wait(10)
        # Nothing committed yet: the name check finds no key, as on the other replica a moment ago.
        assert cur.rows("SELECT id FROM api_keys WHERE name = ?", ("racer",)) == []
        checked.set()
        return keystore.create(cur, "racer", None, ["**"], None, None)  # waits on the first's insert

    def run(name: str, db: Database, body: Any) -> None:
        try:
            outcome[name] = db.transaction(body)
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test compares
            outcome[name] = exc

    threads = [
        threading.Thread(target=run, args=("first", first, slow_first)),
        threading.Thread(target=run, args=("second", second, racing_second)),
    ]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join(20)
        assert isinstance(outcome["first"], keystore.Issued), outcome
        assert isinstance(outcome["second"], keystore.KeyConflict), outcome
        rows = first.transaction(lambda cur: cur.rows("SELECT name FROM api_keys", ()))
        assert [tuple(r) for r in rows] == [("racer",)]
    finally:
        first.close()
        second.close()


def test_keys_read_while_a_rotation_commits_are_as_new_as_the_version_they_report(pg: PostgresServer) -> None:
    """Each statement of a PostgreSQL read sees what is committed when it starts. A rotation that commits in the
    middle of reading the keys back must not leave the poller holding the old secret under the new version: it
    would never read them again, and the new secret would be refused until the next change."""
    import psycopg

    db = Database(pg.url, timeout_ms=10_000)
    try:
        db.migrate()
        key_id = db.transaction(lambda cur: keystore.create(cur, "rotated", None, ["**"], None, None)).key.id
        outcome: dict[str, Any] = {}
        with psycopg.connect(pg.url) as holder, psycopg.connect(pg.url, autocommit=True) as watcher:
            # The rotation, made but not committed, holds the keys' version so that a read of it waits.
            holder.execute("LOCK TABLE counters IN ACCESS EXCLUSIVE MODE")
            issued = keystore.rotate(Cursor(holder.cursor(), True), key_id, 600)
            reader = threading.Thread(target=lambda: outcome.update(found=db.snapshot(keystore.load)))
            reader.start()
            deadline = time.monotonic() + 10
            sql = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = %s"
            while watcher.execute(sql, (pg.dbname,)).fetchall() != [(1,)]:
                assert time.monotonic() < deadline, "the read never waited on the rotation"
                time.sleep(0.01)
            holder.commit()
            reader.join(10)
        found: keystore.Loaded = outcome["found"]
        assert found.version == 2  # the creation's change and the rotation's
        assert [r[6] for r in found.rows] == [hashlib.sha256(issued.secret.encode()).hexdigest()]
    finally:
        db.close()


def test_a_connection_the_server_ended_while_idle_is_replaced_at_once(pg: PostgresServer) -> None:
    """A PostgreSQL restart, failover or idle timeout ends the ledger's idle session: the next transaction
    meets it at its BEGIN, before anything ran, and goes on a new connection instead of failing as an outage."""
    import psycopg

    db = Database(pg.url, timeout_ms=5000)
    try:
        db.migrate()
        assert db.transaction(lambda cur: cur.rows("SELECT 1", ())) == [(1,)]
        with psycopg.connect(pg.dsn("postgres"), autocommit=True) as admin:
            ended = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (pg.dbname,),
            ).fetchall()
        assert ended
        assert db.transaction(lambda cur: cur.rows("SELECT 2", ())) == [(2,)]
    finally:
        db.close()
