"""Usage from the ledger: over any range of days (JSON or CSV), one day per key and model, spend per day.

Every view reads the rollups (which equal the sum of their rows) plus this process's rows the writer has
not committed yet (`Ledger.read`), so each row is counted once, whether committed or waiting. Rows other
processes have not committed yet (at most their last `flush_ms`) show once they are.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec

from gateway.ledger.book import Ledger
from gateway.ledger.engine import LedgerDown
from gateway.limits.auth import shown_as
from gateway.limits.saturating import INT64_MAX
from gateway.limits.usage import day_of, usd
from wire.errors import shown

# Per grouping, its columns and their places in a rollup's key (day, key_name, team, model, target, key_id).
BY: Final = {"key": ("key_name", "key_id"), "team": ("team",), "model": ("model",), "target": ("target",)}
_AT: Final = {"key_name": 1, "team": 2, "model": 3, "target": 4, "key_id": 5}
_NAMES: Final = {"key_name": "key", "key_id": "key_id"}
MAX_DAYS: Final = 366
_FIELDS: Final = ("requests", "errors", "prompt_tokens", "completion_tokens", "cost")
_SUMS: Final = (
    "sum64(requests), sum64(errors), sum64(prompt_tokens), sum64(completion_tokens), sum64(cost_pico), sum64(cached)"
)
_FORMULA: Final = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet reads as the start of a formula


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
    raise ReportError(f"Invalid {param} {shown(value)!r}: expected YYYY-MM-DD (UTC)", param)


def _cell(value: Any) -> Any:
    """A CSV cell a spreadsheet will not run: text that starts like a formula gets a leading quote."""
    return "'" + value if isinstance(value, str) and value.startswith(_FORMULA) else value


async def report(
    ledger: Ledger, start: str | None, end: str | None, by: str | None, fmt: str | None, team: str | None = None
) -> tuple[bytes, str]:
    """The usage of every day from `start` to `end` grouped `by`, as JSON or CSV; with a `team`, its rows alone."""
    today = day_of(time.time())
    first = _day(start, "from", today)
    last = _day(end, "to", first if start else today)
    if last < first:
        raise ReportError(f"'to' ({last}) is before 'from' ({first})", "to")
    if (dt.date.fromisoformat(last) - dt.date.fromisoformat(first)).days >= MAX_DAYS:
        raise ReportError(f"at most {MAX_DAYS} days per report", "to")
    group = by or "key"
    if group not in BY:
        raise ReportError(f"Invalid by {shown(group)!r}: one of {', '.join(BY)}", "by")
    kind = fmt or "json"
    if kind not in ("json", "csv"):
        raise ReportError(f"Invalid format {shown(kind)!r}: json or csv", "format")
    columns = BY[group]
    # By key, each row's team too: the operator's report names a runtime key of a team `team/name`.
    read = (*columns, "team") if group == "key" else columns
    listed = ", ".join(read)
    only, args = (" AND team = ?", (first, last, team)) if team is not None else ("", (first, last))
    sql = f"SELECT day, {listed}, {_SUMS} FROM daily WHERE day >= ? AND day <= ?{only} GROUP BY day, {listed}"
    found, waiting = await ledger.read(lambda cur: cur.rows(sql, args))

    def keyed(day: str, values: tuple[Any, ...]) -> tuple[Any, ...]:
        if group != "key":
            return (day, *values)
        name, key_id, booked_under = values
        return (day, name if team is not None else shown_as(name, booked_under, key_id or ""), key_id)

    sums: dict[tuple[Any, ...], list[int]] = {}
    for f in found:
        _add(sums.setdefault(keyed(f[0], tuple(f[1 : 1 + len(read)])), [0] * 6), f[1 + len(read) :])
    for k, v in waiting.items():
        if first <= k[0] <= last and (team is None or k[_AT["team"]] == team):
            _add(sums.setdefault(keyed(k[0], tuple(k[_AT[c]] for c in read)), [0] * 6), v)
    names = [_NAMES.get(c, c) for c in columns]
    rows = [
        {
            "day": k[0],
            **dict(zip(names, k[1:], strict=True)),
            "requests": v[0],
            "errors": v[1],
            "prompt_tokens": v[2],
            "completion_tokens": v[3],
            "cost": usd(v[4]),
        }
        for k, v in sorted(sums.items())
    ]
    if kind == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=["day", *names, *_FIELDS], lineterminator="\n")
        writer.writeheader()
        writer.writerows({f: _cell(v) for f, v in r.items()} for r in rows)
        return out.getvalue().encode(), "text/csv; charset=utf-8"
    totals = {f: sum(r[f] for r in rows) if f == "cost" else min(sum(r[f] for r in rows), INT64_MAX) for f in _FIELDS}
    days: dict[str, float] = {}
    for r in rows:
        days[r["day"]] = days.get(r["day"], 0.0) + r["cost"]
    body = {"from": first, "to": last, "by": group, "rows": rows, "totals": totals, "cost_per_day": days}
    return msgspec.json.encode(body), "application/json"


def _add(into: list[int], sums: Sequence[Any]) -> None:
    for i, x in enumerate(sums):
        into[i] = min(into[i] + int(x), INT64_MAX)


def _usage(v: list[int]) -> dict[str, Any]:
    return {
        "requests": v[0],
        "errors": v[1],
        "prompt_tokens": v[2],
        "completion_tokens": v[3],
        "cost": usd(v[4]),
        "cached": v[5],
    }


async def day_usage(
    ledger: Ledger, day: str, roster: Mapping[str, float | None], team: str | None = None
) -> dict[str, Any]:
    """One UTC day's books per key and model, in `/admin/usage?day=`'s shape: every key of `roster` (its label
    -> its daily budget, `KeyRing.roster`) listed, zeros when unused, plus any other key booked that day, each
    by its label (`shown_as`); with a `team`, the rows booked under it alone, by name."""
    only, args = (" AND team = ?", (day, team)) if team is not None else ("", (day,))
    grouped = "key_name, team, key_id, model"
    sql = f"SELECT {grouped}, {_SUMS} FROM daily WHERE day = ?{only} GROUP BY {grouped}"
    found, waiting = await ledger.read(lambda cur: cur.rows(sql, args))

    def label(name: str, booked_under: str, key_id: str | None) -> str:
        return name if team is not None else shown_as(name, booked_under, key_id or "")

    per: dict[str, dict[str, list[int]]] = {name: {} for name in roster}
    for f in found:
        _add(per.setdefault(label(f[0], f[1], f[2]), {}).setdefault(f[3], [0] * 6), f[4:])
    for k, v in waiting.items():
        if k[0] == day and (team is None or k[_AT["team"]] == team):
            _add(per.setdefault(label(k[1], k[2], k[5]), {}).setdefault(k[3], [0] * 6), v)
    keys = {}
    for name in sorted(per):
        models = per[name]
        whole = [min(sum(m[i] for m in models.values()), INT64_MAX) for i in range(6)]
        keys[name] = {
            **_usage(whole),
            "budget": roster.get(name),
            "by_model": {model: _usage(models[model]) for model in sorted(models)},
        }
    return {"day": day, "keys": keys}


async def spend_per_day(ledger: Ledger, days: int, team: str | None = None) -> list[dict[str, Any]] | None:
    """The status page's chart: cost and requests on each of the last `days` UTC days, oldest first, a day
    with nothing booked as zeros (a chart that skipped it would draw the days around it as neighbours);
    with a `team`, the rows booked under it alone; None while the ledger is away."""
    now = time.time()
    window = [day_of(now - ago * 86_400) for ago in range(days - 1, -1, -1)]
    only, args = (" AND team = ?", (window[0], window[-1], team)) if team is not None else ("", (window[0], window[-1]))
    sql = f"SELECT day, sum64(cost_pico), sum64(requests) FROM daily WHERE day >= ? AND day <= ?{only} GROUP BY day"
    try:
        found, waiting = await ledger.read(lambda cur: cur.rows(sql, args))
    except LedgerDown:
        return None
    booked = {r[0]: [int(r[1]), int(r[2])] for r in found}
    for k, v in waiting.items():
        if window[0] <= k[0] <= window[-1] and (team is None or k[_AT["team"]] == team):
            into = booked.setdefault(k[0], [0, 0])
            into[0] = min(into[0] + v[4], INT64_MAX)
            into[1] = min(into[1] + v[0], INT64_MAX)
    return [
        {"day": day, "cost": usd(booked.get(day, [0, 0])[0]), "requests": booked.get(day, [0, 0])[1]} for day in window
    ]
