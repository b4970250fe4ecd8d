"""The per-scenario tables of docs/benchmarks.md: every measurement, columns chosen by load tool."""

from __future__ import annotations

from collections.abc import Callable

from bench.report_format import core_busy, markdown_table, num, target_label
from bench.report_run import RunResult
from bench.report_template import Template
from bench.scenarios import Measurement


def scenarios_section(t: Template, result: RunResult) -> str:
    """Every measurement, one table per scenario."""
    by_scenario: dict[str, list[Measurement]] = {}
    for m in result.measurements:
        by_scenario.setdefault(m.scenario, []).append(m)
    parts: list[str] = []
    for scenario, items in by_scenario.items():
        placements = list(dict.fromkeys(m.placement for m in items if m.placement))
        if scenario == "load_sweep":
            items = sorted(items, key=lambda m: m.offered_rps or 0.0)
        columns = _columns(items[0].tool, scenario)
        table = markdown_table([c[0] for c in columns], ([c[1](m, result) for c in columns] for m in items))
        parts.append(
            t.section(
                "scenario",
                scenario=scenario,
                tool=items[0].tool,
                upstream=items[0].upstream,
                placement="; ".join(placements) if placements else "-",
                table="\n".join(table),
            )
        )
    return "\n".join(parts)


Cell = Callable[[Measurement, RunResult], str]


def _columns(tool: str, scenario: str) -> list[tuple[str, Cell]]:
    target: tuple[str, Cell] = ("target", lambda m, r: target_label(m.target, r))
    errors: tuple[str, Cell] = (
        "errors",
        lambda m, r: num(m.errors, 0) if m.requests is not None else "not run" if m.skipped else "failed",
    )
    other: tuple[str, Cell] = ("other load %", lambda m, r: num(m.other_load_pct, 0))
    if tool == "ttfb":
        return [
            target,
            ("streams", lambda m, r: num(m.requests, 0)),
            ("events/stream", lambda m, r: num(m.events_per_stream, 0)),
            ("TTFB p50", lambda m, r: num(m.ttfb_p50_ms, 3)),
            ("TTFB p90", lambda m, r: num(m.ttfb_p90_ms, 3)),
            ("TTFB p99", lambda m, r: num(m.ttfb_p99_ms, 3)),
            ("total p50", lambda m, r: num(m.total_p50_ms, 3)),
            ("total p90", lambda m, r: num(m.total_p90_ms, 3)),
            ("CPU s/1k", lambda m, r: num(m.cpu_s_per_1k, 3)),
            errors,
            other,
        ]
    if tool == "hold":
        return [
            target,
            ("streams completed", lambda m, r: num(m.requests, 0)),
            ("most open at once", lambda m, r: num(m.concurrent_streams, 0)),
            ("events/stream", lambda m, r: num(m.events_per_stream, 0)),
            ("TTFB p50", lambda m, r: num(m.ttfb_p50_ms, 1)),
            ("TTFB p99", lambda m, r: num(m.ttfb_p99_ms, 1)),
            ("stream p50", lambda m, r: num(m.total_p50_ms, 0)),
            ("stream p99", lambda m, r: num(m.total_p99_ms, 0)),
            ("RSS idle MiB", lambda m, r: num(m.rss_idle_mib, 1)),
            ("RSS peak MiB", lambda m, r: num(m.rss_hold_mib, 1)),
            ("CPU s/1k", lambda m, r: num(m.cpu_s_per_1k, 3)),
            errors,
            ("busy % core0 / core1", lambda m, r: core_busy(m)),
            other,
        ]
    columns: list[tuple[str, Cell]] = [target]
    if scenario == "load_sweep":
        columns = [("offered req/s", lambda m, r: num(m.offered_rps, 0)), target]
    columns += [
        ("requests", lambda m, r: num(m.requests, 0)),
        ("req/s", lambda m, r: num(m.rps, 0)),
    ]
    if tool == "soak":
        columns += [
            ("RSS at checkpoint MiB", lambda m, r: num(m.rss_checkpoint_mib, 1)),
            ("RSS at end MiB", lambda m, r: num(m.rss_end_mib, 1)),
            ("growth %", lambda m, r: num(m.rss_growth_pct, 1)),
        ]
    else:
        columns.append(("mean", lambda m, r: num(m.mean_ms, 3)))
    columns += [
        ("p50", lambda m, r: num(m.p50_ms, 3)),
        ("p90", lambda m, r: num(m.p90_ms, 3)),
        ("p99", lambda m, r: num(m.p99_ms, 3)),
        ("max", lambda m, r: num(m.max_ms, 3)),
        ("CPU s/1k", lambda m, r: num(m.cpu_s_per_1k, 3)),
        ("peak RSS MiB", lambda m, r: num(m.peak_rss_mib, 1)),
        errors,
        ("busy % core0 / core1", lambda m, r: core_busy(m)),
        other,
    ]
    return columns
