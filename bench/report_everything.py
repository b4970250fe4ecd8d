"""The "Everything on" section of docs/benchmarks.md: the ``all_*`` rows against the passthrough of the same scenario.

Each row's ratio is taken against the passthrough (or the 2-process passthrough) measured seconds before it in
the same scenario, so the machine's drift over the run does not enter the ratio; a scenario measured in rounds
(``--everything-rounds``) has the median of its rounds' ratios, and each target's median run for the rest.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from bench.everything import EVERYTHING, EVERYTHING_2W, EVERYTHING_PG, PASSTHROUGH_2W
from bench.scenarios import TWO_WORKERS, Measurement, round_ratios
from bench.soak_everything import SCENARIO as SOAK

# The goals: every feature on, at least this many times the thin proxy's throughput, and the latency it adds at
# one connection at most this many times the thin proxy's.
THROUGHPUT_GOAL = 1.5
ADDED_P50_GOAL = 1.5

THROUGHPUT_ROWS = (
    ("all_c32", EVERYTHING, "completions, every request a cache miss"),
    ("all_c32", EVERYTHING_PG, "the same, ledger on PostgreSQL"),
    ("all_hits_c32", EVERYTHING, "completions, every answer a cache hit"),
    ("all_chat_c32", EVERYTHING, "chat, every request a miss"),
    ("all_stream_c32", EVERYTHING, "completions streamed, misses"),
    ("all_chat_stream_c32", EVERYTHING, "chat streamed, misses"),
    ("all_2w_c32", EVERYTHING_2W, "two workers, completions, misses"),
)
LATENCY_ROWS = (
    ("all_c1", "completions, one connection"),
    ("all_chat_c1", "chat, one connection"),
)


def get(measurements: list[Measurement], scenario: str, target: str) -> Measurement | None:
    for m in measurements:
        if m.scenario == scenario and m.target == target and m.ok and m.requests:
            return m
    return None


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _x(value: float | None, base: float | None) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}x"


def section(measurements: list[Measurement], table: Callable[[list[str], list[list[str]]], list[str]]) -> str:
    """Markdown for the everything-on rows; empty when none was run (the soak has a table of its own)."""
    if not any(m.scenario.startswith("all_") and m.scenario != SOAK for m in measurements):
        return ""
    rows: list[list[str]] = []
    for scenario, target, what in THROUGHPUT_ROWS:
        floor_name = PASSTHROUGH_2W if target == EVERYTHING_2W else "passthrough"
        plain_name = TWO_WORKERS if target == EVERYTHING_2W else "gateway"
        m, floor, plain = (get(measurements, scenario, t) for t in (target, floor_name, plain_name))
        if m is None and floor is None:
            continue
        rounds = round_ratios(floor, m)
        ratio = statistics.median(rounds) if rounds else None
        rows.append(
            [
                f"`{scenario}` {what}",
                _fmt(floor.rps if floor else None, 0),
                _fmt(plain.rps if plain else None, 0),
                _fmt(m.rps if m else None, 0) if m else "failed or not run",
                "-" if ratio is None else f"{ratio:.2f}x" + ("" if ratio >= THROUGHPUT_GOAL else " (**below**)"),
                ", ".join(f"{r:.2f}x" for r in rounds) if len(rounds) > 1 else "-",
                _x(m.rps if m else None, plain.rps if plain else None),
                _fmt(floor.cpu_s_per_1k if floor else None, 3),
                _fmt(m.cpu_s_per_1k if m else None, 3),
                _fmt(m.p99_ms if m else None, 2),
            ]
        )
    lines = table(
        [
            "load (c=32)",
            "passthrough req/s",
            "gateway, nothing on",
            "everything on",
            f"on / passthrough (goal ≥ {THROUGHPUT_GOAL:g}x)",
            "each round",
            "on / nothing on",
            "passthrough CPU s/1k",
            "on CPU s/1k",
            "on p99 ms",
        ],
        rows,
    )
    latency: list[list[str]] = []
    for scenario, what in LATENCY_ROWS:
        direct, floor, plain, m = (
            get(measurements, scenario, t) for t in ("direct", "passthrough", "gateway", EVERYTHING)
        )
        if direct is None or direct.p50_ms is None:
            continue

        def added(x: Measurement | None, base: float = direct.p50_ms) -> float | None:
            return x.p50_ms - base if x is not None and x.p50_ms is not None else None

        f_add, p_add, m_add = added(floor), added(plain), added(m)
        ratio = m_add / f_add if m_add is not None and f_add else None
        latency.append(
            [
                f"`{scenario}` {what}",
                _fmt(direct.p50_ms, 3),
                "-" if f_add is None else f"+{f_add:.3f}",
                "-" if p_add is None else f"+{p_add:.3f}",
                "-" if m_add is None else f"+{m_add:.3f}",
                "-" if ratio is None else f"{ratio:.2f}x" + ("" if ratio <= ADDED_P50_GOAL else " (**above**)"),
            ]
        )
    if latency:
        lines += ["", "Latency added at one connection (p50, ms, over the upstream alone):", ""]
        lines += table(
            [
                "load",
                "direct p50",
                "passthrough adds",
                "gateway, nothing on, adds",
                "everything on adds",
                f"on / passthrough (goal ≤ {ADDED_P50_GOAL:g}x)",
            ],
            latency,
        )
    return "\n".join(lines)


def soak(measurements: list[Measurement], table: Callable[[list[str], list[list[str]]], list[str]]) -> str:
    """Markdown for the everything-on soak: RSS before the load, after every tenth and at the end, and what the
    cache's memory store held then against its bound; empty when it was not run."""
    rows: list[list[str]] = []
    for m in measurements:
        if m.scenario != SOAK or m.skipped:
            continue
        series = m.rss_series_mib or []
        rows.append(
            [
                f"`{m.target}`",
                _fmt(m.requests, 0) if m.requests else "failed, see Problems",
                _fmt(m.rss_idle_mib, 1),
                " → ".join(f"{rss:.0f}" for _, rss in series[1:-1]) or "-",
                _fmt(m.rss_end_mib, 1),
                "-" if m.rss_growth_pct is None else f"{m.rss_growth_pct:+.1f} %",
                "-" if m.cache_entries is None else f"{m.cache_entries:,}",
                _held(m.cache_bytes, m.cache_max_bytes),
                "-" if m.cache_evictions is None else f"{m.cache_evictions:,}",
                _fmt(m.rps, 0),
                _fmt(m.errors, 0),
            ]
        )
    if not rows:
        return ""
    return "\n".join(
        table(
            [
                "target",
                "requests",
                "RSS at start MiB",
                "RSS after each tenth MiB",
                "RSS at end MiB",
                "growth after the first tenth",
                "cache entries at end",
                "cache MiB of its bound",
                "evictions",
                "req/s",
                "errors",
            ],
            rows,
        )
    )


def _held(size: int | None, bound: int | None) -> str:
    if size is None or not bound:
        return "-"
    mib = 1024 * 1024
    return f"{size / mib:.1f} of {bound / mib:.0f} ({size / bound:.0%})"
