"""Budgets with a ledger: the reservations of gateway/limits/budgets.py, seeded from the ledger's rollups.

A counter Redis does not have (a Redis restart) or a process has not seen (a restart) starts from what the
rollups hold for its budget and period, plus this process's rows the writer has not committed yet
(`Ledger.read_folded`), so a restart forgets no spend booked before it. A key's counter is its identity's
(`key_id`), plus the rows its name booked before rows named their key's identity. A counter in process
memory is seeded again every `flush_ms` while it is in use (the counters due together, in one pass over
the queue), so that what other workers and replicas sharing the ledger have committed since counts
against it too. While the ledger does not answer (within `ledger.timeout_ms`, or a call failed a moment
ago), a counter starts from what this process knows and is seeded as soon as the ledger answers again:
requests are never held up.
"""

from __future__ import annotations

import calendar
import datetime as dt
from collections import deque
from collections.abc import Callable

from gateway.config import LoadedConfig
from gateway.ledger.batch import Pending
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


def _midnight(day: str) -> int:
    return calendar.timegm(dt.date.fromisoformat(day).timetuple())


def _waiting(budgets: list[Budget]) -> Callable[[deque[Pending]], list[int]]:
    """What each budget holds of this process's rows not committed yet: their cost, where they were answered
    within its period by its key (or team). A queued row: (key name, ..., team at 10, key identity at 11,
    ...), then (request id, the time it ended, ..., its cost at 6, ...). One pass over the rows for all."""
    spans = [(_midnight(b.first_day), _midnight(b.last_day) + 86_400) for b in budgets]
    idents: dict[str, list[int]] = {}  # a key's identity -> its budgets
    names: dict[str, list[int]] = {}  # a key's name -> its budgets, for rows booked without an identity
    teams: dict[str, list[int]] = {}
    for i, b in enumerate(budgets):
        if b.column == "team":
            teams.setdefault(b.whose, []).append(i)
        else:
            idents.setdefault(b.whose, []).append(i)
            if b.legacy:
                names.setdefault(b.legacy, []).append(i)

    def fold(rows: deque[Pending]) -> list[int]:
        totals = [0] * len(budgets)
        for entry, own in rows:
            ident = entry[11] or ""
            mine = idents.get(ident, ())
            if not ident:
                mine = [*mine, *names.get(entry[0], ())]
            team = teams.get(entry[10]) if teams else None
            if team is not None:
                mine = [*mine, *team]
            for i in mine:
                since, until = spans[i]
                if since <= own[1] < until:
                    totals[i] += own[6]
        return totals

    return fold


def ledger_budgets(loaded: LoadedConfig, ledger: Ledger, counters: Counters) -> Budgets:
    """The budgets of `loaded`, seeded from `ledger`."""

    async def reseeded(budgets: list[Budget]) -> list[int] | None:
        if ledger.unanswered is not None:
            return None  # a call just went unanswered: do not make this request wait for another
        try:
            booked, waiting = await ledger.read_folded(lambda cur: [_seed(cur, b) for b in budgets], _waiting(budgets))
        except LedgerDown:
            return None
        return [int(x) + w for x, w in zip(booked, waiting, strict=True)]

    async def seeded(b: Budget) -> int | None:
        found = await reseeded([b])
        return None if found is None else found[0]

    return Budgets(loaded, counters, seeded, reseed=reseeded, refresh_s=ledger.cfg.flush_ms / 1000)
