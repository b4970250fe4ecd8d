"""bench.redisload against a real redis-server: the admissions of one tick go to Redis as one script call,
whether they charge one key or a key each, as Redis's own count of script calls says."""

from __future__ import annotations

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


@pytest.mark.parametrize("batches", ["0", "x,8"])
def test_bad_batches_are_refused_by_name(batches: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--batches", batches])
    assert exit_.value.code == 2
    assert "--batches" in capsys.readouterr().err
