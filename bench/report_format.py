"""Cells and tables of the bench report: number formats, the measurement index and row labels."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from bench.report_run import RunResult
from bench.scenarios import (
    CACHE_TARGET,
    GRANIAN,
    HTTPTOOLS,
    HTTPX,
    LIMITS_TARGET,
    NOISY_PCT,
    TWO_WORKERS,
    Measurement,
)

# Above this busy share of the load generator's core, a row measures wrk rather than the server.
LOADGEN_SATURATED = 90.0


def num(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def delta(value: float | None, base: float | None, digits: int = 3) -> str:
    if value is None or base is None or math.isnan(value) or math.isnan(base):
        return "-"
    return f"{value - base:+.{digits}f}"


def ratio(value: float | None, base: float | None) -> str:
    if value is None or base is None or not base or math.isnan(value) or math.isnan(base):
        return "-"
    return f"{value / base:.2f}x"


def markdown_table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


class Index:
    def __init__(self, measurements: list[Measurement]) -> None:
        self._by_key = {(m.scenario, m.target, m.offered_rps): m for m in measurements}

    def get(self, scenario: str, target: str, offered: float | None = None) -> Measurement | None:
        m = self._by_key.get((scenario, target, offered))
        # A failed row (errors, or a server that died) must not leak into headline ratios.
        return m if m is not None and m.ok and m.requests else None

    def raw(self, scenario: str, target: str) -> Measurement | None:
        return self._by_key.get((scenario, target, None))

    def noisy(self, scenario: str, target: str) -> bool:
        m = self.get(scenario, target)
        return m is not None and (m.other_load_pct or 0.0) > NOISY_PCT

    def value(self, scenario: str, target: str, pick: Callable[[Measurement], float | None]) -> float | None:
        m = self.get(scenario, target)
        return pick(m) if m is not None else None


def target_label(target: str, result: RunResult) -> str:
    workers = result.settings.get("workers", 1)
    if target in ("gateway", LIMITS_TARGET, CACHE_TARGET):
        return f"{target} (workers={workers})"
    if target == TWO_WORKERS:
        return f"{target} (workers=2, unpinned)"
    if target == GRANIAN:
        return f"{target} (granian, workers={workers})"
    if target == HTTPTOOLS:
        return f"{target} (uvicorn's httptools protocol, workers={workers})"
    if target == HTTPX:
        return f"{target} (transport: httpx, workers={workers})"
    return target


def why_missing(idx: Index, scenario: str, target: str) -> str:
    """Why a figure is absent, in a few words for a table cell or a title."""
    m = idx.raw(scenario, target)
    if m is None:
        return "not run"
    if m.skipped:
        return "not run: " + (m.note or "").removeprefix("not run: ").split(" (")[0]
    return "failed, see Problems"


def loadgen_bound(m: Measurement | None) -> str:
    if m is None or not m.core_busy_pct or m.core_busy_pct.get("cpu1", 0.0) < LOADGEN_SATURATED:
        return ""
    return " (*lower bound*: load generator core saturated)"


def core_busy(m: Measurement) -> str:
    if not m.core_busy_pct:
        return "-"
    return f"{m.core_busy_pct.get('cpu0', 0):.0f} / {m.core_busy_pct.get('cpu1', 0):.0f}"
