"""The "Targets" section of docs/benchmarks.md: the performance issue's thresholds checked against one run."""

from __future__ import annotations

from bench.report_format import Index, markdown_table, why_missing
from bench.report_run import RunResult
from bench.report_template import Template
from bench.scenarios import CACHE_TARGET, LIMITS_TARGET, median_ratio, round_ratios

# (description, met?) thresholds of the performance issue, checked against this run's figures.
HOLD_TARGET_MB = 300.0
SOAK_TARGET_PCT = 10.0


def _verdict(met: bool | None) -> str:
    return "not measured" if met is None else "met" if met else "**NOT met**"


def targets_section(t: Template, idx: Index, result: RunResult) -> str:
    s = result.settings
    rps = lambda m: m.rps  # noqa: E731
    rows: list[list[str]] = []

    def add(target: str, measured: str, met: bool | None) -> None:
        rows.append([target, measured, _verdict(met)])

    # (a) limits throughput against the passthrough measured just before it, in the same scenario.
    lim = idx.value("limits_c32", LIMITS_TARGET, rps)
    pas = idx.value("limits_c32", "passthrough", rps)
    where = "in `limits_c32`"
    if pas is None:
        pas, where = idx.value("nonstream_c32", "passthrough", rps), "in `nonstream_c32`"
    if lim and pas:
        add(
            "gateway with Redis limits, c=32 throughput ≥ 0.6 × passthrough",
            f"{lim:,.0f} req/s = {lim / pas:.2f}x passthrough ({pas:,.0f}, measured {where})",
            lim >= 0.6 * pas,
        )
    else:
        why = (
            "run with `--limits-config bench/limits-redis.yaml`"
            if idx.raw("limits_c32", LIMITS_TARGET) is None
            else "row failed"
        )
        add("gateway with Redis limits, c=32 throughput ≥ 0.6 × passthrough", f"- ({why})", None)

    # The response cache: hits against the same requests through the loopback upstream, same scenario.
    # With rounds, the ratio is the median of the rounds' (each between two runs seconds apart).
    hit_m, miss_m = idx.get("cached_c32", CACHE_TARGET), idx.get("cached_c32", "gateway")
    hit, miss = idx.value("cached_c32", CACHE_TARGET, rps), idx.value("cached_c32", "gateway", rps)
    title = "cache hits, c=32 throughput ≥ 2 × the same requests through the upstream"
    hit_ratio = median_ratio(miss_m, hit_m)
    if hit and miss and hit_ratio is not None:
        rounds = round_ratios(miss_m, hit_m)
        each = f"; rounds {', '.join(f'{r:.2f}x' for r in rounds)}, the median" if len(rounds) > 1 else ""
        measured = f"{hit:,.0f} req/s = {hit_ratio:.2f}x the uncached gateway ({miss:,.0f}{each})"
        add(title, measured, hit_ratio >= 2.0)
    elif idx.raw("cached_c32", CACHE_TARGET) is not None:
        add(title, f"- ({why_missing(idx, 'cached_c32', CACHE_TARGET)})", None)

    # (b) c=1 added p50, gateway against passthrough.
    d, p, g = (idx.value("nonstream_c1", t, lambda m: m.p50_ms) for t in ("direct", "passthrough", "gateway"))
    if d is not None and p is not None and g is not None and p > d:
        g_add, p_add = g - d, p - d
        add(
            "c=1 added p50 ≤ 1.5 × the passthrough's added p50",
            f"+{g_add:.3f} ms vs +{p_add:.3f} ms = {g_add / p_add:.2f}x",
            g_add <= 1.5 * p_add,
        )
    else:
        add("c=1 added p50 ≤ 1.5 × the passthrough's added p50", "-", None)

    # (c) slow upstream at a fixed rate: added p50 and p99.
    title = f"{s['latency_ms']:g} ms upstream at {s['rate']:g} req/s: added p50 < 1 ms and added p99 < 5 ms"
    if (s["latency_ms"], s["rate"]) != (50.0, 500.0):
        title += " (the target is stated for 50 ms at 500 req/s)"
    d50, g50 = (idx.value("slow_fixed_rate", t, lambda m: m.p50_ms) for t in ("direct", "gateway"))
    d99, g99 = (idx.value("slow_fixed_rate", t, lambda m: m.p99_ms) for t in ("direct", "gateway"))
    if None not in (d50, g50, d99, g99):
        assert d50 is not None and g50 is not None and d99 is not None and g99 is not None
        add(title, f"p50 +{g50 - d50:.3f} ms, p99 +{g99 - d99:.3f} ms", g50 - d50 < 1.0 and g99 - d99 < 5.0)
    else:
        add(title, "-", None)

    # (d) stream TTFB added p50.
    dt, gt = (idx.value("stream_ttfb", t, lambda m: m.ttfb_p50_ms) for t in ("direct", "gateway"))
    if dt is not None and gt is not None:
        add("stream TTFB added p50 < 1 ms", f"+{gt - dt:.3f} ms", gt - dt < 1.0)
    else:
        add("stream TTFB added p50 < 1 ms", "-", None)

    # (e) RSS holding 1,000 streams.
    hold = idx.get("hold_streams", "gateway")
    title = f"gateway RSS holding 1,000 streams < {HOLD_TARGET_MB:g} MB"
    if hold is not None and hold.rss_hold_mib is not None:
        mb = hold.rss_hold_mib * 1.048576
        measured = f"{hold.rss_hold_mib:.1f} MiB = {mb:.0f} MB, {hold.concurrent_streams:,} streams open at once"
        if (hold.concurrent_streams or 0) < 1000:
            measured += f" (**{hold.concurrent_streams:,}, not 1,000**: quick mode or `--hold-streams`)"
        add(title, measured, mb < HOLD_TARGET_MB)
    else:
        add(title, f"- ({why_missing(idx, 'hold_streams', 'gateway')})", None)

    # (f) RSS growth over the soak.
    soak = idx.get("soak", "gateway")
    title = f"gateway RSS growth 100k → 1M requests within {SOAK_TARGET_PCT:g} %"
    if soak is not None and soak.rss_growth_pct is not None:
        measured = (
            f"{soak.rss_checkpoint_mib:.1f} MiB after {soak.checkpoint_requests:,} → {soak.rss_end_mib:.1f} MiB "
            f"after {soak.requests:,}: {soak.rss_growth_pct:+.1f} %"
        )
        if (soak.requests or 0) < 1_000_000:
            measured += " (**not 1M requests**: quick mode or `--soak-requests`)"
        add(title, measured, abs(soak.rss_growth_pct) <= SOAK_TARGET_PCT)
    else:
        add(title, f"- ({why_missing(idx, 'soak', 'gateway')})", None)

    return t.section("targets", table="\n".join(markdown_table(["target", "measured", "verdict"], rows)))
