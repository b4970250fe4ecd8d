"""bench.cpusplit's configurations and arithmetic: each "everything but" leaves out exactly its part, every
configuration is one the gateway starts with, and the CPU it reads is the process's own (with workers, every
worker's)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from bench import everything
from bench.configs import gateway_config, merge
from bench.cpusplit import PARTS, Run, configurations, report, summary, without
from bench.processes import tree_switches, tree_user_system_seconds, user_system_seconds
from gateway.config import parse_config

REDIS = "redis://127.0.0.1:6399/0"


@pytest.mark.parametrize("part", PARTS)
def test_everything_but_a_part_differs_from_everything_in_that_part_alone(part: str) -> None:
    full = everything.fragment(REDIS, "sqlite:///x.db")
    less = without(part, REDIS, "sqlite:///x.db")
    changed = {k for k in full.keys() | less.keys() if full.get(k) != less.get(k)}
    assert (
        changed
        == {
            "limits": {"keys", "redis"},
            "cache": {"cache"},
            "ledger": {"ledger"},
            "queue": {"providers"},
            "log": {"logging"},
        }[part]
    )
    assert full == everything.fragment(REDIS, "sqlite:///x.db")  # the shared fragment is left as it was


def test_an_unknown_part_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'tracing'"):
        without("tracing", REDIS, "sqlite:///x.db")


def test_every_configuration_is_one_the_gateway_starts_with(tmp_path: Path) -> None:
    configs = configurations(REDIS, tmp_path, "t")
    assert list(configs)[:1] == ["nothing on"] and "everything on" in configs
    assert [n for n in configs if n.startswith("everything but")] == [f"everything but {p}" for p in PARTS]
    for name, fragment in configs.items():
        text = yaml.safe_dump(merge(gateway_config(9, 8, None), fragment), sort_keys=False)
        parse_config(text, f"{name}.yaml")  # typed, unknown fields refused: raises on a bad fragment


def test_the_cpu_read_is_this_processs_own() -> None:
    u0, s0 = user_system_seconds(os.getpid())
    before = time.process_time()
    while time.process_time() - before < 0.3:
        sum(range(20_000))  # a fraction of a millisecond of user time per read of the clock (a system call)
    u1, s1 = user_system_seconds(os.getpid())
    spent = time.process_time() - before
    # /proc counts in clock ticks (10 ms): within a few ticks of what the process measures itself.
    assert abs((u1 - u0) + (s1 - s0) - spent) < 0.05
    assert u1 - u0 >= 0.2


def test_with_workers_the_cpu_of_every_process_is_counted() -> None:
    # A stand-in worker: burns 0.3 s of CPU, says so, and stays alive (so /proc still has it) until told to go.
    code = (
        "import sys, time\n"
        "t = time.process_time()\n"
        "while time.process_time() - t < 0.3: sum(range(20_000))\n"
        "print('burnt', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as child:
        try:
            u0, s0 = tree_user_system_seconds([os.getpid(), child.pid])
            assert child.stdout is not None and child.stdout.readline() == b"burnt\n"
            u1, s1 = tree_user_system_seconds([os.getpid(), child.pid])
            mine = user_system_seconds(os.getpid())
        finally:
            child.kill()
    assert (u1 - u0) + (s1 - s0) >= 0.25  # the child's burn, though this process mostly waited
    assert sum(mine) < u1 + s1  # the sum covers more than this process alone
    assert tree_user_system_seconds([2**22 + 12345]) == (0.0, 0.0)  # no such process: nothing, not an error


def test_the_switches_read_count_every_thread_s_sleeps() -> None:
    go, done, leave = threading.Event(), threading.Event(), threading.Event()

    def sleeper() -> None:
        go.wait()
        for _ in range(50):
            time.sleep(0.002)
        done.set()
        leave.wait()  # still alive when the switches are read: a thread's counts go with it

    thread = threading.Thread(target=sleeper, daemon=True)
    thread.start()
    try:
        before = tree_switches([os.getpid()])
        go.set()
        assert done.wait(5)
        after = tree_switches([os.getpid()])
    finally:
        leave.set()
        thread.join(5)
    assert after[0] - before[0] >= 50  # every sleep of the second thread, counted with this process
    assert tree_switches([2**22 + 12345]) == (0, 0)  # no such process: nothing, not an error


def test_the_report_compares_parts_alone_to_nothing_and_everything_but_to_everything() -> None:
    runs = {
        "nothing on": [Run(100.0, 50.0, 20.0, 90.0), Run(90.0, 52.0, 22.0, 110.0), Run(110.0, 48.0, 18.0, 100.0)],
        "cache alone": [Run(95.0, 55.0, 20.0, 104.0, slept=0.05, preempted=0.5)],
        "everything on": [Run(70.0, 80.0, 30.0, 190.0, 9.0, 0.1), Run(60.0, 82.0, 31.0, 200.0, 7.0, 0.3)],
        "everything but cache": [Run(75.0, 70.0, 28.0, 182.0, 6.5, 0.125, 0.02, 1.25)],
    }
    rows = summary(runs)
    assert rows[0] == ("nothing on", 100.0, 50.0, 20.0, 100.0, 0.0, 0.0, 0.0, 0.0)  # medians, each on its own
    assert rows[2] == ("everything on", 65.0, 81.0, 30.5, 195.0, 8.0, 0.2, 0.0, 0.0)
    text = report(rows, "head")
    assert (
        "| cache alone | 95 | 55.0 | 20.0 | 75.0 | 104 | +5.0 µs CPU, p50 +4 µs against nothing on | 0.0 | 0.000 "
        "| 0.05 / 0.50 |" in text
    )
    assert (
        "| everything but cache | 75 | 70.0 | 28.0 | 98.0 | 182 | -13.5 µs CPU, p50 -13 µs against everything on "
        "| 6.5 | 0.125 | 0.02 / 1.25 |" in text
    )
