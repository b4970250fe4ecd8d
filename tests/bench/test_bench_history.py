"""The everything-on history (bench/history.py, bench/history/everything.jsonl) from made-up runs; no wrk runs.

A synthetic full run with the everything-on rows, the feature rows and the everything-on soak is turned into its
history line; the line is appended only for a full run of every scenario; the report renders the lines newest
first in the Everything-on section; and the History table in docs/benchmarks.md is what the code renders from the
committed file.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import msgspec

from bench import history
from bench.everything import EVERYTHING, EVERYTHING_2W, EVERYTHING_PG, PASSTHROUGH_2W
from bench.features import FEATURES, NOTHING
from bench.report import TEMPLATE, render_markdown
from bench.report_format import markdown_table
from bench.report_run import RunResult
from bench.report_template import Template
from bench.scenarios import TWO_WORKERS
from tests.ops.test_bench_report import _m, row, section, synthetic

REPO = Path(__file__).resolve().parents[2]


def everything_run(finished_at: str = "2026-12-01 05:06:07 UTC", mode: str = "full") -> RunResult:
    run = synthetic()
    run.finished_at, run.mode = finished_at, mode
    run.measurements += [
        _m("all_c32", "passthrough", rps=2_000.0),
        _m("all_c32", "gateway", rps=2_500.0),
        _m("all_c32", EVERYTHING, rps=3_100.0),
        _m("all_c32", EVERYTHING_PG, rps=1_700.0),
        _m("all_hits_c32", "passthrough", rps=3_000.0),
        _m("all_hits_c32", EVERYTHING, rps=3_600.0),
        _m("all_2w_c32", PASSTHROUGH_2W, rps=4_000.0),
        _m("all_2w_c32", TWO_WORKERS, rps=4_400.0),
        _m("all_2w_c32", EVERYTHING_2W, rps=5_000.0),
        _m("all_c1", "direct", p50_ms=0.100),
        _m("all_c1", "passthrough", p50_ms=0.300),
        _m("all_c1", "gateway", p50_ms=0.350),
        _m("all_c1", EVERYTHING, p50_ms=0.500),
        _m("all_soak", EVERYTHING, "soak", rss_growth_pct=3.456, rps=1_600.0),
    ]
    for i, feature in enumerate(FEATURES):
        run.measurements += [
            _m(feature.scenario, NOTHING, rps=3_000.0),
            _m(feature.scenario, feature.target, rps=3_000.0 - 100.0 * (i + 1)),
        ]
    return run


def test_a_full_run_becomes_one_line_of_its_everything_on_figures() -> None:
    entry = history.entry_from(everything_run(), "abc1234", True)
    assert entry is not None
    assert (entry.date, entry.commit, entry.dirty, entry.mode, entry.source) == (
        "2026-12-01 05:06:07 UTC",
        "abc1234",
        True,
        "full",
        "bench",
    )
    assert entry.throughput["all_c32"] == history.Throughput(2_000.0, 2_500.0, 3_100.0, 1.55, 1.24)
    assert entry.throughput["all_c32_pg"] == history.Throughput(2_000.0, 2_500.0, 1_700.0, 0.85, 0.68)
    assert entry.throughput["all_hits_c32"] == history.Throughput(3_000.0, None, 3_600.0, 1.2, None)
    # Two workers: against the two-process passthrough and gateway-2w, not the one-process rows.
    assert entry.throughput["all_2w_c32"] == history.Throughput(4_000.0, 4_400.0, 5_000.0, 1.25, 1.136364)
    assert "all_chat_c32" not in entry.throughput  # not run: no key
    assert entry.latency == {"all_c1": history.Latency(0.1, 0.2, 0.25, 0.4, 2.0)}
    assert entry.features == {"limits": 0.966667, "cache": 0.933333, "ledger": 0.9, "queue": 0.866667,
                              "queue-redis": 0.833333, "log": 0.8}  # fmt: skip
    assert entry.soak_rss_growth_pct == 3.46
    assert entry.nothing_on_spread == 1.0  # nothing on served 3,000 req/s in every row
    # Bounded: a fixed set of keys, whatever the run measured besides; the whole line stays small.
    assert len(msgspec.json.encode(entry)) < 2_000


def test_a_run_without_the_everything_on_rows_has_no_line() -> None:
    assert history.entry_from(synthetic(), "abc1234", False) is None


def test_only_a_full_run_of_every_scenario_is_appended(tmp_path: Path) -> None:
    path = tmp_path / "history" / "everything.jsonl"
    assert history.record(everything_run(mode="quick"), None, "abc1234", False, path) == []
    assert history.record(everything_run(), frozenset({"all_c32"}), "abc1234", False, path) == []
    assert not path.exists()
    first = history.record(everything_run("2026-12-01 01:00:00 UTC"), None, "abc1234", False, path)
    second = history.record(everything_run("2026-12-02 01:00:00 UTC"), None, "def5678", None, path)
    assert [e.commit for e in first] == ["abc1234"]
    assert [e.commit for e in second] == ["abc1234", "def5678"]  # appended, the older line kept as it was
    assert len(path.read_text().splitlines()) == 2
    assert history.read(path) == second


def test_the_history_table_is_newest_first_and_marks_recovered_and_dirty_runs() -> None:
    new = history.entry_from(everything_run("2026-12-02 01:00:00 UTC"), "def5678", True)
    old = history.Entry(
        date="2026-11-29 03:38:40 UTC",
        commit="84eb967",
        mode="full",
        source="docs/benchmarks.md at 0abed9b",
        throughput={"all_c32": history.Throughput(2_878.0, 2_608.0, 1_606.0, 0.56, 0.62)},
    )
    assert new is not None
    lines = history.section([old, new], markdown_table).splitlines()
    assert lines[2].startswith("| 2026-12-02 01:00 | `def5678` (uncommitted changes) | 3,100 | 1.55x | 0.85x | 1.20x |")
    assert lines[2].endswith("| +0.400 | 2.00x | - | 0.80x (log) | 1.00x | +3.5 % |")
    assert lines[3] == "| 2026-11-29 03:38 * | `84eb967` | 1,606 | 0.56x |" + " - |" * 12
    assert history.section([], markdown_table) == ""


def test_the_report_shows_the_history_in_the_everything_on_section() -> None:
    run = everything_run()
    assert "### History" not in render_markdown(run)  # no history given: a quick or --only run
    entry = history.entry_from(run, "def5678", False)
    assert entry is not None
    text = section(render_markdown(run, past=[entry]), "Everything on")
    assert "### History" in text
    assert "| 1.55x |" in row(text, "2026-12-01 05:06")
    # After the everything-on tables, before each feature alone.
    assert text.index("`all_c1` completions") < text.index("### History") < text.index("### Each feature alone")


def test_the_history_in_docs_benchmarks_md_is_what_the_code_renders_from_the_committed_file() -> None:
    entries = history.read()
    assert entries, "bench/history/everything.jsonl has no line"
    block = Template(TEMPLATE).fill("everything_history", table=history.section(entries, markdown_table))
    docs = (REPO / "docs" / "benchmarks.md").read_text()
    assert block in section(docs, "Everything on")
    # The published run is the newest line.
    published = re.search(r"Generated by `bench` on (\S+ \S+ UTC)", docs)
    assert published and max(e.date for e in entries) == published.group(1)


def test_the_tree_measured_is_named_by_its_short_hash(tmp_path: Path) -> None:
    assert history.git_state(tmp_path) == ("unknown", None)
    commit, dirty = history.git_state(REPO)
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True)
    assert commit == head.stdout.strip() and isinstance(dirty, bool)
