"""Budgets with a ledger: the reservations of gateway/limits/budgets.py, seeded from the ledger's rollups.

A counter Redis does not have (a Redis restart) or a process has not seen (a restart) starts from what the
rollups hold for its budget and period, plus this process's rows the writer has not committed yet
(`Ledger.read`), so a restart forgets no spend booked before it. A key's counter is
its identity's (`key_id`), plus the rows its name booked before rows named their key's identity. While the
ledger does not answer (within `ledger.timeout_ms`, or a call failed a moment ago), a counter starts from
what this process knows and is seeded as soon as the ledger answers again: requests are never held up.
"""

from __future__ import annotations

from gateway.config import LoadedConfig
from gateway.ledger.batch import Rollups
from gateway.ledger.book import Ledger
from gateway.ledger.engine import Cursor, LedgerDown
from gateway.limits.budgets import Budget, Budgets
from gateway.limits.usage import Counters


def _seed(cur: Cursor, b: Budget) -> int:
    sums = "SELECT coalesce(sum(cost_pico), 0) FROM daily WHERE day >= ? AND day <= ?"
    if b.legacy:
        found = cur.rows(
            f"{sums} AND ({b.column} = ? OR ({b.column} = '' AND key_name = ?))",
            (b.first_day, b.last_day, b.whose, b.legacy),
        )
    else:
        found = cur.rows(f"{sums} AND {b.column} = ?", (b.first_day, b.last_day, b.whose))
    return int(found[0][0])


def _waiting(waiting: Rollups, b: Budget) -> int:
    """What `b` holds of this process's rows not committed yet (rollup keys: day, key_name, team, model,
    target, key_id)."""
    total = 0
    for k, v in waiting.items():
        if b.first_day <= k[0] <= b.last_day:
            if b.column == "team":
                mine = k[2] == b.whose
            else:
                mine = k[5] == b.whose or (bool(b.legacy) and k[5] == "" and k[1] == b.legacy)
            total += v[4] if mine else 0
    return total


def ledger_budgets(loaded: LoadedConfig, ledger: Ledger, counters: Counters) -> Budgets:
    """The budgets of `loaded`, seeded from `ledger`."""

    async def seeded(b: Budget) -> int | None:
        if ledger.unanswered is not None:
            return None  # a call just went unanswered: do not make this request wait for another
        try:
            booked, waiting = await ledger.read(lambda cur: _seed(cur, b))
        except LedgerDown:
            return None
        return int(booked) + _waiting(waiting, b)

    return Budgets(loaded, counters, seeded)
