"""Usage over any range of days, from the rollups (which equal the sum of their rows), as JSON or CSV."""

from __future__ import annotations

import csv
import datetime as dt
import io
import time
from typing import Any, Final

import msgspec

from gateway.ledger.book import Ledger
from gateway.ledger.engine import Cursor, LedgerDown
from gateway.limits.usage import day_of, usd

BY: Final = {"key": "key_name", "team": "team", "model": "model", "target": "target"}
MAX_DAYS: Final = 366
_FIELDS: Final = ("requests", "errors", "prompt_tokens", "completion_tokens", "cost")


class ReportError(ValueError):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _day(value: str | None, param: str, default: str) -> str:
    if value is None or value == "":
        return default
    try:
        return dt.date.fromisoformat(value).isoformat() if len(value) == 10 else _fail(value, param)
    except ValueError:
        return _fail(value, param)


def _fail(value: str, param: str) -> str:
    raise ReportError(f"Invalid {param} {value!r}: expected YYYY-MM-DD (UTC)", param)


def _query(cur: Cursor, start: str, end: str, column: str) -> list[tuple[Any, ...]]:
    return cur.rows(
        f"SELECT day, {column}, sum(requests), sum(errors), sum(prompt_tokens), sum(completion_tokens), "
        f"sum(cost_pico) FROM daily WHERE day >= ? AND day <= ? GROUP BY day, {column} ORDER BY day, {column}",
        (start, end),
    )


async def report(
    ledger: Ledger, start: str | None, end: str | None, by: str | None, fmt: str | None
) -> tuple[bytes, str]:
    today = day_of(time.time())
    first = _day(start, "from", today)
    last = _day(end, "to", first if start else today)
    if last < first:
        raise ReportError(f"'to' ({last}) is before 'from' ({first})", "to")
    if (dt.date.fromisoformat(last) - dt.date.fromisoformat(first)).days >= MAX_DAYS:
        raise ReportError(f"at most {MAX_DAYS} days per report", "to")
    group = by or "key"
    if group not in BY:
        raise ReportError(f"Invalid by {group!r}: one of {', '.join(BY)}", "by")
    kind = fmt or "json"
    if kind not in ("json", "csv"):
        raise ReportError(f"Invalid format {kind!r}: json or csv", "format")
    column = BY[group]
    found: list[tuple[Any, ...]] = await ledger.call(
        ledger.db.transaction, lambda cur: _query(cur, first, last, column)
    )
    rows = [
        {
            "day": r[0],
            group: r[1],
            "requests": int(r[2]),
            "errors": int(r[3]),
            "prompt_tokens": int(r[4]),
            "completion_tokens": int(r[5]),
            "cost": usd(int(r[6])),
        }
        for r in found
    ]
    if kind == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=["day", group, *_FIELDS], lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue().encode(), "text/csv; charset=utf-8"
    totals = {f: sum(r[f] for r in rows) for f in _FIELDS}
    days: dict[str, float] = {}
    for r in rows:
        days[r["day"]] = days.get(r["day"], 0.0) + r["cost"]
    body = {"from": first, "to": last, "by": group, "rows": rows, "totals": totals, "cost_per_day": days}
    return msgspec.json.encode(body), "application/json"


async def spend_per_day(ledger: Ledger, days: int) -> list[dict[str, Any]] | None:
    """The status page's chart: cost and requests on each of the last `days` UTC days, oldest first, a day
    with nothing booked as zeros (a chart that skipped it would draw the days around it as neighbours);
    None while the ledger is away."""
    now = time.time()
    window = [day_of(now - ago * 86_400) for ago in range(days - 1, -1, -1)]
    sql = "SELECT day, sum(cost_pico), sum(requests) FROM daily WHERE day >= ? AND day <= ? GROUP BY day"
    try:
        found = await ledger.call(ledger.db.transaction, lambda cur: cur.rows(sql, (window[0], window[-1])))
    except LedgerDown:
        return None
    booked = {r[0]: (int(r[1]), int(r[2])) for r in found}
    return [
        {"day": day, "cost": usd(booked.get(day, (0, 0))[0]), "requests": booked.get(day, (0, 0))[1]} for day in window
    ]
