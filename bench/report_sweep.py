"""The load sweep: its table in docs/benchmarks.md and its plot, docs/benchmarks.png (matplotlib, optional)."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from pathlib import Path
from typing import Any

from bench.report_format import Index, markdown_table, num
from bench.report_run import RunResult
from bench.report_template import Template


def sweep_section(
    t: Template, idx: Index, result: RunResult, plot: Path | None, plot_note: str, md_dir: Path | None
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
        cells = [num(rate, 0)]
        for target in targets:
            m = next((x for x in points if x.target == target and x.offered_rps == rate), None)
            if m is None or m.requests is None:
                cells.append("not run" if m is None or m.skipped else "failed")
                continue
            errors = f", **{m.errors:,} errors**" if m.errors else ""
            cells.append(f"{num(m.rps, 0)}, {num(m.p50_ms, 2)} / {num(m.p90_ms, 2)} / {num(m.p99_ms, 2)}{errors}")
        rows.append(cells)
    return t.section("sweep", plot=image, table="\n".join(markdown_table(header, rows)))


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
