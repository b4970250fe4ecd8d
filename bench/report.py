"""Turning measurements into bench/results/*.json, docs/benchmarks.md and docs/benchmarks.png.

The markdown is generated whole from the JSON figures of one run, so the published table can
never mix numbers from different runs or machines; so is its "Targets" section, which checks the
performance issue's thresholds against those figures. Its prose and layout live in a template,
bench/report_template.md; this module computes the figures, rows and verdicts that fill it. The PNG
(latency percentiles against offered load) needs matplotlib, the optional ``bench`` extra; without it
the run still completes.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import math
import os
import platform
import re
import shutil
import string
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec

from bench import report_everything, report_features, wrk
from bench.scenarios import CACHE_TARGET, GRANIAN, HTTPX, LIMITS_TARGET, NOISY_PCT, TWO_WORKERS, Measurement
from bench.upstream import COMPLETION_BODY, nginx

# Above this busy share of the load generator's core, a row measures wrk rather than the server.
LOADGEN_SATURATED = 90.0


class RunResult(msgspec.Struct):
    started_at: str
    finished_at: str
    elapsed_s: float
    mode: str
    command: str
    machine: dict[str, str]
    versions: dict[str, str]
    settings: dict[str, Any]
    startup_errors: dict[str, str]
    measurements: list[Measurement]
    # target -> why it was not run (an optional server that is not installed, say).
    skipped: dict[str, str] = msgspec.field(default_factory=dict)


def _run_text(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (done.stdout + done.stderr).strip()


def describe_machine() -> dict[str, str]:
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    free = _run_text(["free", "-m"]).splitlines()
    memory = next((" ".join(line.split()[:2]) + " MiB" for line in free if line.startswith("Mem:")), "unknown")
    return {
        "cpu": model,
        # --all: the bench pins itself to one core, and plain nproc would report that affinity.
        "nproc": _run_text(["nproc", "--all"]) or str(os.cpu_count()),
        "memory": memory.replace("Mem: ", "") + " total",
        "kernel": platform.release(),
        "os": platform.platform(),
    }


def tool_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    binary = nginx.find_nginx()
    versions["nginx"] = _run_text([binary, "-v"]).replace("nginx version: ", "") if binary else "missing"
    versions["wrk"] = wrk.version()
    for dist in (
        "completions-gateway",
        "litestar",
        "aiohttp",
        "msgspec",
        "uvloop",
        "httptools",
        "uvicorn",
        "granian",
        "matplotlib",
    ):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "missing"
    head = _run_text(["git", "rev-parse", "--short", "HEAD"]) if shutil.which("git") else ""
    versions["git HEAD"] = head if head and " " not in head else "no commit yet"
    return versions


# -- formatting helpers ------------------------------------------------------------------------


def _num(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def _delta(value: float | None, base: float | None, digits: int = 3) -> str:
    if value is None or base is None or math.isnan(value) or math.isnan(base):
        return "-"
    return f"{value - base:+.{digits}f}"


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or base is None or not base or math.isnan(value) or math.isnan(base):
        return "-"
    return f"{value / base:.2f}x"


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


class _Index:
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


def _label(target: str, result: RunResult) -> str:
    workers = result.settings.get("workers", 1)
    if target in ("gateway", LIMITS_TARGET, CACHE_TARGET):
        return f"{target} (workers={workers})"
    if target == TWO_WORKERS:
        return f"{target} (workers=2, unpinned)"
    if target == GRANIAN:
        return f"{target} (granian, workers={workers})"
    if target == HTTPX:
        return f"{target} (transport: httpx, workers={workers})"
    return target


def _why_missing(idx: _Index, scenario: str, target: str) -> str:
    """Why a figure is absent, in a few words for a table cell or a title."""
    m = idx.raw(scenario, target)
    if m is None:
        return "not run"
    if m.skipped:
        return "not run: " + (m.note or "").removeprefix("not run: ").split(" (")[0]
    return "failed, see Problems"


class _Template:
    """bench/report_template.md: named blocks of markdown with `${name}` placeholders (its head says how)."""

    def __init__(self, path: Path) -> None:
        self.blocks: dict[str, list[str]] = {}
        name: str | None = None
        for line in path.read_text().split("\n"):
            if line.startswith("@@ "):
                name = line[3:].strip()
                self.blocks[name] = []
            elif name is not None:
                self.blocks[name].append(line)

    def fill(self, name: str, **values: object) -> str:
        """The block with its values; a line that is only a placeholder goes when its value is empty."""
        kept = [
            line
            for line in self.blocks[name]
            if not ((alone := _ALONE.fullmatch(line)) and values[alone.group(1)] in ("", None))
        ]
        return string.Template("\n".join(kept).rstrip("\n")).substitute(values)

    def section(self, name: str, **values: object) -> str:
        """A block that stands on its own lines, followed by a blank line."""
        return self.fill(name, **values) + "\n"


TEMPLATE = Path(__file__).with_name("report_template.md")
_ALONE = re.compile(r"\$\{(\w+)\}")


def render_markdown(
    result: RunResult, plot: Path | None = None, plot_note: str = "", md_dir: Path | None = None
) -> str:
    """docs/benchmarks.md for one run: bench/report_template.md filled with this run's figures."""
    t = _Template(TEMPLATE)
    idx = _Index(result.measurements)
    s = result.settings
    soak_n, hold_n = s.get("soak_requests", 0), s.get("hold_streams", 0)
    busy_before = result.machine.get("busy before run", "0%").split("%")[0]
    noisy = [m for m in result.measurements if (m.other_load_pct or 0.0) > NOISY_PCT]
    rps = lambda m: m.rps  # noqa: E731 - tiny selectors read better inline
    common = {
        "noisy_pct": f"{NOISY_PCT:g}",
        "soak_requests": f"{soak_n:,}",
        "hold_streams": f"{hold_n:,}",
        "hold_stream_s": f"{100 * s.get('hold_interval_ms', 0) / 1000:g}",
    }
    return (
        t.fill(
            "report",
            finished_at=result.finished_at,
            mode=result.mode,
            elapsed_s=f"{result.elapsed_s:.0f}",
            # bench/limits-redis.yaml points at this Redis; the bench does not start one itself.
            redis_line=t.fill("redis_line") if "limits-redis.yaml" in result.command else "",
            command=result.command,
            noisy_run=t.section("noisy_run", busy_before=busy_before) if float(busy_before or 0) > NOISY_PCT else "",
            problems=_problems_section(t, result, noisy),
            targets=_targets_section(t, idx, result),
            headline_table="\n".join(_headline_table(idx, result)),
            dagger_note=t.fill("dagger_note", **common) + " " if noisy else "",
            soak_passthrough_note="" if s.get("soak_passthrough") else t.fill("soak_passthrough_note"),
            variants=_variants_section(t, idx, result),
            everything=_everything(t, result),
            sweep=_sweep_section(t, idx, result, plot, plot_note, md_dir),
            soak=_soak_section(t, idx, result, common),
            hold=_hold_section(t, idx, result, common),
            body_size=len(COMPLETION_BODY),
            connections=s["connections"],
            nginx_rps=_num(idx.value("nonstream_c32", "direct", rps), 0),
            nginx_bound=_bound(idx.get("nonstream_c32", "direct")),
            py_rps=_num(idx.value("pyupstream_c32", "direct", rps), 0),
            py_bound=_bound(idx.get("pyupstream_c32", "direct")),
            chunks=s["chunks"],
            py_stream=_num(idx.value("stream_c32", "direct", rps), 0),
            stream_bound=_bound(idx.get("stream_c32", "direct")),
            lower_bound_note=(
                t.section("lower_bound_note")
                if any(_bound(idx.get(sc, "direct")) for sc in ("nonstream_c32", "pyupstream_c32", "stream_c32"))
                else ""
            ),
            scenarios=_scenarios_section(t, result),
            machine="\n".join(f"- **{k}**: {v}" for k, v in result.machine.items()),
            versions="\n".join(f"- {k}: {v}" for k, v in result.versions.items()),
            # The idle-wait budget is in the command line already; the remainder says nothing about the figures.
            settings=", ".join(f"{k}={v}" for k, v in s.items() if k not in ("work_dir", "log_dir", "wait_idle_s")),
            duration_s=f"{s['duration_s']:g}",
            request_text=REQUEST_TEXT,
            warmup_s=f"{s['warmup_s']:g}",
            rate_count=s["rate_count"],
            rate=f"{s['rate']:g}",
            rate_warmup=s["rate_warmup"],
            sweep_rates=s.get("sweep_rates", "-"),
            sweep_seconds=f"{s.get('sweep_seconds', 0):g}",
            sweep_warmup_s=f"{s.get('sweep_warmup_s', 0):g}",
            ttfb_streams=s["ttfb_streams"],
            soak_checkpoint=f"{soak_n // 10:,}",
            hold_interval_ms=f"{s.get('hold_interval_ms', 0):g}",
            placement=t.fill("placement_pinned", **common) if s.get("pin") else t.fill("placement_unpinned"),
            **common,
        )
        + "\n"
    )


def _everything(t: _Template, result: RunResult) -> str:
    table = report_everything.section(result.measurements, _table)
    alone = report_features.section(result.measurements, _table)
    alone = t.fill("everything_features", table=alone) if alone else ""
    soak = report_everything.soak(result.measurements, _table)
    soak_n = f"{result.settings.get('soak_requests', 0):,}"
    soak = t.fill("everything_soak", table=soak, soak_requests=soak_n) if soak else ""
    return t.section("everything", table=table, features=alone, soak=soak) if table or alone or soak else ""


def _problems_section(t: _Template, result: RunResult, noisy: list[Measurement]) -> str:
    failed = [m for m in result.measurements if not m.skipped and (not m.ok or m.note)]
    if not (result.startup_errors or failed or noisy or result.skipped):
        return ""
    items: list[str] = []
    for target, why in result.skipped.items():
        items.append(f"- `{target}` was not run: {why}.")
    for key, message in result.startup_errors.items():
        items += [f"- `{key}` did not start:", "", "```", message.strip()[-2000:], "```", ""]
    for m in failed:
        if m.note and not m.note.startswith("did not start"):
            at = f" at {m.offered_rps:g} req/s" if m.offered_rps is not None else ""
            items.append(f"- `{m.scenario}`{at} / `{m.target}`: {m.note}")
    for m in noisy:
        at = f" at {m.offered_rps:g} req/s" if m.offered_rps is not None else ""
        items.append(
            f"- `{m.scenario}`{at} / `{m.target}`: processes outside the bench used {m.other_load_pct:.0f}% of a "
            "core during the window"
            + ("" if m.tool in ("soak", "hold") else " (after one repeat)")
            + "; treat this row as noisy"
        )
    return t.section("problems", items="\n".join(items))


def _headline_table(idx: _Index, result: RunResult) -> list[str]:
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
            cells = [_num(d, digits), _num(p, digits), _num(g, digits), _ratio(g, d), _ratio(g, p)]
        elif kind == "delta":
            cells = [_num(d, digits), _delta(p, d, digits), _delta(g, d, digits), "-", _delta(g, p, digits)]
        else:
            cells = [_num(d, digits), _num(p, digits), _num(g, digits), "-", "-"]
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
            f"{_ratio(two, single)} the 1-worker gateway)"
            if two and single
            else f"{_why_missing(idx, 'nonstream_c32', TWO_WORKERS)})"
        ),
        "nonstream_c32",
        rps,
        0,
        "ratio",
        gateway=TWO_WORKERS,
    )
    granian = idx.value("nonstream_c32", GRANIAN, rps)
    row(
        "Throughput, c=32, gateway on granian (req/s; "
        + (
            f"{_ratio(granian, single)} uvicorn)"
            if granian and single
            else f"{_why_missing(idx, 'nonstream_c32', GRANIAN)})"
        ),
        "nonstream_c32",
        rps,
        0,
        "ratio",
        gateway=GRANIAN,
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
    return _table(["", "direct", "passthrough", "gateway", "gateway / direct", "gateway vs passthrough"], rows)


def _scenarios_section(t: _Template, result: RunResult) -> str:
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
        table = _table([c[0] for c in columns], ([c[1](m, result) for c in columns] for m in items))
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


# -- sections ------------------------------------------------------------------------------------

# (description, met?) thresholds of the performance issue, checked against this run's figures.
HOLD_TARGET_MB = 300.0
SOAK_TARGET_PCT = 10.0


def _verdict(met: bool | None) -> str:
    return "not measured" if met is None else "met" if met else "**NOT met**"


def _targets_section(t: _Template, idx: _Index, result: RunResult) -> str:
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
    hit, miss = idx.value("cached_c32", CACHE_TARGET, rps), idx.value("cached_c32", "gateway", rps)
    title = "cache hits, c=32 throughput ≥ 2 × the same requests through the upstream"
    if hit and miss:
        add(title, f"{hit:,.0f} req/s = {hit / miss:.2f}x the uncached gateway ({miss:,.0f})", hit >= 2 * miss)
    elif idx.raw("cached_c32", CACHE_TARGET) is not None:
        add(title, f"- ({_why_missing(idx, 'cached_c32', CACHE_TARGET)})", None)

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
        add(title, f"- ({_why_missing(idx, 'hold_streams', 'gateway')})", None)

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
        add(title, f"- ({_why_missing(idx, 'soak', 'gateway')})", None)

    return t.section("targets", table="\n".join(_table(["target", "measured", "verdict"], rows)))


def _variants_section(t: _Template, idx: _Index, result: RunResult) -> str:
    """The gateway's variants under the same c=32 load, against the 1-worker gateway and the passthrough."""
    base = idx.get("nonstream_c32", "gateway")
    passthrough = idx.get("nonstream_c32", "passthrough")
    limits_base = idx.get("limits_c32", "gateway")
    cache_base = idx.get("cached_c32", "gateway")
    rows: list[list[str]] = []
    for scenario, target in (
        ("nonstream_c32", "gateway"),
        ("nonstream_c32", TWO_WORKERS),
        ("nonstream_c32", GRANIAN),
        ("nonstream_c32", HTTPX),
        ("limits_c32", LIMITS_TARGET),
        ("cached_c32", CACHE_TARGET),
    ):
        if idx.raw(scenario, target) is None:
            continue
        m = idx.get(scenario, target)
        if m is None:
            rows.append([f"`{_label(target, result)}`", _why_missing(idx, scenario, target), *["-"] * 5])
            continue
        # gateway+limits is compared with the plain gateway of its own scenario, measured right before it.
        versus = limits_base if target == LIMITS_TARGET else cache_base if target == CACHE_TARGET else base
        rows.append(
            [
                f"`{_label(target, result)}`",
                _num(m.rps, 0),
                _ratio(m.rps, versus.rps if versus else None),
                _ratio(m.rps, passthrough.rps if passthrough else None),
                _num(m.p99_ms, 3),
                _num(m.cpu_s_per_1k, 3),
                m.placement or "-",
            ]
        )
    table = _table(
        ["target", "req/s", "vs 1-worker gateway", "vs passthrough", "p99 ms", "CPU s/1k", "placement"], rows
    )
    granian: list[str] = []
    if idx.raw("nonstream_c1", GRANIAN) is not None:
        slow = f"{result.settings['latency_ms']:g} ms upstream at {result.settings['rate']:g} req/s"
        picks: list[tuple[str, str, Callable[[Measurement], float | None]]] = [
            ("c=1 p50 ms", "nonstream_c1", lambda m: m.p50_ms),
            ("c=1 p99 ms", "nonstream_c1", lambda m: m.p99_ms),
            (f"{slow}: p50 ms", "slow_fixed_rate", lambda m: m.p50_ms),
            (f"{slow}: p99 ms", "slow_fixed_rate", lambda m: m.p99_ms),
        ]
        granian = _table(
            ["same load", "gateway on uvicorn", "gateway on granian"],
            (
                [title, *(_num(idx.value(scenario, target, pick), 3) for target in ("gateway", GRANIAN))]
                for title, scenario, pick in picks
            ),
        )
    return t.section("variants", table="\n".join(table), granian_table="\n".join(granian))


def _sweep_section(
    t: _Template, idx: _Index, result: RunResult, plot: Path | None, plot_note: str, md_dir: Path | None
) -> str:
    points = sorted((m for m in result.measurements if m.scenario == "load_sweep"), key=lambda m: m.offered_rps or 0.0)
    if not points:
        return ""
    image = ""
    if plot is not None:
        link = os.path.relpath(plot, md_dir) if md_dir is not None else plot.name
        image = f"![Latency percentiles versus offered load]({link})\n"
    elif plot_note:
        image = f"({plot_note}.)\n"
    targets = list(dict.fromkeys(m.target for m in points))
    rates = list(dict.fromkeys(m.offered_rps for m in points))
    header = ["offered req/s", *(f"{t}: achieved, p50 / p90 / p99 ms" for t in targets)]
    rows = []
    for rate in rates:
        cells = [_num(rate, 0)]
        for target in targets:
            m = next((x for x in points if x.target == target and x.offered_rps == rate), None)
            if m is None or m.requests is None:
                cells.append("not run" if m is None or m.skipped else "failed")
                continue
            errors = f", **{m.errors:,} errors**" if m.errors else ""
            cells.append(f"{_num(m.rps, 0)}, {_num(m.p50_ms, 2)} / {_num(m.p90_ms, 2)} / {_num(m.p99_ms, 2)}{errors}")
        rows.append(cells)
    return t.section("sweep", plot=image, table="\n".join(_table(header, rows)))


def _soak_section(t: _Template, idx: _Index, result: RunResult, common: dict[str, str]) -> str:
    soak = [m for m in result.measurements if m.scenario == "soak"]
    if not soak:
        return ""
    table = _table(
        ["target", "requests", "RSS at checkpoint MiB", "RSS at end MiB", "growth", "req/s", "errors"],
        (
            [
                f"`{_label(m.target, result)}`",
                _num(m.requests, 0) if m.requests is not None else _why_missing(idx, "soak", m.target),
                f"{_num(m.rss_checkpoint_mib, 1)} (after {_num(m.checkpoint_requests, 0)})",
                _num(m.rss_end_mib, 1),
                f"{m.rss_growth_pct:+.1f} %" if m.rss_growth_pct is not None else "-",
                _num(m.rps, 0),
                _num(m.errors, 0),
            ]
            for m in soak
        ),
    )
    return t.section("soak", table="\n".join(table), **common)


def _hold_section(t: _Template, idx: _Index, result: RunResult, common: dict[str, str]) -> str:
    hold = [m for m in result.measurements if m.scenario == "hold_streams"]
    if not hold:
        return ""
    table = _table(
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
                f"`{_label(m.target, result)}`",
                _num(m.rss_idle_mib, 1),
                _num(m.rss_hold_mib, 1),
                _num(m.concurrent_streams, 0),
                _num(m.requests, 0) if m.requests is not None else _why_missing(idx, "hold_streams", m.target),
                _num(m.errors, 0),
                _num(m.events_per_stream, 0),
                f"{_num(m.total_p50_ms, 0)} / {_num(m.total_p99_ms, 0)}",
            ]
            for m in hold
        ),
    )
    return t.section("hold", table="\n".join(table), **common)


Cell = Callable[[Measurement, RunResult], str]


def _columns(tool: str, scenario: str) -> list[tuple[str, Cell]]:
    target: tuple[str, Cell] = ("target", lambda m, r: _label(m.target, r))
    errors: tuple[str, Cell] = (
        "errors",
        lambda m, r: _num(m.errors, 0) if m.requests is not None else "not run" if m.skipped else "failed",
    )
    other: tuple[str, Cell] = ("other load %", lambda m, r: _num(m.other_load_pct, 0))
    if tool == "ttfb":
        return [
            target,
            ("streams", lambda m, r: _num(m.requests, 0)),
            ("events/stream", lambda m, r: _num(m.events_per_stream, 0)),
            ("TTFB p50", lambda m, r: _num(m.ttfb_p50_ms, 3)),
            ("TTFB p90", lambda m, r: _num(m.ttfb_p90_ms, 3)),
            ("TTFB p99", lambda m, r: _num(m.ttfb_p99_ms, 3)),
            ("total p50", lambda m, r: _num(m.total_p50_ms, 3)),
            ("total p90", lambda m, r: _num(m.total_p90_ms, 3)),
            ("CPU s/1k", lambda m, r: _num(m.cpu_s_per_1k, 3)),
            errors,
            other,
        ]
    if tool == "hold":
        return [
            target,
            ("streams completed", lambda m, r: _num(m.requests, 0)),
            ("most open at once", lambda m, r: _num(m.concurrent_streams, 0)),
            ("events/stream", lambda m, r: _num(m.events_per_stream, 0)),
            ("TTFB p50", lambda m, r: _num(m.ttfb_p50_ms, 1)),
            ("TTFB p99", lambda m, r: _num(m.ttfb_p99_ms, 1)),
            ("stream p50", lambda m, r: _num(m.total_p50_ms, 0)),
            ("stream p99", lambda m, r: _num(m.total_p99_ms, 0)),
            ("RSS idle MiB", lambda m, r: _num(m.rss_idle_mib, 1)),
            ("RSS peak MiB", lambda m, r: _num(m.rss_hold_mib, 1)),
            ("CPU s/1k", lambda m, r: _num(m.cpu_s_per_1k, 3)),
            errors,
            ("busy % core0 / core1", lambda m, r: _busy(m)),
            other,
        ]
    columns: list[tuple[str, Cell]] = [target]
    if scenario == "load_sweep":
        columns = [("offered req/s", lambda m, r: _num(m.offered_rps, 0)), target]
    columns += [
        ("requests", lambda m, r: _num(m.requests, 0)),
        ("req/s", lambda m, r: _num(m.rps, 0)),
    ]
    if tool == "soak":
        columns += [
            ("RSS at checkpoint MiB", lambda m, r: _num(m.rss_checkpoint_mib, 1)),
            ("RSS at end MiB", lambda m, r: _num(m.rss_end_mib, 1)),
            ("growth %", lambda m, r: _num(m.rss_growth_pct, 1)),
        ]
    else:
        columns.append(("mean", lambda m, r: _num(m.mean_ms, 3)))
    columns += [
        ("p50", lambda m, r: _num(m.p50_ms, 3)),
        ("p90", lambda m, r: _num(m.p90_ms, 3)),
        ("p99", lambda m, r: _num(m.p99_ms, 3)),
        ("max", lambda m, r: _num(m.max_ms, 3)),
        ("CPU s/1k", lambda m, r: _num(m.cpu_s_per_1k, 3)),
        ("peak RSS MiB", lambda m, r: _num(m.peak_rss_mib, 1)),
        errors,
        ("busy % core0 / core1", lambda m, r: _busy(m)),
        other,
    ]
    return columns


REQUEST_TEXT = '{"model":"up/bench-model","prompt":"Say hello","max_tokens":16}'


def _bound(m: Measurement | None) -> str:
    if m is None or not m.core_busy_pct or m.core_busy_pct.get("cpu1", 0.0) < LOADGEN_SATURATED:
        return ""
    return " (*lower bound*: load generator core saturated)"


def _busy(m: Measurement) -> str:
    if not m.core_busy_pct:
        return "-"
    return f"{m.core_busy_pct.get('cpu0', 0):.0f} / {m.core_busy_pct.get('cpu1', 0):.0f}"


def write_json(result: RunResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.format(msgspec.json.encode(result), indent=2) + b"\n")


PLOT_COLOURS = {"direct": "#888888", "passthrough": "#4c72b0", "gateway": "#dd8452"}
PLOT_STYLES = {"p50": "-", "p90": "--", "p99": ":"}
INSTALL_HINT = "pip install -e '.[bench]'"


def write_plot(result: RunResult, path: Path) -> str:
    """Latency percentiles (log scale) and achieved rate against offered load, from the load_sweep rows.

    matplotlib is the optional ``bench`` extra and never installed by the bench itself.
    """
    points = [m for m in result.measurements if m.scenario == "load_sweep" and m.requests and m.offered_rps]
    if not points:
        return "plot skipped: no load_sweep figures in this run"
    try:
        # Imported by name so type checking does not depend on whether matplotlib is installed.
        matplotlib: Any = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt: Any = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        return f"plot skipped: matplotlib is not installed (`{INSTALL_HINT}` to enable)"
    fig, (latency_ax, rate_ax) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [2, 1]})
    for target in dict.fromkeys(m.target for m in points):
        mine = sorted((m for m in points if m.target == target), key=lambda m: m.offered_rps or 0.0)
        offered = [m.offered_rps for m in mine]
        colour = PLOT_COLOURS.get(target)
        for name, style in PLOT_STYLES.items():
            values = [getattr(m, f"{name}_ms") for m in mine]
            latency_ax.plot(offered, values, style, marker="o", markersize=3, color=colour, label=f"{target} {name}")
        rate_ax.plot(offered, [m.rps for m in mine], "-", marker="o", markersize=3, color=colour, label=target)
    latency_ax.set_yscale("log")
    latency_ax.set_xlabel("offered load, req/s (open loop)")
    latency_ax.set_ylabel("latency, ms (log scale)")
    latency_ax.set_title("latency percentiles vs offered load (nginx upstream)", fontsize=10)
    latency_ax.grid(True, which="both", alpha=0.3)
    latency_ax.legend(fontsize=7, ncol=3)
    top = max(m.offered_rps or 0.0 for m in points)
    rate_ax.plot([0, top], [0, top], color="#cccccc", linewidth=1, zorder=0, label="offered")
    rate_ax.set_xlabel("offered load, req/s")
    rate_ax.set_ylabel("achieved, req/s")
    rate_ax.set_title("achieved vs offered", fontsize=10)
    rate_ax.grid(True, alpha=0.3)
    rate_ax.legend(fontsize=7)
    fig.suptitle(f"completions gateway bench, {result.finished_at} ({result.mode} mode)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot written to {path}"
