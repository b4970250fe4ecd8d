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

# The Batch API's tables (gateway/batches, docs/batches.md): uploaded files in chunks, batches with their
# lease, and each line's state and answer, so that a batch resumes where its process died. Self-contained:
# one migration, nothing else depends on its number.
_BATCH_TABLES: Final[list[Statement]] = [
    """CREATE TABLE batch_files (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        filename TEXT NOT NULL,
        purpose TEXT NOT NULL,
        bytes BIGINT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        batch_id TEXT,
        kind TEXT NOT NULL
    )""",
    "CREATE INDEX batch_files_owner ON batch_files (owner, created_at)",
    {
        "sqlite": "CREATE TABLE batch_file_chunks (file_id TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL,"
        " PRIMARY KEY (file_id, seq))",
        "postgresql": "CREATE TABLE batch_file_chunks (file_id TEXT NOT NULL, seq INTEGER NOT NULL,"
        " data BYTEA NOT NULL, PRIMARY KEY (file_id, seq))",
    },
    """CREATE TABLE batches (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        input_file_id TEXT NOT NULL,
        completion_window TEXT NOT NULL,
        status TEXT NOT NULL,
        metadata TEXT,
        errors TEXT,
        reason TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL,
        in_progress_at DOUBLE PRECISION,
        finalizing_at DOUBLE PRECISION,
        completed_at DOUBLE PRECISION,
        failed_at DOUBLE PRECISION,
        expired_at DOUBLE PRECISION,
        cancelling_at DOUBLE PRECISION,
        cancelled_at DOUBLE PRECISION,
        total BIGINT NOT NULL,
        completed BIGINT NOT NULL,
        failed BIGINT NOT NULL,
        output_file_id TEXT,
        error_file_id TEXT,
        lease_owner TEXT,
        lease_until DOUBLE PRECISION NOT NULL
    )""",
    "CREATE INDEX batches_owner ON batches (owner, created_at)",
    "CREATE INDEX batches_status ON batches (status)",
    """CREATE TABLE batch_lines (
        batch_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        custom_id TEXT NOT NULL,
        body TEXT NOT NULL,
        state TEXT NOT NULL,
        sends INTEGER NOT NULL,
        result TEXT,
        PRIMARY KEY (batch_id, idx)
    )""",
    "CREATE INDEX batch_lines_state ON batch_lines (batch_id, state, idx)",
    # Each line's row in `requests` names its batch.
    "ALTER TABLE requests ADD COLUMN batch_id TEXT",
]

# Which endpoint a row answered. Self-contained: one migration, nothing else depends on its number.
_ENDPOINT: Final[list[Statement]] = ["ALTER TABLE requests ADD COLUMN endpoint TEXT NOT NULL DEFAULT 'completions'"]

# The runtime keys' table as migration 10 leaves it: a name is unique within its team (`api_keys_team_name`,
# the keys of no team one more namespace), no longer across the table. Its columns, in migration 9's order.
_KEY_COLUMNS: Final = (
    "id, name, team, models, max_cost_per_day, expires_at, digest, old_digest, old_valid_until, created_at,"
    " revoked_at, limits, max_cost_per_month, weight, priority, max_priority"
)
_PER_TEAM: Final[list[Statement]] = [
    """CREATE TABLE api_keys_next (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        team TEXT,
        models TEXT NOT NULL,
        max_cost_per_day DOUBLE PRECISION,
        expires_at DOUBLE PRECISION,
        digest TEXT NOT NULL,
        old_digest TEXT,
        old_valid_until DOUBLE PRECISION,
        created_at DOUBLE PRECISION NOT NULL,
        revoked_at DOUBLE PRECISION,
        limits TEXT,
        max_cost_per_month DOUBLE PRECISION,
        weight DOUBLE PRECISION,
        priority TEXT,
        max_priority TEXT
    )""",
    f"INSERT INTO api_keys_next ({_KEY_COLUMNS}) SELECT {_KEY_COLUMNS} FROM api_keys",
    "DROP TABLE api_keys",
    "ALTER TABLE api_keys_next RENAME TO api_keys",
    "CREATE UNIQUE INDEX api_keys_team_name ON api_keys (coalesce(team, ''), name)",
]

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
    # 5: the Batch API's files, batches and lines.
    _BATCH_TABLES,
    # 6: runtime keys take a YAML key's share of a saturated server: its weight and priorities.
    [
        "ALTER TABLE api_keys ADD COLUMN weight DOUBLE PRECISION",
        "ALTER TABLE api_keys ADD COLUMN priority TEXT",
        "ALTER TABLE api_keys ADD COLUMN max_priority TEXT",
    ],
    # 7: which endpoint a row answered (completions or chat); rows written before it were completions.
    _ENDPOINT,
    # 8: a file's expiry (`expires_after`), the one a batch gives the files it makes (`output_expires_after`),
    # and a batch's tokens (`usage`), summed as its lines are booked.
    [
        "ALTER TABLE batch_files ADD COLUMN expires_at DOUBLE PRECISION",
        "ALTER TABLE batches ADD COLUMN output_expires_s BIGINT",
        "ALTER TABLE batches ADD COLUMN input_tokens BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE batches ADD COLUMN cached_tokens BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE batches ADD COLUMN output_tokens BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE batches ADD COLUMN reasoning_tokens BIGINT NOT NULL DEFAULT 0",
    ],
    # 9: the model a batch's lines name (its Batch object's `model`), set once its file is checked.
    ["ALTER TABLE batches ADD COLUMN model TEXT"],
    # 10: a runtime key's name is unique within its team, not across teams.
    _PER_TEAM,
    # 11: a runtime key's own limits for its batch lines, in place of `batches.limits`.
    ["ALTER TABLE api_keys ADD COLUMN batch_limits TEXT"],
]

VERSION: Final = len(MIGRATIONS)


class SchemaError(Exception):
    """The database's schema cannot be used by this code (one line for the operator)."""
