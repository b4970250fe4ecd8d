"""The two engines behind one small interface: SQLite (the standard library's `sqlite3`) embedded, and
PostgreSQL (psycopg 3) when several replicas share the ledger.

Every call is synchronous and runs on the ledger's one thread (gateway/ledger/book.py), never on the
event loop, so neither driver needs an async wrapper. SQL is written once with `?` placeholders in the
dialect both engines accept (`ON CONFLICT ... DO UPDATE`, `excluded`); PostgreSQL's `%s` is substituted
when a statement is prepared. A failure to reach or write the database is `LedgerDown`; the caller
decides whether to spill or to answer 503.
"""

from __future__ import annotations

import functools
import re
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar, cast

from gateway.config import ledger_target
from gateway.ledger import sums
from gateway.ledger.schema import MIGRATIONS, VERSION, SchemaError

T = TypeVar("T")
_BUSY_MS: Final = 10_000  # SQLite: how long a writer waits for another process's transaction
_CONNECT_S: Final = 2
_WAL_RETRY_S: Final = 0.02
_LOCK_ID: Final = 0x6C6564676572  # PostgreSQL advisory lock held while migrating ("ledger")
_DAY: Final = re.compile(r"\d{4}-\d{2}-\d{2}")
_PARTITION: Final = re.compile(r"requests_d\d{8}")
SQLITE: Final = "sqlite"
POSTGRES: Final = "postgresql"

# The standard library binds a None (a row's NULL columns) only after looking for `__adapt__` and
# `__conform__` on it, two AttributeErrors raised and cleared per None: about 2,000 instructions each,
# a fifth of a row's insert. An adapter registered for None is found first and returns it unchanged
# (`{}.get(None)` is None, a C call), so a NULL is bound as before. Process-wide, as adapters are.
sqlite3.register_adapter(type(None), cast("Callable[[None], None]", {}.get))


# SQLite's errors that a statement or its values cause, not the file or its lock (`Database._errors`).
_ROW_FAULTS: Final = (
    sqlite3.IntegrityError,
    sqlite3.DataError,
    sqlite3.ProgrammingError,
    sqlite3.InterfaceError,
    sqlite3.NotSupportedError,
    sqlite3.InternalError,
)


class LedgerDown(Exception):
    """The database could not be reached or written now."""


def parse_url(url: str) -> tuple[str, str]:
    """(engine, target): the config's own check of `ledger.url` (gateway/config/loading.py)."""
    return ledger_target(url)


def _drop(cur: Cursor, name: str) -> int:
    return cur.execute(f"DROP TABLE IF EXISTS {name}")


def _writable(cur: Cursor) -> None:
    """The writer's own statements, on no row: each fails as a batch would (a lock held elsewhere, a file or a
    server that takes no writes, a role no longer allowed to write, tables gone), and each is cheap when they
    pass (a false condition reads nothing, and no row changed makes a commit without a write to disk)."""
    cur.execute("INSERT INTO requests SELECT * FROM requests WHERE 1 = 0")
    cur.execute("UPDATE daily SET requests = requests WHERE 1 = 0")


def _wal(conn: sqlite3.Connection, busy_s: float) -> None:
    """Put the file in WAL mode, waiting up to `busy_s` for another process's lock.

    SQLite answers the switch "database is locked" at once, without its busy wait, while another connection
    holds a write lock on a file still in rollback mode (replicas starting together on a new file, one of
    them creating the schema): the switch is tried again until the lock is gone."""
    deadline = time.monotonic() + busy_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(_WAL_RETRY_S)


class Cursor:
    """What a transaction's body sees: `execute`, `executemany`, `rows` with `?` placeholders on both engines."""

    def __init__(self, raw: Any, postgres: bool) -> None:
        self.raw = raw
        self.postgres = postgres

    def _sql(self, sql: str) -> str:
        return sums.for_postgres(sql).replace("?", "%s") if self.postgres else sums.for_sqlite(sql)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        self.raw.execute(self._sql(sql), tuple(params))
        return int(self.raw.rowcount)

    def executemany(self, sql: str, params: Iterable[Sequence[Any]]) -> None:
        self.raw.executemany(self._sql(sql), params)

    def copy(self, sql: str, types: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        """PostgreSQL: `rows` through `COPY ... FROM STDIN (FORMAT BINARY)`, each column of its type in `types`."""
        with self.raw.copy(sql) as copy:
            copy.set_types(types)
            write = copy.write_row
            for row in rows:
                write(row)

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The statement's rows; its `sum64(column)` sums stop at the largest 64-bit integer (sums.py)."""
        try:
            self.raw.execute(self._sql(sql), tuple(params))
        except sqlite3.OperationalError as exc:
            if self.postgres or not sums.overflowed(exc) or sums.NAME not in sql:
                raise
            self.raw.execute(sql, tuple(params))  # SQLite's `sum` overflowed: the saturating aggregate
        return [tuple(r) for r in self.raw.fetchall()]


class Database:
    """One connection, opened on first use and again after a failure; used from one thread only."""

    def __init__(self, url: str, timeout_ms: int | None = None) -> None:
        self.engine, self.target = parse_url(url)
        # How long one statement may wait (for a lock, or a busy server) before it fails as `LedgerDown`;
        # None: as long as it takes (`serve`'s migrations before the workers start).
        self.timeout_ms = timeout_ms
        self.postgres = self.engine == POSTGRES
        self._conn: Any = None
        self._days: set[str] = set()  # PostgreSQL day partitions known to exist

    @property
    def where(self) -> str:
        """The database, for a log line (a PostgreSQL URL without its password)."""
        if not self.postgres:
            return f"sqlite file {self.target}"
        import psycopg.conninfo

        info = psycopg.conninfo.conninfo_to_dict(self.target)
        return f"postgresql {info.get('host', '')}:{info.get('port', 5432)}/{info.get('dbname', '')}"

    def _connect(self) -> Any:
        if self.postgres:
            import psycopg

            if self.timeout_ms is None:
                return psycopg.connect(self.target, connect_timeout=_CONNECT_S, autocommit=True)
            import psycopg.conninfo

            # The server ends a statement that waits longer (a lock held elsewhere, a stalled server): the
            # caller gets `LedgerDown` instead of waiting as long as the lock is held. Added to the URL's own.
            own = psycopg.conninfo.conninfo_to_dict(self.target).get("options") or ""
            bound = f"-c statement_timeout={self.timeout_ms} -c lock_timeout={self.timeout_ms}"
            return psycopg.connect(
                self.target, connect_timeout=_CONNECT_S, autocommit=True, options=f"{own} {bound}".strip()
            )
        folder = Path(self.target).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # an outage like any other: one line at start-up, the spill file later
            raise sqlite3.OperationalError(f"cannot make the directory {folder}: {exc.strerror or exc}") from None
        busy_s = (_BUSY_MS if self.timeout_ms is None else self.timeout_ms) / 1000
        # Autocommit mode: every transaction is an explicit BEGIN IMMEDIATE ... COMMIT below.
        conn = sqlite3.connect(self.target, timeout=busy_s, isolation_level=None, check_same_thread=False)
        try:
            sums.register(conn)
            _wal(conn, busy_s)  # readers never wait for the writer; replicas on one host share it
            conn.execute("PRAGMA synchronous=NORMAL")  # durable across a process crash (WAL)
        except BaseException:
            conn.close()  # a file that cannot be set up (locked, not a database) is retried with a new one
            raise
        return conn

    def _errors(self) -> tuple[type[BaseException], ...]:
        if self.postgres:
            import psycopg

            # The server ending a session idle too long in a transaction (a process stalled mid-transaction:
            # gateway/batches/store.py sets the bound) is an outage of this connection, as a broken one is. So
            # is a database that takes no writes now (a standby after a failover, `default_transaction_read_only`)
            # or no longer lets the gateway's role write, or lost its tables: no row is at fault, every row is
            # kept (spilled) until it takes them again, never refused as a bad value.
            return (
                psycopg.OperationalError,
                psycopg.InterfaceError,
                psycopg.errors.IdleInTransactionSessionTimeout,
                psycopg.errors.ReadOnlySqlTransaction,
                psycopg.errors.InsufficientPrivilege,
                psycopg.errors.UndefinedTable,
            )
        # Beside SQLite's outages (locked, disk full, read-only, I/O), a file that is not a database, or is
        # corrupt (a bare `DatabaseError`), is one too: no row is at fault, so rows are spilled and replayed once
        # the file is whole again. Its other errors name a statement's or a value's fault (`_ROW_FAULTS`).
        return (sqlite3.DatabaseError,)

    def snapshot(self, body: Callable[[Cursor], T]) -> T:
        """Run `body`, which only reads, in one transaction that takes no write lock (SQLite: a deferred BEGIN,
        which in WAL mode reads a snapshot and never waits for a writer; PostgreSQL: as `transaction`)."""
        return self.transaction(body, write=False)

    def transaction(self, body: Callable[[Cursor], T], *, write: bool = True) -> T:
        """Run `body` in one transaction (SQLite: BEGIN IMMEDIATE, so writers queue instead of failing; a
        deferred BEGIN for `snapshot`'s reads)."""
        errors = self._errors()
        try:
            fresh = self._conn is None
            if fresh:
                self._conn = self._connect()
            conn = self._conn
            if self.postgres:
                try:
                    conn, tx = self._begin(conn, fresh, errors)
                    try:
                        with conn.cursor() as cur:
                            out = body(Cursor(cur, True))
                    except BaseException as exc:
                        tx.__exit__(type(exc), exc, exc.__traceback__)  # ROLLBACK
                        raise
                    tx.__exit__(None, None, None)  # COMMIT
                    return out
                except BaseException:
                    self._days.clear()
                    raise
            cur = conn.cursor()
            cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                out = body(Cursor(cur, False))
            except BaseException:
                conn.rollback()
                raise
            cur.execute("COMMIT")
            return out
        except errors as exc:
            if isinstance(exc, _ROW_FAULTS):
                raise
            self.close()  # forgets the partitions too: one made in a transaction that failed is not there
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise LedgerDown(f"{self.where}: {first}") from None

    def _begin(self, conn: Any, fresh: bool, errors: tuple[type[BaseException], ...]) -> tuple[Any, Any]:
        """PostgreSQL: a transaction begun on `conn`, or on a new connection when `conn` (not `fresh`) was ended
        by the server while it idled (a restart, a failover, an idle timeout): that fails at its BEGIN, before
        anything ran, so one new connection is tried at once and the caller meets no outage already over."""
        try:
            tx = conn.transaction()
            tx.__enter__()  # BEGIN
            return conn, tx
        except errors:
            if fresh:
                raise
        self.close()
        conn = self._conn = self._connect()
        tx = conn.transaction()
        tx.__enter__()
        return conn, tx

    def probe(self) -> None:
        """Whether a batch could be committed now, without writing one: `LedgerDown` when it could not."""
        self.transaction(_writable)

    def ensure_days(self, cur: Cursor, days: Iterable[str]) -> None:
        """PostgreSQL: the day partitions these rows go to (made once, under a lock replicas share)."""
        if not self.postgres:
            return
        for day in sorted(set(days) - self._days):
            if not _DAY.fullmatch(day):
                raise ValueError(f"not a day: {day!r}")
            cur.execute("SELECT pg_advisory_xact_lock(?)", (_LOCK_ID + 1,))
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS requests_d{day.replace('-', '')} PARTITION OF requests "
                f"FOR VALUES IN ('{day}')"
            )
            self._days.add(day)

    def retain(self, before_day: str, batch_rows: int, max_batches: int) -> int:
        """Remove the rows of days before `before_day`: whole partitions on PostgreSQL, bounded batches of
        `batch_rows` (each its own transaction, at most `max_batches` per call) on SQLite. Rows removed
        (PostgreSQL: partitions dropped)."""
        if not _DAY.fullmatch(before_day):
            raise ValueError(f"not a day: {before_day!r}")
        removed = 0
        if self.postgres:
            names = self.transaction(
                lambda cur: [
                    r[0]
                    for r in cur.rows(
                        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                        "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'requests'"
                    )
                ]
            )
            cutoff = "requests_d" + before_day.replace("-", "")
            for name in sorted(n for n in names if _PARTITION.fullmatch(n) and n < cutoff):
                self.transaction(functools.partial(_drop, name=name))
                self._days.discard(f"{name[10:14]}-{name[14:16]}-{name[16:18]}")
                removed += 1
            return removed
        for _ in range(max_batches):
            done = self.transaction(
                lambda cur: cur.execute(
                    "DELETE FROM requests WHERE rowid IN (SELECT rowid FROM requests WHERE day < ? LIMIT ?)",
                    (before_day, batch_rows),
                )
            )
            removed += done
            if done < batch_rows:
                break
        return removed

    def close(self) -> None:
        self._days.clear()
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # a connection that broke may fail to close too; it is dropped either way
                pass

    def migrate(self) -> int:
        """Bring the schema to this code's version (in one transaction); the version found before."""

        def run(cur: Cursor) -> int:
            if self.postgres:
                # Migrations take as long as they take (a replica waits for another's to end): no bound.
                cur.execute("SET LOCAL statement_timeout = 0")
                cur.execute("SET LOCAL lock_timeout = 0")
                cur.execute("SELECT pg_advisory_xact_lock(?)", (_LOCK_ID,))  # replicas starting together
            cur.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            found = cur.rows("SELECT max(version) FROM schema_version")[0][0] or 0
            if found > VERSION:
                raise SchemaError(
                    f"the ledger's schema is at version {found}, newer than this gateway's {VERSION}: "
                    "run a gateway at least as new as the one that migrated it"
                )
            for version in range(found + 1, VERSION + 1):
                for statement in MIGRATIONS[version - 1]:
                    cur.execute(statement if isinstance(statement, str) else statement[self.engine])
                cur.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
            return int(found)

        return self.transaction(run)
