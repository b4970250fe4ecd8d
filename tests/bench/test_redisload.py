"""bench.redisload against a real redis-server: the admissions of one tick go to Redis as one script call,
whether they charge one key or a key each, as Redis's own count of script calls says."""

from __future__ import annotations

import re
import shutil

import pytest

from bench.redisload import Row, main, measure, report
from tests.helpers.redis import RedisServer


@pytest.mark.parametrize("own_keys", [False, True], ids=["one key", "a key per admission"])
async def test_a_ticks_admissions_are_one_script_call(rds: RedisServer, own_keys: bool) -> None:
    row = await measure(rds.url, rds.proc.pid, 8, own_keys, 0.3)
    assert row.admissions > 0 and row.admissions % 8 == 0
    # Redis's own count of script calls: every tick's eight admissions went as one.
    assert row.calls * 8 == row.admissions
    assert row.per_call == 8.0
    # The script's time is part of the process's CPU (both per admission, from Redis's own figures).
    assert 0 < row.script_us
    assert 0 < row.cpu_us
    assert row.per_core == pytest.approx(1e6 / row.cpu_us)


async def test_one_admission_a_tick_is_a_call_each(rds: RedisServer) -> None:
    row = await measure(rds.url, rds.proc.pid, 1, False, 0.2)
    assert row.calls == row.admissions > 0


def test_the_report_has_a_line_per_row() -> None:
    rows = [Row(1, "one key", 1000, 1000, 50.0, 30.0), Row(64, "a key per admission", 6400, 100, 20.0, 18.0)]
    text = report(rows, "head")
    assert "| 1 | one key | 1,000 | 1.0 | 50.0 | 30.0 | 20,000 |" in text
    assert "| 64 | a key per admission | 6,400 | 64.0 | 20.0 | 18.0 | 50,000 |" in text


@pytest.mark.parametrize("argv", [["--batches", "0"], ["--batches", "x,8"], ["--admissions", "0"]])
def test_bad_arguments_are_refused_by_name(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert argv[0] in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed (.ci/run installs it)")
def test_instructions_are_counted_per_admission_and_merging_cuts_them(capsys: pytest.CaptureFixture[str]) -> None:
    # A redis-server of its own under callgrind: Redis's instructions per admission, alone and eight to a call.
    assert main(["--count", "instructions", "--batches", "1,8", "--admissions", "200"]) == 0
    out = capsys.readouterr().out
    assert "| admissions per tick | keys | admissions | per script call | Redis instructions per admission |" in out
    rows = re.findall(r"^\| (\d+) \| (one key|a key per admission) \| ([\d,]+) \| ([\d.]+) \| ([\d,]+) \|$", out, re.M)
    assert [(r[0], r[1], r[3]) for r in rows] == [
        ("1", "one key", "1.0"),
        ("8", "one key", "8.0"),
        ("1", "a key per admission", "1.0"),
        ("8", "a key per admission", "8.0"),
    ]
    per = {(r[0], r[1]): int(r[4].replace(",", "")) for r in rows}
    # A lone admission costs Redis tens of thousands of instructions (the script call's arguments, its
    # commands, the reply); eight of one key in one call share the call and each bucket's read and write.
    assert all(20_000 < n < 2_000_000 for n in per.values())
    assert per[("8", "one key")] < per[("1", "one key")] * 0.7
    assert per[("8", "one key")] < per[("8", "a key per admission")]


def test_the_instruction_report_has_a_line_per_row() -> None:
    rows = [Row(1, "one key", 200, 200, 0.0, 0.0, 150_000.4), Row(8, "one key", 200, 25, 0.0, 0.0, 58_000.0)]
    text = report(rows, "head")
    assert "| 1 | one key | 200 | 1.0 | 150,000 |" in text
    assert "| 8 | one key | 200 | 8.0 | 58,000 |" in text
    assert "Redis CPU" not in text
