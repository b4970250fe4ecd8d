"""The bench report (docs/benchmarks.md) rendered from its template (bench/report.md) and a synthetic run.

No benchmark runs here: a small made-up `RunResult` with distinctive figures is rendered, and each figure
must appear in its own section, in the row or line it belongs to.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from bench.report import TEMPLATE, render_markdown
from bench.report_run import RunResult
from bench.scenarios import GRANIAN, HTTPX, LIMITS_TARGET, TWO_WORKERS, Measurement

SETTINGS: dict[str, Any] = {
    "duration_s": 10.0,
    "warmup_s": 2.0,
    "connections": 32,
    "chunks": 100,
    "chunk_interval_ms": 0.0,
    "latency_ms": 50.0,
    "rate": 500.0,
    "rate_count": 5000,
    "rate_warmup": 500,
    "ttfb_streams": 300,
    "ttfb_warmup": 30,
    "workers": 1,
    "pin": True,
    "soak_requests": 1_000_000,
    "soak_checkpoint": 100_000,
    "soak_passthrough": False,
    "hold_streams": 1000,
    "hold_interval_ms": 50.0,
    "sweep_rates": "500,1000",
    "sweep_seconds": 4.0,
    "sweep_warmup_s": 0.5,
    "targets": "direct,passthrough,gateway",
    "only": None,
    "limits_config": "bench/limits-redis.yaml",
    "wait_idle_s": 0.0,
}


def _m(scenario: str, target: str, tool: str = "wrk", **fields: Any) -> Measurement:
    base: dict[str, Any] = {"ok": True, "placement": "split", "requests": 10_000, "errors": 0}
    if tool == "wrk":
        base.update(mean_ms=1.0, p50_ms=1.0, p90_ms=2.0, p99_ms=3.0, max_ms=4.0, cpu_s_per_1k=0.1, peak_rss_mib=50.0)
    base.update(fields)
    return Measurement(scenario=scenario, target=target, upstream="nginx", tool=tool, **base)


def synthetic(*, noisy: bool = False, pin: bool = True, limits: bool = True) -> RunResult:
    """A run with every section filled; the figures tests look for are distinctive numbers."""
    ms = [
        _m("nonstream_c32", "direct", rps=41_111.0, cpu_s_per_1k=0.011, core_busy_pct={"cpu0": 30.0, "cpu1": 95.0}),
        _m("nonstream_c32", "passthrough", rps=5_222.0, cpu_s_per_1k=0.19),
        _m("nonstream_c32", "gateway", rps=4_333.0, cpu_s_per_1k=0.231, peak_rss_mib=87.5),
        _m("nonstream_c32", TWO_WORKERS, rps=6_444.0, placement="unpinned"),
        _m("nonstream_c32", GRANIAN, ok=False, skipped=True, requests=None, note="not run: granian missing (pip)"),
        _m("nonstream_c32", HTTPX, rps=488.0, other_load_pct=35.0 if noisy else 0.0),
        _m("pyupstream_c32", "direct", rps=21_555.0),
        _m("nonstream_c1", "direct", p50_ms=0.101, placement="shared"),
        _m("nonstream_c1", "passthrough", p50_ms=0.301, placement="shared"),
        _m("nonstream_c1", "gateway", p50_ms=0.391, placement="shared"),
        _m("stream_c32", "direct", rps=3_666.0),
        _m("stream_c32", "passthrough", rps=999.0),
        _m("stream_c32", "gateway", rps=777.0, ok=False, note="errors: 12 non-2xx answers"),
        _m("stream_ttfb", "direct", "ttfb", ttfb_p50_ms=0.111, events_per_stream=100),
        _m("stream_ttfb", "gateway", "ttfb", ttfb_p50_ms=0.777, events_per_stream=100),
        _m("slow_fixed_rate", "direct", "rate", p50_ms=50.2, p99_ms=51.0),
        _m("slow_fixed_rate", "gateway", "rate", p50_ms=50.6, p99_ms=53.5),
        _m("load_sweep", "direct", "sweep", offered_rps=500.0, rps=500.0, p50_ms=0.5, p90_ms=0.6, p99_ms=0.7),
        _m("load_sweep", "gateway", "sweep", offered_rps=500.0, rps=499.0, p50_ms=0.81, p90_ms=0.92, p99_ms=1.23),
        _m("load_sweep", "direct", "sweep", offered_rps=1000.0, rps=1000.0, p50_ms=0.5, p90_ms=0.6, p99_ms=0.7),
        _m("load_sweep", "gateway", "sweep", offered_rps=1000.0, rps=998.0, errors=3, p50_ms=1.1, p99_ms=9.87),
        _m(
            "soak",
            "gateway",
            "soak",
            requests=1_000_000,
            checkpoint_requests=100_000,
            rss_checkpoint_mib=80.0,
            rss_end_mib=81.2,
            rss_growth_pct=1.5,
            rps=4000.0,
        ),
        _m(
            "hold_streams",
            "gateway",
            "hold",
            requests=1000,
            concurrent_streams=1000,
            rss_idle_mib=70.0,
            rss_hold_mib=123.4,
            events_per_stream=100,
            total_p50_ms=5100.0,
            total_p99_ms=5300.0,
        ),
    ]
    if limits:
        ms += [
            _m("limits_c32", "passthrough", rps=5_100.0),
            _m("limits_c32", "gateway", rps=4_400.0),
            _m("limits_c32", LIMITS_TARGET, rps=3_555.0),
        ]
    command = ".venv/bin/python -m bench" + (" --limits-config bench/limits-redis.yaml" if limits else "")
    return RunResult(
        started_at="2026-11-24 01:00:00 UTC",
        finished_at="2026-11-24 01:10:00 UTC",
        elapsed_s=600.0,
        mode="full",
        command=command,
        machine={"cpu": "Test CPU 9000", "nproc": "2", "busy before run": ("40" if noisy else "3") + "% of one core"},
        versions={"python": "3.11.9", "litestar": "2.25.0"},
        settings={**SETTINGS, "pin": pin},
        startup_errors={"gateway-x": "Traceback: boom"} if noisy else {},
        measurements=ms,
        skipped={GRANIAN: "granian is not installed"},
    )


def section(markdown: str, title: str) -> str:
    """The text of one `## ` section, up to the next one."""
    found = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", markdown, re.M | re.S)
    assert found, f"no section {title!r}"
    return found.group(1)


def row(text: str, first_cell: str) -> str:
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"| {first_cell} |")]
    return line


def test_the_template_is_a_file_with_every_section() -> None:
    text = Path(TEMPLATE).read_text()
    for title in ("Headline", "Upstream ceilings", "All measurements", "Setup", "Method"):
        assert f"## {title}" in text
    assert "$" in text  # placeholders: the figures are not in the template


def test_figures_land_in_their_sections() -> None:
    md = render_markdown(synthetic(), plot=None, plot_note="plot skipped: --no-plot")
    assert md.startswith("# Benchmarks\n\nGenerated by `bench` on 2026-11-24 01:10:00 UTC (full mode, 600 s).")
    titles = re.findall(r"^## (.*)$", md, re.M)
    assert titles == [
        "Problems in this run",
        "Targets",
        "Headline",
        "Gateway variants (non-streaming, c=32)",
        "Latency vs offered load",
        "Memory over 1,000,000 requests",
        "Memory holding 1,000 slow streams",
        "Fleet routing",
        "Fair share under saturation",
        "Upstream ceilings",
        "All measurements",
        "Setup",
        "Method",
    ]
    problems = section(md, "Problems in this run")
    assert "- `gateway-granian` was not run: granian is not installed." in problems
    assert "- `stream_c32` / `gateway`: errors: 12 non-2xx answers" in problems

    headline = section(md, "Headline")
    assert row(headline, "Throughput, non-streaming, c=32 (req/s)") == (
        "| Throughput, non-streaming, c=32 (req/s) | 41,111 | 5,222 | 4,333 | 0.11x | 0.83x |"
    )
    assert row(headline, "Latency p50 at c=1, ms (direct; others: added)").startswith(
        "| Latency p50 at c=1, ms (direct; others: added) | 0.101 | +0.200 | +0.290 | - | +0.090 |"
    )
    assert "(req/s; 1.49x the 1-worker gateway)" in headline
    assert "(req/s; not run: granian missing)" in headline
    assert "0.231" in row(headline, "CPU s per 1,000 req, c=32 (server process)")

    targets = section(md, "Targets")
    assert "3,555 req/s = 0.70x passthrough (5,100, measured in `limits_c32`)" in targets
    assert "+0.290 ms vs +0.200 ms = 1.45x" in targets
    assert "p50 +0.400 ms, p99 +2.500 ms" in targets
    assert "| stream TTFB added p50 < 1 ms | +0.666 ms | met |" in targets

    variants = section(md, "Gateway variants (non-streaming, c=32)")
    assert "| `gateway-2w (workers=2, unpinned)` | 6,444 | 1.49x | 1.23x |" in variants
    sweep = section(md, "Latency vs offered load")
    assert "| 1,000 | 1,000, 0.50 / 0.60 / 0.70 | 998, 1.10 / - / 9.87, **3 errors** |" in sweep
    assert "(plot skipped: --no-plot.)" in sweep
    assert "| `gateway (workers=1)` | 1,000,000 | 80.0 (after 100,000) | 81.2 | +1.5 % |" in section(
        md, "Memory over 1,000,000 requests"
    )
    assert "| `gateway (workers=1)` | 70.0 | 123.4 | 1,000 |" in section(md, "Memory holding 1,000 slow streams")

    ceilings = section(md, "Upstream ceilings")
    assert "**41,111 req/s** (*lower bound*: load generator core saturated)" in ceilings
    assert "**21,555 req/s**" in ceilings and "**3,666 streams/s**" in ceilings
    assert "### `stream_ttfb` (ttfb, upstream: nginx, placement: split)" in section(md, "All measurements")
    setup = section(md, "Setup")
    assert "- **cpu**: Test CPU 9000" in setup and "- litestar: 2.25.0" in setup
    method = section(md, "Method")
    assert "`wrk -t1 -c<N> -d10s --latency`" in method and "after a 2 s unmeasured warm-up" in method
    assert "throughput and fixed-rate rows (`split`) pin" in method


def test_optional_parts_follow_the_run() -> None:
    quiet = render_markdown(synthetic(limits=False, pin=False))
    assert "redis-server" not in quiet and "Noisy run" not in quiet
    assert "- Placement: no CPU pinning" in section(quiet, "Method")
    assert "run with `--limits-config bench/limits-redis.yaml`" in section(quiet, "Targets")
    noisy = render_markdown(synthetic(noisy=True), plot=Path("/tmp/docs/benchmarks.png"), md_dir=Path("/tmp/docs"))
    assert "> **Noisy run:** other processes already used 40% of a core" in noisy
    assert "- `gateway-x` did not start:\n\n```\nTraceback: boom\n```" in noisy
    assert "used 35% of a core during the window (after one repeat); treat this row as noisy" in noisy
    assert "† marks a figure taken while processes outside the bench" in section(noisy, "Headline")
    assert "![Latency percentiles versus offered load](benchmarks.png)" in section(noisy, "Latency vs offered load")
    assert "redis-server --port 6499" in noisy


def test_fleet_report_is_its_own_file_with_the_runs_ratios() -> None:
    """`make bench` rewrites docs/benchmarks.md; the fleet figures live in a file bench.fleet writes itself."""
    import argparse

    from bench.fleet import report

    rows = [
        {"workload": "few-shot", "policy": "round_robin", "rps": 50.0, "p50": 300.0, "p99": 600.0},
        {"workload": "few-shot", "policy": "prefix", "rps": 80.0, "p50": 90.0, "p99": 500.0},
    ]
    args = argparse.Namespace(replicas=4, requests=240, concurrency=24, repeat=3, workloads="few-shot")
    md = report(args, rows)
    assert md.startswith("# Fleet routing benchmark\n\nGenerated by `python -m bench.fleet")
    assert "| few-shot | prefix | 80.0 | 1.60x | 90 | 500 |" in md
    assert "`prefix` 1.60x round robin on few-shot" in md
    assert "benchmarks-fleet.md" in section(render_markdown(synthetic(), plot=None), "Fleet routing")


def test_fairness_report_puts_each_run_beside_the_others() -> None:
    """bench.fairness writes its own file; each scenario's runs side by side, with the ratios the goals read."""
    import argparse

    from bench.fairness import SCENARIOS, report

    def run(rate: float, **tenants: tuple[float, float]) -> dict[str, object]:
        return {
            "tokens_per_s": rate,
            "tenants": {
                n: {"share": s, "requests": 10, "p50_ms": p50, "p99_ms": 2 * p50} for n, (s, p50) in tenants.items()
            },
        }

    results = {
        "flood": {
            "without queue": run(2000.0, noisy=(0.9, 360.0), quiet=(0.1, 350.0)),
            "with queue": run(1960.0, noisy=(0.7, 500.0), quiet=(0.3, 105.0)),
            "alone": run(1000.0, quiet=(1.0, 70.0)),
        },
        "weights": {
            "without queue": run(2000.0, heavy=(0.5, 260.0), light=(0.5, 260.0)),
            "with queue": run(2000.0, heavy=(0.75, 180.0), light=(0.25, 530.0)),
        },
    }
    args = argparse.Namespace(seconds=8.0, batch=4, token_ms=2.0, jitter=0.1, load=(0.4, 1.2))
    md = report(args, results)
    assert md.startswith("# Fairness benchmark\n\nGenerated by `python -m bench.fairness --seconds 8 --batch 4")
    assert "| with queue | quiet | 30.0 % | – | 10 | 105 | 210 | 1960 |" in md
    assert "| with queue | heavy | 75.0 % | 75 % | 10 | 180 | 360 | 2000 |" in md
    assert "Throughput with the queue: 0.98x the run without it." in md
    assert "`quiet` p50: 1.50x its solo p50 with the queue, 5.00x without it." in md
    assert set(results) <= set(SCENARIOS)


def test_everything_on_rows_are_set_against_the_passthrough_of_their_scenario() -> None:
    from bench.everything import EVERYTHING, EVERYTHING_2W, PASSTHROUGH_2W

    run = synthetic()
    assert "## Everything on" not in render_markdown(run)  # only a run with the all_* rows has the section
    run.measurements += [
        _m("all_c32", "passthrough", rps=2_000.0),
        _m("all_c32", "gateway", rps=2_500.0),
        _m("all_c32", EVERYTHING, rps=3_100.0),
        _m("all_2w_c32", PASSTHROUGH_2W, rps=4_000.0),
        _m("all_2w_c32", EVERYTHING_2W, rps=5_000.0),
        _m("all_c1", "direct", p50_ms=0.100),
        _m("all_c1", "passthrough", p50_ms=0.300),
        _m("all_c1", EVERYTHING, p50_ms=0.500),
    ]
    text = section(render_markdown(run), "Everything on")
    miss = row(text, "`all_c32` completions, every request a cache miss")
    assert "| 2,000 | 2,500 | 3,100 | 1.55x | - | 1.24x |" in miss  # measured once: no rounds to list
    assert "1.25x (**below**)" in row(text, "`all_2w_c32` two workers, completions, misses")
    # c=1: the gateway adds 0.4 ms where the passthrough adds 0.2 ms: 2x, above the 1.5x goal.
    assert "+0.200 | - | +0.400 | 2.00x (**above**)" in row(text, "`all_c1` completions, one connection")


def test_an_everything_on_row_of_rounds_is_the_median_of_its_rounds_ratios() -> None:
    from bench import history
    from bench.everything import EVERYTHING

    run = synthetic()
    # Each round's ratio against the passthrough beside it: 1.55x, 2.00x, 1.00x. Their median is 1.55x, where the
    # median runs' ratio (3,000 over 2,000) would be 1.50x: the machine's drift between rounds would enter it.
    run.measurements += [
        _m("all_c32", "passthrough", rps=2_000.0, runs_rps=[2_000.0, 1_000.0, 3_000.0]),
        _m("all_c32", EVERYTHING, rps=3_000.0, runs_rps=[3_100.0, 2_000.0, 3_000.0]),
    ]
    miss = row(section(render_markdown(run), "Everything on"), "`all_c32` completions, every request a cache miss")
    assert "| 2,000 | - | 3,000 | 1.55x | 1.55x, 2.00x, 1.00x |" in miss
    entry = history.entry_from(run, "abc1234", False)
    assert entry is not None and entry.throughput["all_c32"].on_per_passthrough == 1.55


def test_the_history_prints_a_ratio_as_the_runs_own_table_does() -> None:
    from bench import history
    from bench.everything import EVERYTHING

    run = synthetic()
    # Rounds of a real run: 0.995x, 1.060x, 1.0350x. Kept to three digits, 1.035 would print as 1.03x.
    run.measurements += [
        _m("all_c32", "passthrough", rps=6_120.0, runs_rps=[6_370.0, 5_830.0, 6_120.0]),
        _m("all_c32", EVERYTHING, rps=6_335.0, runs_rps=[6_338.0, 6_177.0, 6_335.0]),
    ]
    entry = history.entry_from(run, "abc1234", False)
    assert entry is not None
    text = section(render_markdown(run, past=[entry]), "Everything on")
    miss = row(text, "`all_c32` completions, every request a cache miss")
    assert "| 1.04x (**below**) | 0.99x, 1.06x, 1.04x |" in miss
    assert "| `abc1234` | 6,335 | 1.04x |" in text


def test_a_varied_wrk_script_gives_every_request_a_prompt_of_its_own(tmp_path: Path) -> None:
    from bench import wrk

    body = b'{"model":"m","prompt":"Say hello","max_tokens":16}'
    one, two = (wrk.write_script(body, tmp_path, name, vary="Say hello").read_text() for name in ("a", "b"))
    assert "request = function()" in one and "n = n + 1" in one
    nonce = re.compile(r'head \.\. "([0-9a-f]+)-"')
    found = [nonce.search(text) for text in (one, two)]
    assert found[0] is not None and found[1] is not None and found[0].group(1) != found[1].group(1)
    try:
        wrk.write_script(body, tmp_path, "c", vary="absent")
    except ValueError as exc:
        assert "absent" in str(exc)
    else:
        raise AssertionError("a marker missing from the body must be refused")


def test_the_everything_on_soak_reports_rss_over_time_and_the_cache_against_its_bound() -> None:
    from bench.everything import EVERYTHING

    run = synthetic()
    mib = 1024 * 1024
    series = [[0, 180.5], *([n * 100_000, 200.0 + n / 10] for n in range(1, 10)), [1_000_000, 211.7]]
    run.measurements.append(
        _m(
            "all_soak",
            EVERYTHING,
            tool="soak",
            requests=1_000_000,
            rps=1_234.0,
            rss_idle_mib=180.5,
            rss_checkpoint_mib=200.1,
            rss_end_mib=211.7,
            rss_growth_pct=5.8,
            rss_series_mib=series,
            cache_entries=16_155,
            cache_bytes=8 * mib,
            cache_max_bytes=16 * mib,
            cache_evictions=983_845,
        )
    )
    text = section(render_markdown(run), "Everything on")
    assert "### Memory over 1,000,000 requests, everything on" in text
    line = row(text, f"`{EVERYTHING}`")
    assert "| 1,000,000 | 180.5 | 200 → 200 → 200 → 200 → 200 → 201 → 201 → 201 → 201 | 211.7 | +5.8 % |" in line
    assert "| 16,155 | 8.0 of 16 (50%) | 983,845 | 1,234 | 0 |" in line
    assert "| `all_c32`" not in text  # the throughput rows were not run: no table of theirs


def test_the_everything_on_soak_follows_soak_requests_and_runs_only_by_itself_or_in_a_full_run() -> None:
    from bench.__main__ import expand_only
    from bench.scenarios import Settings, build_scenarios

    base = Settings(10, 2, 32, 100, 0, 50, 500, 5000, 500, 30, 3, 1, False, Path("."), Path("."), 20_000, 2_000)

    def scenarios(only: str | None) -> dict[str, Any]:
        return {x.name: x for x in build_scenarios(Settings(**{**vars(base), "only": expand_only(only)}))}

    assert list(scenarios("all_soak")) == ["all_soak"]
    assert "all_soak" not in scenarios("everything")  # the throughput rows alone stay about five minutes
    soak = scenarios(None)["all_soak"]
    assert "20,000 requests" in soak.title and soak.fresh and soak.vary and soak.tool == "soak"


def test_the_httptools_variant_is_reported_beside_the_gateways_own_protocol() -> None:
    from bench.scenarios import HTTPTOOLS

    run = synthetic()
    run.measurements += [
        _m("nonstream_c32", HTTPTOOLS, rps=3_900.0, p99_ms=4.321, cpu_s_per_1k=0.256),
        _m("nonstream_c1", GRANIAN, ok=False, skipped=True, requests=None, note="not run: granian missing (pip)"),
        _m("nonstream_c1", HTTPTOOLS, p50_ms=0.455, p99_ms=0.987, placement="shared"),
        _m("slow_fixed_rate", HTTPTOOLS, "rate", p50_ms=50.7, p99_ms=54.1),
    ]
    md = render_markdown(run)
    headline = section(md, "Headline")
    title = "Throughput, c=32, gateway on uvicorn's httptools protocol (req/s; 0.90x the gateway's own protocol)"
    assert row(headline, title) == f"| {title} | 41,111 | 5,222 | 3,900 | 0.09x | 0.75x |"
    assert "In the 2-worker, granian and httptools rows the gateway column is that variant." in headline

    variants = section(md, "Gateway variants (non-streaming, c=32)")
    line = row(variants, f"`{HTTPTOOLS} (uvicorn's httptools protocol, workers=1)`")
    assert "| 3,900 | 0.90x | 0.75x | 4.321 | 0.256 | split |" in line
    assert "`gateway-httptools` is the same gateway under the same uvicorn with uvicorn's httptools" in variants
    assert "what the HTTP/1.1 protocol costs" in variants
    # The c=1 table: a column for each server measured there, a reason where a figure is missing.
    header = (
        "| same load | gateway (uvicorn, the gateway's own HTTP/1.1 protocol) | gateway on granian"
        " | gateway on uvicorn's httptools protocol |"
    )
    assert header in variants
    assert row(variants, "c=1 p50 ms") == "| c=1 p50 ms | 0.391 | not run: granian missing | 0.455 |"
    assert row(variants, "c=1 p99 ms") == "| c=1 p99 ms | 3.000 | not run: granian missing | 0.987 |"
    slow = "50 ms upstream at 500 req/s"
    assert row(variants, f"{slow}: p50 ms") == f"| {slow}: p50 ms | 50.600 | not run | 50.700 |"


def test_a_missing_httptools_variant_is_explained_where_its_figures_would_be() -> None:
    from bench.scenarios import HTTPTOOLS

    run = synthetic()
    assert "(req/s; not run)" in row(
        section(render_markdown(run), "Headline"),
        "Throughput, c=32, gateway on uvicorn's httptools protocol (req/s; not run)",
    )
    run.measurements += [
        _m("nonstream_c32", HTTPTOOLS, rps=3_900.0, ok=False, note="server exited during the run with code 1"),
        _m("nonstream_c1", HTTPTOOLS, ok=False, note="errors: 3 non-2xx answers", placement="shared"),
    ]
    md = render_markdown(run)
    title = "Throughput, c=32, gateway on uvicorn's httptools protocol (req/s; failed, see Problems)"
    assert row(section(md, "Headline"), title) == f"| {title} | 41,111 | 5,222 | - | - | - |"
    variants = section(md, "Gateway variants (non-streaming, c=32)")
    assert row(variants, f"`{HTTPTOOLS} (uvicorn's httptools protocol, workers=1)`").endswith(
        "| failed, see Problems | - | - | - | - | - |"
    )
    assert row(variants, "c=1 p50 ms") == "| c=1 p50 ms | 0.391 | failed, see Problems |"
    assert f"- `nonstream_c1` / `{HTTPTOOLS}`: errors: 3 non-2xx answers" in section(md, "Problems in this run")


def test_the_cache_hit_goal_is_the_median_of_its_rounds_ratios() -> None:
    from bench.scenarios import CACHE_TARGET

    run = synthetic()
    # Three rounds: 2.50x, 1.60x (one slow minute for the hits), 2.20x. The median runs alone would read
    # 15,000 / 6,500 = 2.31x; the verdict is the median round, 2.20x.
    run.measurements += [
        _m("cached_c32", "gateway", rps=6_500.0, runs_rps=[6_000.0, 7_500.0, 6_500.0]),
        _m("cached_c32", CACHE_TARGET, rps=14_300.0, runs_rps=[15_000.0, 12_000.0, 14_300.0]),
    ]
    md = render_markdown(run)
    line = row(section(md, "Targets"), "cache hits, c=32 throughput ≥ 2 × the same requests through the upstream")
    assert "14,300 req/s = 2.20x the uncached gateway (6,500; rounds 2.50x, 1.60x, 2.20x, the median)" in line
    assert line.endswith("| met |")
    variants = section(md, "Gateway variants (non-streaming, c=32)")
    assert "| 14,300 | 2.20x |" in row(variants, f"`{CACHE_TARGET} (workers=1)`")
    # A median round below the goal is a miss, though the median runs' ratio (13,500 / 6,500) is 2.08x.
    run.measurements[-1] = _m("cached_c32", CACHE_TARGET, rps=13_500.0, runs_rps=[13_500.0, 14_500.0, 12_500.0])
    title = "cache hits, c=32 throughput ≥ 2 × the same requests through the upstream"
    line = row(section(render_markdown(run), "Targets"), title)
    assert "13,500 req/s = 1.93x the uncached gateway (6,500; rounds 2.25x, 1.93x, 1.92x" in line
    assert line.endswith("| **NOT met** |")
