"""The "Each feature alone" table of docs/benchmarks.md: every ``feature_*`` row against nothing on.

Each ratio is taken against the gateway with nothing on measured seconds before or after it in the same scenario,
so the machine's drift over the run does not enter it; with rounds (``--feature-rounds``), the row's ratio is the
median of its rounds' ratios and its req/s and CPU are each target's median run.
"""

from __future__ import annotations

from collections.abc import Callable

from bench.features import FEATURES, NOTHING, RATIO_GOAL
from bench.scenarios import Measurement, median_ratio, round_ratios


def _get(measurements: list[Measurement], scenario: str, target: str) -> Measurement | None:
    for m in measurements:
        if m.scenario == scenario and m.target == target and m.ok and m.requests:
            return m
    return None


def ratio(base: Measurement | None, on: Measurement | None) -> float | None:
    """What the feature leaves of nothing on's throughput: the median of its rounds' ratios."""
    return median_ratio(base, on)


def nothing_on_runs(measurements: list[Measurement]) -> list[float]:
    """Every run of the gateway with nothing on over the feature rows: one configuration, the same in every row,
    measured again and again over minutes."""
    runs: list[float] = []
    for feature in FEATURES:
        base = _get(measurements, feature.scenario, NOTHING)
        if base is not None:
            runs += [r for r in (base.runs_rps if base.runs_rps is not None else [base.rps]) if r]
    return runs


def spread(measurements: list[Measurement]) -> float | None:
    """The machine's own noise in a run: its slowest run of nothing on over its fastest (1.0: none at all)."""
    return _spread(nothing_on_runs(measurements))


def _spread(runs: list[float]) -> float | None:
    return min(runs) / max(runs) if len(runs) > 1 else None


def _noise(measurements: list[Measurement]) -> str:
    runs = nothing_on_runs(measurements)
    found = _spread(runs)
    if found is None:
        return ""
    text = (
        f"The machine's own noise in this run: the gateway with nothing on, the same configuration in every row, "
        f"ran {len(runs)} times over these rows and served {min(runs):,.0f} to {max(runs):,.0f} req/s, its slowest "
        f"run {found:.2f}x its fastest."
    )
    if found < RATIO_GOAL:
        text += (
            f" That is a wider swing than the {1 - RATIO_GOAL:.0%} a feature may cost: in this run a row can meet or"
            " miss the goal on the machine's noise alone, so read its rounds, the History table's other runs and the"
            " instruction counts before the verdict."
        )
    return text


def _verdict(found: float | None) -> str:
    if found is None:
        return "-"
    if found >= RATIO_GOAL:
        return f"{found:.2f}x"
    # Below the goal by less than the last digit shown: one digit more, so the figure does not read as met.
    shown = f"{found:.2f}x" if f"{found:.2f}" != f"{RATIO_GOAL:.2f}" else f"{found:.3f}x"
    return f"{shown} (**below**)"


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def section(measurements: list[Measurement], table: Callable[[list[str], list[list[str]]], list[str]]) -> str:
    """Markdown for the feature rows; empty when none was run."""
    rows: list[list[str]] = []
    for feature in FEATURES:
        if not any(m.scenario == feature.scenario for m in measurements):
            continue
        base, on = (_get(measurements, feature.scenario, t) for t in (NOTHING, feature.target))
        rounds = round_ratios(base, on)
        found = ratio(base, on)
        added = (
            (on.cpu_s_per_1k - base.cpu_s_per_1k) * 1000.0
            if on and base and on.cpu_s_per_1k is not None and base.cpu_s_per_1k is not None
            else None
        )
        rows.append(
            [
                f"`{feature.scenario}` {feature.what}",
                _fmt(base.rps if base else None, 0),
                _fmt(on.rps, 0) if on else "failed or not run",
                _verdict(found),
                ", ".join(f"{r:.2f}x" for r in rounds) if len(rounds) > 1 else "-",
                _fmt(base.cpu_s_per_1k if base else None, 3),
                _fmt(on.cpu_s_per_1k if on else None, 3),
                "-" if added is None else f"{added:+,.0f}",
                _fmt(base.p99_ms if base else None, 2),
                _fmt(on.p99_ms if on else None, 2),
            ]
        )
    if not rows:
        return ""
    noise = _noise(measurements)
    return "\n".join(
        table(
            [
                "feature alone (c=32)",
                "nothing on req/s",
                "feature on req/s",
                f"on / nothing on, median of its rounds (goal ≥ {RATIO_GOAL:.2f}x)",
                "each round",
                "nothing on CPU s/1k",
                "on CPU s/1k",
                "CPU added µs/request",
                "nothing on p99 ms",
                "on p99 ms",
            ],
            rows,
        )
        + ([f"\n{noise}"] if noise else [])
    )
