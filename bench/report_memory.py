"""The memory sections of docs/benchmarks.md: RSS growth over the soak, RSS holding slow streams."""

from __future__ import annotations

from bench.report_format import Index, markdown_table, num, target_label, why_missing
from bench.report_run import RunResult
from bench.report_template import Template


def soak_section(t: Template, idx: Index, result: RunResult, common: dict[str, str]) -> str:
    soak = [m for m in result.measurements if m.scenario == "soak"]
    if not soak:
        return ""
    table = markdown_table(
        ["target", "requests", "RSS at checkpoint MiB", "RSS at end MiB", "growth", "req/s", "errors"],
        (
            [
                f"`{target_label(m.target, result)}`",
                num(m.requests, 0) if m.requests is not None else why_missing(idx, "soak", m.target),
                f"{num(m.rss_checkpoint_mib, 1)} (after {num(m.checkpoint_requests, 0)})",
                num(m.rss_end_mib, 1),
                f"{m.rss_growth_pct:+.1f} %" if m.rss_growth_pct is not None else "-",
                num(m.rps, 0),
                num(m.errors, 0),
            ]
            for m in soak
        ),
    )
    return t.section("soak", table="\n".join(table), **common)


def hold_section(t: Template, idx: Index, result: RunResult, common: dict[str, str]) -> str:
    hold = [m for m in result.measurements if m.scenario == "hold_streams"]
    if not hold:
        return ""
    table = markdown_table(
        [
            "target",
            "RSS idle MiB",
            "RSS peak holding MiB",
            "most open at once",
            "completed",
            "errors",
            "events/stream",
            "stream p50 / p99 ms",
        ],
        (
            [
                f"`{target_label(m.target, result)}`",
                num(m.rss_idle_mib, 1),
                num(m.rss_hold_mib, 1),
                num(m.concurrent_streams, 0),
                num(m.requests, 0) if m.requests is not None else why_missing(idx, "hold_streams", m.target),
                num(m.errors, 0),
                num(m.events_per_stream, 0),
                f"{num(m.total_p50_ms, 0)} / {num(m.total_p99_ms, 0)}",
            ]
            for m in hold
        ),
    )
    return t.section("hold", table="\n".join(table), **common)
