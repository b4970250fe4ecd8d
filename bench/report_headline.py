"""The headline table of docs/benchmarks.md: direct, passthrough and gateway side by side."""

from __future__ import annotations

from collections.abc import Callable

from bench.report_format import Index, delta, markdown_table, num, ratio, why_missing
from bench.report_run import RunResult
from bench.scenarios import GRANIAN, HTTPTOOLS, TWO_WORKERS, Measurement


def headline_table(idx: Index, result: RunResult) -> list[str]:
    s = result.settings
    chunks, latency, rate = s["chunks"], s["latency_ms"], s["rate"]
    soak_n, hold_n = s.get("soak_requests", 0), s.get("hold_streams", 0)
    rps = lambda m: m.rps  # noqa: E731
    rows: list[list[str]] = []

    def row(
        title: str,
        scenario: str,
        pick: Callable[[Measurement], float | None],
        digits: int,
        kind: str,
        gateway: str = "gateway",
    ) -> None:
        """``kind``: "ratio" (values and ratios), "delta" (direct value, others as added), "plain"
        (values only). ``gateway`` names the target shown in the gateway column."""
        columns = ("direct", "passthrough", gateway)
        d, p, g = (idx.value(scenario, t, pick) for t in columns)
        # A dagger marks a cell built from a row that other processes disturbed (see Problems).
        mark = dict(zip(("d", "p", "g"), (" †" if idx.noisy(scenario, t) else "" for t in columns), strict=True))
        if kind == "ratio":
            cells = [num(d, digits), num(p, digits), num(g, digits), ratio(g, d), ratio(g, p)]
        elif kind == "delta":
            cells = [num(d, digits), delta(p, d, digits), delta(g, d, digits), "-", delta(g, p, digits)]
        else:
            cells = [num(d, digits), num(p, digits), num(g, digits), "-", "-"]
        derived = kind == "delta"
        marks = [
            mark["d"],
            mark["p"] or (mark["d"] if derived else ""),
            mark["g"] or (mark["d"] if derived else ""),
            mark["g"] or mark["d"],
            mark["g"] or mark["p"],
        ]
        rows.append([title, *(cell + m if cell != "-" else cell for cell, m in zip(cells, marks, strict=True))])

    row("Throughput, non-streaming, c=32 (req/s)", "nonstream_c32", rps, 0, "ratio")
    single = idx.value("nonstream_c32", "gateway", rps)
    two = idx.value("nonstream_c32", TWO_WORKERS, rps)
    row(
        "Throughput, c=32, gateway with 2 workers, unpinned (req/s; "
        + (
            f"{ratio(two, single)} the 1-worker gateway)"
            if two and single
            else f"{why_missing(idx, 'nonstream_c32', TWO_WORKERS)})"
        ),
        "nonstream_c32",
        rps,
        0,
        "ratio",
        gateway=TWO_WORKERS,
    )
    for target, title, versus in (
        (GRANIAN, "gateway on granian", "uvicorn"),
        (HTTPTOOLS, "gateway on uvicorn's httptools protocol", "the gateway's own protocol"),
    ):
        value = idx.value("nonstream_c32", target, rps)
        row(
            f"Throughput, c=32, {title} (req/s; "
            + (
                f"{ratio(value, single)} {versus})"
                if value and single
                else f"{why_missing(idx, 'nonstream_c32', target)})"
            ),
            "nonstream_c32",
            rps,
            0,
            "ratio",
            gateway=target,
        )
    row("CPU s per 1,000 req, c=32 (server process)", "nonstream_c32", lambda m: m.cpu_s_per_1k, 3, "ratio")
    row("Peak RSS, MiB (server process tree)", "nonstream_c32", lambda m: m.peak_rss_mib, 1, "ratio")
    row("Latency p50 at c=1, ms (direct; others: added)", "nonstream_c1", lambda m: m.p50_ms, 3, "delta")
    row("Latency p90 at c=1, ms (direct; others: added)", "nonstream_c1", lambda m: m.p90_ms, 3, "delta")
    row("Latency p99 at c=1, ms (direct; others: added)", "nonstream_c1", lambda m: m.p99_ms, 3, "delta")
    row(f"Streams/s, {chunks} chunks, c=32", "stream_c32", rps, 0, "ratio")
    row(f"CPU s per 1,000 streams of {chunks} chunks", "stream_c32", lambda m: m.cpu_s_per_1k, 3, "ratio")
    row("Stream TTFB p50, ms (direct; others: added)", "stream_ttfb", lambda m: m.ttfb_p50_ms, 3, "delta")
    row("Stream TTFB p90, ms (direct; others: added)", "stream_ttfb", lambda m: m.ttfb_p90_ms, 3, "delta")
    row(
        f"{latency:g} ms upstream at {rate:g} req/s: p50 ms (added)",
        "slow_fixed_rate",
        lambda m: m.p50_ms,
        3,
        "delta",
    )
    row(
        f"{latency:g} ms upstream at {rate:g} req/s: p99 ms (added)",
        "slow_fixed_rate",
        lambda m: m.p99_ms,
        3,
        "delta",
    )
    row(
        f"RSS growth, {soak_n // 10:,} → {soak_n:,} requests, % (VmRSS)",
        "soak",
        lambda m: m.rss_growth_pct,
        1,
        "plain",
    )
    row(f"RSS holding {hold_n:,} slow streams, MiB (peak VmRSS)", "hold_streams", lambda m: m.rss_hold_mib, 1, "ratio")
    return markdown_table(["", "direct", "passthrough", "gateway", "gateway / direct", "gateway vs passthrough"], rows)
