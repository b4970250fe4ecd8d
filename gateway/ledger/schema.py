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

_DAILY_COLUMNS: Final = (
    "day, key_name, key_id, team, model, target, requests, errors, prompt_tokens, completion_tokens, cost_pico, cached"
)
_DAILY: Final = (
    "(day TEXT NOT NULL, key_name TEXT NOT NULL, key_id TEXT NOT NULL DEFAULT '', team TEXT NOT NULL,"
    " model TEXT NOT NULL, target TEXT NOT NULL, requests BIGINT NOT NULL, errors BIGINT NOT NULL,"
    " prompt_tokens BIGINT NOT NULL, completion_tokens BIGINT NOT NULL, cost_pico BIGINT NOT NULL,"
    " cached BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (day, key_name, key_id, team, model, target))"
)

# Which endpoint a row answered. Self-contained: one migration, nothing else depends on its number.
_ENDPOINT: Final[list[Statement]] = ["ALTER TABLE requests ADD COLUMN endpoint TEXT NOT NULL DEFAULT 'completions'"]

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
    # 4: a row names its key's identity (a runtime key's id, a YAML key's fingerprint), the rollups are kept
    # per identity and count the answers the cache gave; a rotated key's earlier secrets each keep their grace.
    [
        "ALTER TABLE requests ADD COLUMN key_id TEXT NOT NULL DEFAULT ''",
        f"CREATE TABLE daily_next {_DAILY}",
        f"INSERT INTO daily_next ({_DAILY_COLUMNS}) SELECT day, key_name, '', team, model, target, requests, errors,"
        " prompt_tokens, completion_tokens, cost_pico, 0 FROM daily",
        "DROP TABLE daily",
        "ALTER TABLE daily_next RENAME TO daily",
        "CREATE TABLE key_secrets (digest TEXT PRIMARY KEY, key_id TEXT NOT NULL,"
        " valid_until DOUBLE PRECISION NOT NULL)",
        "INSERT INTO key_secrets (digest, key_id, valid_until) SELECT old_digest, id, old_valid_until FROM api_keys"
        " WHERE old_digest IS NOT NULL AND revoked_at IS NULL",
        "UPDATE api_keys SET old_digest = NULL, old_valid_until = NULL",
    ],
    # 5: which endpoint a row answered (completions or chat); rows written before it were completions.
    _ENDPOINT,
]

VERSION: Final = len(MIGRATIONS)


class SchemaError(Exception):
    """The database's schema cannot be used by this code (one line for the operator)."""
