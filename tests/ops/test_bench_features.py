"""The bench's feature-alone rows (bench/features.py): what each target's config holds, which runs select the
rows, and their table in docs/benchmarks.md rendered from a synthetic run. No benchmark runs here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import everything, features
from bench.__main__ import expand_only, parse_args
from bench.configs import gateway_config, merge
from bench.features import FEATURES, NOTHING
from bench.report import render_markdown
from bench.report_features import nothing_on_runs, ratio, spread
from bench.scenarios import Settings, build_scenarios, median_run, round_order, round_ratios
from gateway.config.loading import parse_config
from tests.ops.test_bench_report import _m, row, section, synthetic

REDIS = "redis://127.0.0.1:6399/0"


def _config(name: str, tmp_path: Path) -> dict[str, Any]:
    config: dict[str, Any] = merge(
        gateway_config(9001, 9002, None), features.fragment(name, REDIS, tmp_path, f"only-{name}")
    )
    return config


def test_the_everything_on_fragment_is_the_union_of_the_parts_the_feature_rows_take_one_by_one() -> None:
    assert everything.fragment(REDIS, "sqlite:///l.db") == {
        "redis": {"url": REDIS},
        "keys": [{"name": "bench", "key": "bench-key", "limits": {"rpm": 100_000_000, "tpm": 10_000_000_000}}],
        "cache": {"mode": "always"},
        "ledger": {"url": "sqlite:///l.db"},
        "providers": {"up": {"max_concurrency": 100_000}},
        "logging": {"requests": True},
    }


def test_nothing_on_turns_the_default_access_log_off_and_each_target_adds_exactly_its_part(tmp_path: Path) -> None:
    nothing = _config("nothing", tmp_path)
    assert nothing["logging"] == {"requests": False}
    # The gateway logs every request unless told not to: "nothing on" has to say so.
    assert parse_config(yaml.safe_dump(gateway_config(9001, 9002, None))).config.logging.requests is True
    assert parse_config(yaml.safe_dump(nothing)).config.logging.requests is False
    added = {
        "limits": {"redis", "keys"},
        "cache": {"cache"},
        "ledger": {"ledger"},
        "queue": {"providers"},
        "queue-redis": {"redis", "providers"},
        "log": {"logging"},
    }
    assert set(added) == {f.name for f in FEATURES}
    for name, keys in added.items():
        on = _config(name, tmp_path)
        assert {k for k in on if on[k] != nothing.get(k)} == keys, name
        loaded = parse_config(yaml.safe_dump(on), f"{name}.yaml").config  # the gateway accepts it
        assert loaded.logging.requests is (name == "log")
        assert bool(loaded.redis.url) is (name in ("limits", "queue-redis"))
    assert _config("queue-redis", tmp_path)["providers"]["up"]["max_concurrency"] == 100_000
    assert _config("ledger", tmp_path)["ledger"]["url"] == f"sqlite:///{tmp_path / 'ledger-only-ledger.db'}"
    with pytest.raises(ValueError, match="Redis"):
        features.fragment("limits", None, tmp_path, "x")


def test_the_feature_rows_run_by_default_and_with_only_features_each_beside_nothing_on() -> None:
    base = Settings(10, 2, 32, 100, 0, 50, 500, 5000, 500, 30, 3, 1, False, Path("."), Path("."), 20_000, 2_000)

    def scenarios(only: str | None) -> dict[str, Any]:
        return {x.name: x for x in build_scenarios(Settings(**{**vars(base), "only": expand_only(only)}))}

    chosen = scenarios("features")
    assert list(chosen) == list(features.SCENARIOS) and len(chosen) == len(FEATURES) == 6
    for f in FEATURES:
        s = chosen[f.scenario]
        assert s.targets == (NOTHING, f.target) and s.vary and s.connections == 32 and s.tool == "wrk"
        assert s.rounds == 3  # the default: three rounds of the pair
        assert not s.stream and s.path == "/v1/completions"
    assert set(features.SCENARIOS) <= set(scenarios(None))
    assert not set(features.SCENARIOS) & set(scenarios("everything"))
    assert set(scenarios("everything,features")) == set(everything.SCENARIOS) | set(features.SCENARIOS)


def test_each_feature_is_set_against_the_nothing_on_of_its_own_scenario() -> None:
    limits, cache, *_ = FEATURES
    run = synthetic()
    assert "Each feature alone" not in render_markdown(run)
    run.measurements += [
        # A nothing-on row of another scenario must not be the base of this one.
        _m(limits.scenario, NOTHING, rps=4_000.0, cpu_s_per_1k=0.250, p99_ms=9.5),
        _m(limits.scenario, limits.target, rps=3_400.0, cpu_s_per_1k=0.300, p99_ms=12.25),
        _m(cache.scenario, NOTHING, rps=3_000.0, cpu_s_per_1k=0.320),
        _m(cache.scenario, cache.target, rps=2_850.0, cpu_s_per_1k=0.330),
    ]
    text = section(render_markdown(run), "Everything on")
    assert "### Each feature alone" in text
    line = row(text, f"`{limits.scenario}` {limits.what}")
    assert "| 4,000 | 3,400 | 0.85x (**below**) | - | 0.250 | 0.300 | +50 | 9.50 | 12.25 |" in line
    assert "| 3,000 | 2,850 | 0.95x | - | 0.320 | 0.330 | +10 |" in row(text, f"`{cache.scenario}` {cache.what}")
    assert "feature_ledger_c32" not in text  # not run: no row
    assert "| `all_c32`" not in text  # the everything-on rows were not run: no table of theirs


def test_a_failed_feature_row_is_said_so_and_has_no_ratio() -> None:
    ledger = FEATURES[2]
    run = synthetic()
    run.measurements += [
        _m(ledger.scenario, NOTHING, rps=4_000.0),
        _m(ledger.scenario, ledger.target, ok=False, rps=10.0, errors=5, note="errors"),
    ]
    line = row(section(render_markdown(run), "Everything on"), f"`{ledger.scenario}` {ledger.what}")
    assert "| 4,000 | failed or not run | - |" in line


def test_rounds_alternate_the_order_so_each_run_sits_beside_one_of_the_others() -> None:
    assert round_order(("a", "b"), 1) == ["a", "b"]
    assert round_order(("a", "b"), 3) == ["a", "b", "b", "a", "a", "b"]
    assert round_order(("a", "b"), 4) == ["a", "b", "b", "a", "a", "b", "b", "a"]
    base = Settings(
        10,
        2,
        32,
        100,
        0,
        50,
        500,
        5000,
        500,
        30,
        3,
        1,
        False,
        Path("."),
        Path("."),
        feature_rounds=5,
        everything_rounds=4,
    )
    chosen = {s.name: s for s in build_scenarios(Settings(**{**vars(base), "only": expand_only("features")}))}
    assert {s.rounds for s in chosen.values()} == {5}
    # The cache-hit row's goal is a ratio of two runs too: it takes the feature rows' rounds.
    assert {s.name for s in build_scenarios(base) if s.rounds == 5} == {*chosen, "cached_c32"}
    # The everything-on rows the goals are read off take theirs.
    goals = {"all_c32", "all_c1", "all_chat_c1"}
    assert {s.name for s in build_scenarios(base) if s.rounds == 4} == goals
    # No other row takes rounds.
    rounded = {*chosen, *goals, "cached_c32"}
    assert {s.rounds for s in build_scenarios(base) if s.name not in rounded} == {1}


def test_a_target_of_rounds_is_its_median_run_and_keeps_every_run() -> None:
    runs = [
        _m("x", NOTHING, rps=5_000.0, cpu_s_per_1k=0.5),
        _m("x", NOTHING, rps=3_000.0, cpu_s_per_1k=0.3),
        _m("x", NOTHING, ok=False, rps=10.0, errors=9, note="errors"),
        _m("x", NOTHING, rps=4_000.0, cpu_s_per_1k=0.4, p99_ms=7.0),
    ]
    merged = median_run(runs)
    assert merged.rps == 4_000.0 and merged.cpu_s_per_1k == 0.4 and merged.p99_ms == 7.0  # one run, whole
    assert merged.runs_rps == [5_000.0, 3_000.0, None, 4_000.0]
    assert merged.ok and merged.note == "1 of its 4 runs failed (errors)"
    assert median_run(runs[:2]).note is None  # nothing to say when every run succeeded
    # An even count: the lower of the two middle runs, not a mean no run measured.
    assert median_run(runs[:2]).rps == 3_000.0
    failed = median_run([runs[2]])
    assert not failed.ok and failed.runs_rps == [None]


def test_a_row_of_rounds_is_the_median_of_its_rounds_ratios_each_listed() -> None:
    cache = FEATURES[1]
    run = synthetic()
    # Round 2's nothing on ran slow (the machine busy): its ratio (1.10x) is not the row's, nor is the ratio of
    # the median runs (4,000 / 4,200 = 0.95x): the row's is the median round's.
    base = _m(cache.scenario, NOTHING, rps=4_200.0, runs_rps=[4_200.0, 3_000.0, 5_000.0])
    on = _m(cache.scenario, cache.target, rps=4_000.0, runs_rps=[3_570.0, 3_300.0, 4_000.0])
    run.measurements += [base, on]
    line = row(section(render_markdown(run), "Everything on"), f"`{cache.scenario}` {cache.what}")
    assert "| 4,200 | 4,000 | 0.85x (**below**) | 0.85x, 1.10x, 0.80x |" in line
    assert round_ratios(base, on) == pytest.approx([0.85, 1.1, 0.8]) and ratio(base, on) == pytest.approx(0.85)
    # A round the feature's run failed in has no ratio; an even count of rounds: the mean of the middle two.
    on.runs_rps = [3_570.0, None, 4_000.0, 2_400.0]
    base.runs_rps = [4_200.0, 3_000.0, 5_000.0, 3_000.0]
    assert round_ratios(base, on) == pytest.approx([0.85, 0.8, 0.8]) and ratio(base, on) == pytest.approx(0.8)
    on.runs_rps = [3_570.0, 2_400.0]
    assert ratio(base, on) == pytest.approx((0.85 + 0.8) / 2)
    assert ratio(base, None) is None and round_ratios(None, on) == []
    # Just below the goal: a digit more than 0.90x, which would read as met.
    base.runs_rps, on.runs_rps = [1_000.0], [899.0]
    line = row(section(render_markdown(run), "Everything on"), f"`{cache.scenario}` {cache.what}")
    assert "| 0.899x (**below**) |" in line


def test_the_machines_noise_is_the_spread_of_nothing_on_over_every_feature_row() -> None:
    limits, cache = FEATURES[0], FEATURES[1]
    run = synthetic()
    assert spread(run.measurements) is None and "machine's own noise" not in render_markdown(run)
    run.measurements += [
        _m(limits.scenario, NOTHING, rps=4_000.0, runs_rps=[4_000.0, 3_900.0, None]),
        _m(limits.scenario, limits.target, rps=3_800.0, runs_rps=[3_800.0, 3_700.0, 3_600.0]),
        _m(cache.scenario, NOTHING, rps=4_100.0, runs_rps=[4_100.0, 4_200.0, 4_050.0]),
        _m(cache.scenario, cache.target, rps=4_000.0, runs_rps=[4_000.0, 4_000.0, 4_000.0]),
    ]
    # Only nothing on's runs, over both rows (a failed run has none): 3,900 to 4,200.
    assert nothing_on_runs(run.measurements) == [4_000.0, 3_900.0, 4_100.0, 4_200.0, 4_050.0]
    assert spread(run.measurements) == pytest.approx(3_900 / 4_200)
    text = section(render_markdown(run), "Everything on")
    assert "ran 5 times over these rows and served 3,900 to 4,200 req/s, its slowest run 0.93x its fastest." in text
    assert "on the machine's noise alone" not in text  # within the 10 % a feature may cost
    run.measurements[-2].runs_rps = [4_100.0, 6_000.0, 4_050.0]
    text = section(render_markdown(run), "Everything on")
    assert "its slowest run 0.65x its fastest. That is a wider swing than the 10% a feature may cost" in text


def test_feature_rounds_below_one_are_refused() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--feature-rounds", "0"])
    assert parse_args(["--feature-rounds", "5"]).feature_rounds == 5
