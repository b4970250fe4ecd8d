"""bench.profile's arithmetic: py-spy's collapsed stacks to microseconds of one core per request, and the
table that sets a configuration's profile against the gateway with nothing on."""

from __future__ import annotations

import pytest

from bench.profile import against, per_request_us

# Two threads, 100 samples a second for 2 s: the main thread ran 150 samples (0.75 of a core), the writer 50.
PLAIN = "\n".join(
    [
        "thread (1): MainThread;run (a/runners.py:1);serve (gateway/x.py:3);parse (gateway/x.py:9) 100",
        "thread (1): MainThread;run (a/runners.py:1);serve (gateway/x.py:4) 50",
    ]
)
ON = "\n".join(
    [
        "thread (1): MainThread;run (a/runners.py:1);serve (gateway/x.py:3);parse (gateway/x.py:9) 100",
        "thread (1): MainThread;run (a/runners.py:1);serve (gateway/x.py:4);admit (gateway/limits.py:7) 60",
        "thread (1): MainThread;run (a/runners.py:1);serve (gateway/x.py:4) 40",
        "thread (2): writer_0;insert (gateway/ledger.py:2) 50",
        "not a stack line",
    ]
)


def test_samples_become_microseconds_of_a_core_per_request() -> None:
    # 1,000 requests a second: a thread busy the whole time costs 1,000 µs per request.
    costs = per_request_us(PLAIN, rate=100, seconds=2.0, rps=1000.0)
    assert costs.us["all threads"] == pytest.approx(750.0)
    assert costs.us["thread MainThread"] == pytest.approx(750.0)
    # A function's lines count as one, with what it calls.
    assert costs.us["serve (gateway/x.py)"] == pytest.approx(750.0)
    assert costs.us["parse (gateway/x.py)"] == pytest.approx(500.0)
    assert costs.calls["serve (gateway/x.py)"] == {"parse (gateway/x.py)"}
    # Twice the throughput halves every figure.
    assert per_request_us(PLAIN, 100, 2.0, 2000.0).us["parse (gateway/x.py)"] == pytest.approx(250.0)
    assert per_request_us(PLAIN, 100, 2.0, 0.0).us == {}


def test_against_lists_what_the_configuration_adds_first() -> None:
    plain = per_request_us(PLAIN, 100, 2.0, 1000.0)
    on = per_request_us(ON, 100, 2.0, 800.0)
    table = against(plain, on, top=10)
    lines = table.splitlines()
    assert lines[2] == "| `all threads` | 750.0 | 1562.5 | +812.5 |"
    assert lines[3] == "| `thread MainThread` | 750.0 | 1250.0 | +500.0 |"
    assert lines[4] == "| `thread writer` | 0.0 | 312.5 | +312.5 |"
    rows = [line.split(" | ")[0].removeprefix("| `").removesuffix("`") for line in lines[5:]]
    # `serve` adds the most (all of the main thread's extra); then admit and the writer's insert, then parse.
    assert rows == [
        "serve (gateway/x.py)",
        "admit (gateway/limits.py)",
        "insert (gateway/ledger.py)",
        "parse (gateway/x.py)",
    ]
    # `run` does nothing but call `serve` in both profiles: the same figures, shown once, as the callee.
    assert "run (a/runners.py)" not in table


def test_against_keeps_a_caller_whose_figures_differ_from_its_callees() -> None:
    plain = per_request_us(PLAIN, 100, 2.0, 1000.0)
    on = per_request_us(ON, 100, 2.0, 800.0)
    assert "| `parse (gateway/x.py)` | 500.0 | 625.0 | +125.0 |" in against(plain, on, top=10)
    assert against(plain, on, top=1).count("\n") == 2 + 3 + 1
