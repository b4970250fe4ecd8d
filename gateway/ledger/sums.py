"""Sums of the ledger's 64-bit columns (money, tokens, counts) that stop at the largest 64-bit integer.

A day's rollup may hold up to 2**63-1 picodollars (gateway/ledger/batch.py), so a report or a budget seed
that adds several rollups can pass what 64 bits hold. PostgreSQL's `sum` of BIGINT is a numeric and never
overflows: it is capped and cast back to BIGINT. SQLite's `sum` raises "integer overflow", an error the
gateway cannot tell from an outage, and its `total` is a float, exact only to 2**53 picodollars. So on SQLite
a statement runs with the built-in `sum` (no cost when nothing overflows) and, only when SQLite says it
overflowed, once more with `sum64`, an aggregate in Python registered on every connection: exact below the
bound, at the bound past it, and several times slower than the built-in on large tables.

The ledger's SQL writes such a sum as `sum64(column)`; `for_sqlite` and `for_postgres` turn it into each
engine's. Docs: docs/ledger.md#budgets.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any, Final, cast

from gateway.limits.saturating import INT64_MAX

INT64_MIN: Final = -INT64_MAX - 1
NAME: Final = "sum64"
_CALL: Final = re.compile(r"\bsum64\(([A-Za-z_][A-Za-z0-9_]*)\)")


class Sum64:
    """SQLite aggregate: the exact sum of its (integer) values, stopped at the 64-bit bounds; NULL over none."""

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total: int | None = None

    def step(self, value: int | None) -> None:
        if value is not None:
            self.total = value if self.total is None else self.total + value

    def finalize(self) -> int | None:
        return None if self.total is None else max(INT64_MIN, min(self.total, INT64_MAX))


def register(conn: sqlite3.Connection) -> None:
    conn.create_aggregate(NAME, 1, cast("Any", Sum64))  # its finalize may return NULL, as `sum`'s does


def for_sqlite(sql: str) -> str:
    """The statement with SQLite's built-in `sum`, tried first."""
    return _CALL.sub(r"sum(\1)", sql)


def for_postgres(sql: str) -> str:
    # `LEAST(sum(x), bound)` would be the bound over no rows (LEAST skips a NULL), not NULL as `sum` is.
    return _CALL.sub(rf"CAST(CASE WHEN sum(\1) > {INT64_MAX} THEN {INT64_MAX} ELSE sum(\1) END AS BIGINT)", sql)


def overflowed(exc: sqlite3.Error) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and "integer overflow" in str(exc)
