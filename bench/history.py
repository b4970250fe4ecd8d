"""The everything-on rows over time: bench/history/everything.jsonl, one line per full-mode run.

A full ``python -m bench`` (no ``--quick``, no ``--only``) appends one line to the committed file and the report
renders the lines, newest first, as the "History" table of its Everything-on section. Each line holds a fixed set
of figures (the everything-on rows, the c=1 added latencies, each feature alone's ratio and the everything-on
soak's RSS growth), never the run's full record: that is bench/results/latest.json, which is not committed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import msgspec

from bench import report_features
from bench.everything import EVERYTHING, EVERYTHING_2W, EVERYTHING_PG, PASSTHROUGH_2W
from bench.features import FEATURES, NOTHING
from bench.report_everything import LATENCY_ROWS, THROUGHPUT_ROWS, get
from bench.report_run import RunResult
from bench.scenarios import TWO_WORKERS, Measurement, median_ratio
from bench.soak_everything import SCENARIO as SOAK

PATH = Path(__file__).resolve().parent / "history" / "everything.jsonl"


class Throughput(msgspec.Struct, omit_defaults=True):
    """One everything-on c=32 row: req/s of the passthrough, the gateway with nothing on and everything on."""

    passthrough_rps: float | None = None
    nothing_on_rps: float | None = None
    on_rps: float | None = None
    on_per_passthrough: float | None = None
    on_per_nothing_on: float | None = None


class Latency(msgspec.Struct, omit_defaults=True):
    """One everything-on c=1 row: the p50 (ms) each hop adds over the upstream alone."""

    direct_p50_ms: float | None = None
    passthrough_adds_ms: float | None = None
    nothing_on_adds_ms: float | None = None
    on_adds_ms: float | None = None
    on_per_passthrough: float | None = None


class Entry(msgspec.Struct, omit_defaults=True):
    """One full run. ``commit`` is the short hash of the tree measured, ``dirty`` whether it had uncommitted
    changes (None: not known). ``source`` says where the figures come from: ``bench`` for a run that wrote the
    line itself, or the published docs/benchmarks.md a line was recovered from."""

    date: str
    commit: str
    mode: str
    source: str
    dirty: bool | None = None
    # Row key (THROUGHPUT_ROWS' scenario, `_pg` for the PostgreSQL ledger) -> its figures.
    throughput: dict[str, Throughput] = msgspec.field(default_factory=dict)
    latency: dict[str, Latency] = msgspec.field(default_factory=dict)
    # Feature name -> feature on / nothing on.
    features: dict[str, float] = msgspec.field(default_factory=dict)
    soak_rss_growth_pct: float | None = None
    # The machine's noise: the slowest run of the gateway with nothing on over its fastest, over the feature rows.
    nothing_on_spread: float | None = None


def row_key(scenario: str, target: str) -> str:
    return scenario + ("_pg" if target == EVERYTHING_PG else "")


def _r(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


# A ratio keeps enough digits that the History table prints it as the run's own tables do (1.0350 rounded to
# three digits, 1.035, would print as 1.03x where the table shows 1.04x).
_RATIO_DIGITS = 6


def _div(a: float | None, b: float | None) -> float | None:
    return round(a / b, _RATIO_DIGITS) if a is not None and b else None


def entry_from(result: RunResult, commit: str, dirty: bool | None) -> Entry | None:
    """The history line of one run; None when it measured none of the everything-on rows."""
    ms = result.measurements
    throughput: dict[str, Throughput] = {}
    for scenario, target, _ in THROUGHPUT_ROWS:
        floor_name, plain_name = (
            (PASSTHROUGH_2W, TWO_WORKERS) if target == EVERYTHING_2W else ("passthrough", "gateway")
        )
        on_m, floor_m = get(ms, scenario, target), get(ms, scenario, floor_name)
        on, floor, plain = _rps(on_m), _rps(floor_m), _rps(get(ms, scenario, plain_name))
        if on is None and floor is None:
            continue
        throughput[row_key(scenario, target)] = Throughput(
            _r(floor, 0), _r(plain, 0), _r(on, 0), _r(median_ratio(floor_m, on_m), _RATIO_DIGITS), _div(on, plain)
        )
    latency: dict[str, Latency] = {}
    for scenario, _ in LATENCY_ROWS:
        direct, floor_m, plain_m, on_m = (
            get(ms, scenario, t) for t in ("direct", "passthrough", "gateway", EVERYTHING)
        )
        if direct is None or direct.p50_ms is None:
            continue
        base = direct.p50_ms
        f_add, p_add, m_add = (
            m.p50_ms - base if m and m.p50_ms is not None else None for m in (floor_m, plain_m, on_m)
        )
        latency[scenario] = Latency(_r(base, 3), _r(f_add, 3), _r(p_add, 3), _r(m_add, 3), _div(m_add, f_add))
    features: dict[str, float] = {}
    for feature in FEATURES:
        ratio = _r(
            report_features.ratio(get(ms, feature.scenario, NOTHING), get(ms, feature.scenario, feature.target)),
            _RATIO_DIGITS,
        )
        if ratio is not None:
            features[feature.name] = ratio
    soak = next((m for m in ms if m.scenario == SOAK and m.target == EVERYTHING and m.rss_growth_pct is not None), None)
    if not (throughput or latency or features or soak):
        return None
    return Entry(
        date=result.finished_at,
        commit=commit,
        mode=result.mode,
        source="bench",
        dirty=dirty,
        throughput=throughput,
        latency=latency,
        features=features,
        soak_rss_growth_pct=_r(soak.rss_growth_pct, 2) if soak else None,
        nothing_on_spread=_r(report_features.spread(ms), _RATIO_DIGITS),
    )


def _rps(m: Measurement | None) -> float | None:
    return m.rps if m is not None and m.rps else None


def record(
    result: RunResult, only: frozenset[str] | None, commit: str, dirty: bool | None, path: Path = PATH
) -> list[Entry]:
    """Append a full run of every scenario to the history; the lines the report shows, this run's among them, or
    none for a ``--quick`` or ``--only`` run (which appends nothing) or a run without the everything-on rows."""
    entry = entry_from(result, commit, dirty) if result.mode == "full" and only is None else None
    if entry is None:
        return []
    append(entry, path)
    return read(path)


def read(path: Path = PATH) -> list[Entry]:
    """The lines of the history file, oldest first; none when it does not exist."""
    if not path.exists():
        return []
    return [msgspec.json.decode(line, type=Entry) for line in path.read_bytes().splitlines() if line.strip()]


def append(entry: Entry, path: Path = PATH) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as f:
        f.write(msgspec.json.encode(entry) + b"\n")


def git_state(root: Path) -> tuple[str, bool | None]:
    """The short hash of HEAD in ``root`` and whether tracked files differ from it; ("unknown", None) outside git."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--short=7", "HEAD")
    if not commit:
        return "unknown", None
    status = git("status", "--porcelain", "--untracked-files=no")
    return commit, None if status is None else bool(status)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def section(entries: list[Entry], table: Callable[[list[str], list[list[str]]], list[str]]) -> str:
    """Markdown for the history, newest first; empty when there is none."""
    rows: list[list[str]] = []
    for e in sorted(entries, key=lambda e: e.date, reverse=True):
        t = e.throughput
        miss = t.get("all_c32", Throughput())
        c1, chat_c1 = e.latency.get("all_c1", Latency()), e.latency.get("all_chat_c1", Latency())
        lowest = min(e.features.items(), key=lambda kv: kv[1]) if e.features else None
        dirty = " (uncommitted changes)" if e.dirty else ""
        rows.append(
            [
                e.date.removesuffix(" UTC")[:16] + ("" if e.source == "bench" else " *"),
                f"`{e.commit}`{dirty}",
                "-" if miss.on_rps is None else f"{miss.on_rps:,.0f}",
                _ratio(miss.on_per_passthrough),
                *(_ratio(t.get(k, Throughput()).on_per_passthrough) for k in _HISTORY_ROWS),
                "-" if c1.on_adds_ms is None else f"+{c1.on_adds_ms:.3f}",
                _ratio(c1.on_per_passthrough),
                _ratio(chat_c1.on_per_passthrough),
                "-" if lowest is None else f"{lowest[1]:.2f}x ({lowest[0]})",
                _ratio(e.nothing_on_spread),
                "-" if e.soak_rss_growth_pct is None else f"{e.soak_rss_growth_pct:+.1f} %",
            ]
        )
    if not rows:
        return ""
    return "\n".join(
        table(
            [
                "run (UTC)",
                "commit",
                "`all_c32` on req/s",
                "`all_c32` on / passthrough",
                "PostgreSQL ledger",
                "hits",
                "chat",
                "streamed",
                "chat streamed",
                "two workers",
                "`all_c1` on adds ms",
                "`all_c1` on / passthrough",
                "`all_chat_c1`",
                "lowest feature alone",
                "nothing on, slowest / fastest run",
                "soak RSS growth",
            ],
            rows,
        )
    )


# The throughput rows of the history table after `all_c32`, each as on / passthrough.
_HISTORY_ROWS = ("all_c32_pg", "all_hits_c32", "all_chat_c32", "all_stream_c32", "all_chat_stream_c32", "all_2w_c32")
