"""Turning measurements into bench/results/*.json, docs/benchmarks.md and docs/benchmarks.png.

The markdown is generated whole from the JSON figures of one run, so the published table can
never mix numbers from different runs or machines; so is its "Targets" section, which checks the
performance issue's thresholds against those figures. Its prose and layout live in a template,
bench/report_template.md; this module fills it, one sibling ``report_*`` module per section. The run's
record (JSON) is bench/report_run.py; the PNG is drawn by bench/report_sweep.py.
"""

from __future__ import annotations

from pathlib import Path

from bench import history, report_everything, report_features
from bench.report_format import Index, loadgen_bound, markdown_table, num
from bench.report_headline import headline_table
from bench.report_memory import hold_section, soak_section
from bench.report_run import RunResult
from bench.report_scenarios import scenarios_section
from bench.report_sweep import sweep_section
from bench.report_targets import targets_section
from bench.report_template import Template
from bench.report_variants import variants_section
from bench.scenarios import NOISY_PCT, Measurement
from bench.upstream import COMPLETION_BODY

TEMPLATE = Path(__file__).with_name("report_template.md")


def render_markdown(
    result: RunResult,
    plot: Path | None = None,
    plot_note: str = "",
    md_dir: Path | None = None,
    past: list[history.Entry] | None = None,
) -> str:
    """docs/benchmarks.md for one run: bench/report_template.md filled with this run's figures; ``past`` is the
    everything-on history (bench/history.py) the Everything-on section shows, this run's line among them."""
    t = Template(TEMPLATE)
    idx = Index(result.measurements)
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
            targets=targets_section(t, idx, result),
            headline_table="\n".join(headline_table(idx, result)),
            dagger_note=t.fill("dagger_note", **common) + " " if noisy else "",
            soak_passthrough_note="" if s.get("soak_passthrough") else t.fill("soak_passthrough_note"),
            variants=variants_section(t, idx, result),
            everything=_everything(t, result, past or []),
            sweep=sweep_section(t, idx, result, plot, plot_note, md_dir),
            soak=soak_section(t, idx, result, common),
            hold=hold_section(t, idx, result, common),
            body_size=len(COMPLETION_BODY),
            connections=s["connections"],
            nginx_rps=num(idx.value("nonstream_c32", "direct", rps), 0),
            nginx_bound=loadgen_bound(idx.get("nonstream_c32", "direct")),
            py_rps=num(idx.value("pyupstream_c32", "direct", rps), 0),
            py_bound=loadgen_bound(idx.get("pyupstream_c32", "direct")),
            chunks=s["chunks"],
            py_stream=num(idx.value("stream_c32", "direct", rps), 0),
            stream_bound=loadgen_bound(idx.get("stream_c32", "direct")),
            lower_bound_note=(
                t.section("lower_bound_note")
                if any(loadgen_bound(idx.get(sc, "direct")) for sc in ("nonstream_c32", "pyupstream_c32", "stream_c32"))
                else ""
            ),
            scenarios=scenarios_section(t, result),
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


def _everything(t: Template, result: RunResult, past: list[history.Entry]) -> str:
    table = report_everything.section(result.measurements, markdown_table)
    lines = history.section(past, markdown_table)
    lines = t.fill("everything_history", table=lines) if lines else ""
    alone = report_features.section(result.measurements, markdown_table)
    alone = t.fill("everything_features", table=alone) if alone else ""
    soak = report_everything.soak(result.measurements, markdown_table)
    soak_n = f"{result.settings.get('soak_requests', 0):,}"
    soak = t.fill("everything_soak", table=soak, soak_requests=soak_n) if soak else ""
    return (
        t.section("everything", table=table, history=lines, features=alone, soak=soak) if table or alone or soak else ""
    )


def _problems_section(t: Template, result: RunResult, noisy: list[Measurement]) -> str:
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


REQUEST_TEXT = '{"model":"up/bench-model","prompt":"Say hello","max_tokens":16}'
