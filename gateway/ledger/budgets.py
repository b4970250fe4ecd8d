"""Budgets with a ledger: the reservations of gateway/limits/budgets.py, seeded from the ledger's rollups.

A counter Redis does not have (a Redis restart) or a process has not seen (a restart) starts from what the
rollups hold for its budget and period, plus this process's rows the writer has not committed yet
(`Ledger.read`), so a restart forgets no spend booked before it. A key's counter is its identity's
(`key_id`), plus the rows its name booked before rows named their key's identity. A counter in process
memory is seeded again every `flush_ms` while it is in use (the counters due together, in one read), so
that what other workers and replicas sharing the ledger have committed since counts
against it too. While the ledger does not answer (within `ledger.timeout_ms`, or a call failed a moment
ago), a counter starts from what this process knows and is seeded as soon as the ledger answers again:
requests are never held up.
"""

from __future__ import annotations

from gateway.config import LoadedConfig
from gateway.ledger.batch import Rollups
from gateway.ledger.book import Ledger
from gateway.ledger.engine import Cursor, LedgerDown
from gateway.limits.budgets import Budget, Budgets
from gateway.limits.usage import Counters


def _seed(cur: Cursor, b: Budget) -> int:
    sums = "SELECT coalesce(sum64(cost_pico), 0) FROM daily WHERE day >= ? AND day <= ?"
    if b.legacy:
        found = cur.rows(
            f"{sums} AND ({b.column} = ? OR ({b.column} = '' AND key_name = ?))",
            (b.first_day, b.last_day, b.whose, b.legacy),
        )
    else:
        found = cur.rows(f"{sums} AND {b.column} = ?", (b.first_day, b.last_day, b.whose))
    return int(found[0][0])


def _waiting(waiting: Rollups, budgets: list[Budget]) -> list[int]:
    """What each budget holds of this process's rows not committed yet (`Ledger.read`'s rollups, keyed by
    day, key name, team, model, target, key identity): their cost within its period, by its key's identity
    (or its name, for rows booked without one) or by its team."""
    totals = [0] * len(budgets)
    for k, v in waiting.items():
        day, name, team, ident = k[0], k[1], k[2], k[5] or ""
        for i, b in enumerate(budgets):
            if b.first_day <= day <= b.last_day:
                if b.column == "team":
                    mine = team == b.whose
                else:
                    mine = ident == b.whose or (bool(b.legacy) and not ident and name == b.legacy)
                if mine:
                    totals[i] += v[4]
    return totals


def ledger_budgets(loaded: LoadedConfig, ledger: Ledger, counters: Counters) -> Budgets:
    """The budgets of `loaded`, seeded from `ledger`."""

    async def reseeded(budgets: list[Budget]) -> list[int] | None:
        if ledger.unanswered is not None:
            return None  # a call just went unanswered: do not make this request wait for another
        try:
            booked, waiting = await ledger.read(lambda cur: [_seed(cur, b) for b in budgets])
        except LedgerDown:
            return None
        return [int(x) + w for x, w in zip(booked, _waiting(waiting, budgets), strict=True)]

    async def seeded(b: Budget) -> int | None:
        found = await reseeded([b])
        return None if found is None else found[0]

    return Budgets(loaded, counters, seeded, reseed=reseeded, refresh_s=ledger.cfg.flush_ms / 1000)
