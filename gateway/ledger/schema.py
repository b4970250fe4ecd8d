"""One schema and one list of migrations for both engines, applied at start-up.

Each migration is a list of statements written in the SQL both SQLite and PostgreSQL accept. The
database records the version it is at; a database at a version newer than this code knows is a
start-up error, never a guess.
"""

from __future__ import annotations

from typing import Final

# Where the engines differ, a statement is a mapping engine -> SQL (the `requests` table is partitioned by
# day on PostgreSQL, so that retention drops whole days; partitions are made by the writer as days come).
Statement = str | dict[str, str]

_REQUESTS: Final = """(
            id TEXT NOT NULL,
            request_id TEXT NOT NULL,
            ts DOUBLE PRECISION NOT NULL,
            day TEXT NOT NULL,
            key_name TEXT NOT NULL,
            team TEXT NOT NULL,
            model TEXT NOT NULL,
            target TEXT NOT NULL,
            provider TEXT NOT NULL,
            dialect TEXT NOT NULL,
            stream INTEGER NOT NULL,
            status INTEGER NOT NULL,
            error TEXT,
            latency_ms DOUBLE PRECISION NOT NULL,
            ttfb_ms DOUBLE PRECISION,
            prompt_tokens BIGINT NOT NULL,
            completion_tokens BIGINT NOT NULL,
            cost_pico BIGINT NOT NULL,
            cache TEXT,
            attempts INTEGER NOT NULL,
            prompt TEXT,
            completion TEXT,
            PRIMARY KEY (day, id)
        )"""

MIGRATIONS: Final[list[list[Statement]]] = [
    # 1: rows, daily rollups, runtime keys, the counters replicas poll.
    [
        {
            "sqlite": f"CREATE TABLE requests {_REQUESTS}",
            "postgresql": f"CREATE TABLE requests {_REQUESTS} PARTITION BY LIST (day)",
        },
        "CREATE INDEX requests_request_id ON requests (request_id)",
        """CREATE TABLE daily (
            day TEXT NOT NULL,
            key_name TEXT NOT NULL,
            team TEXT NOT NULL,
            model TEXT NOT NULL,
            target TEXT NOT NULL,
            requests BIGINT NOT NULL,
            errors BIGINT NOT NULL,
            prompt_tokens BIGINT NOT NULL,
            completion_tokens BIGINT NOT NULL,
            cost_pico BIGINT NOT NULL,
            PRIMARY KEY (day, key_name, team, model, target)
        )""",
        """CREATE TABLE api_keys (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            team TEXT,
            models TEXT NOT NULL,
            max_cost_per_day DOUBLE PRECISION,
            expires_at DOUBLE PRECISION,
            digest TEXT NOT NULL,
            old_digest TEXT,
            old_valid_until DOUBLE PRECISION,
            created_at DOUBLE PRECISION NOT NULL,
            revoked_at DOUBLE PRECISION,
            limits TEXT
        )""",
        "CREATE TABLE counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL)",
        "INSERT INTO counters (name, value) VALUES ('keys', 0)",
    ],
    # 2: no query looks rows up by request_id, and its index cost every insert a tenth more.
    ["DROP INDEX IF EXISTS requests_request_id"],
    # 3: runtime keys take a monthly budget, as YAML keys do.
    ["ALTER TABLE api_keys ADD COLUMN max_cost_per_month DOUBLE PRECISION"],
    # 4: which endpoint a row answered (completions or chat); rows written before it were completions.
    ["ALTER TABLE requests ADD COLUMN endpoint TEXT NOT NULL DEFAULT 'completions'"],
]

VERSION: Final = len(MIGRATIONS)


class SchemaError(Exception):
    """The database's schema cannot be used by this code (one line for the operator)."""
