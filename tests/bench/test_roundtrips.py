"""`python -m bench.roundtrips`: Redis round trips per request, counted by MONITOR on a real redis-server.

The integration test runs the real app in process with everything on against a real redis-server, a
SQLite ledger and the bench's loopback upstream; the others check how commands are grouped and placed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import roundtrips
from bench.roundtrips import Command, Window
from tests.helpers.redis import RedisServer


def _cmd(at: float, client: str, *words: str) -> Command:
    return Command(at, client, words[0], list(words[1:]))


def test_a_pipeline_is_one_round_trip_and_a_script_call_is_named_by_its_mode() -> None:
    a, b = "127.0.0.1:1000", "127.0.0.1:2000"
    commands = [
        _cmd(1.0, a, "EVALSHA", "sha", "2", "k1", "k2", "acquire", "", "rpm"),
        _cmd(1.00001, "lua", "TIME"),
        _cmd(1.00002, "lua", "GET", "k1"),
        # The same client right after a script ran: written after that script's answer, a trip of its own.
        _cmd(1.00003, a, "EVALSHA", "sha", "1", "k1", "adjust", "", "tpm"),
        _cmd(2.0, b, "MULTI"),
        _cmd(2.00001, b, "HINCRBY", "usage", "f", "1"),
        _cmd(2.00002, b, "EXEC"),
        _cmd(2.00003, a, "GET", "x"),  # another client between: its own trip
        _cmd(3.0, b, "GET", "y"),
    ]
    trips = roundtrips.round_trips(commands)
    assert [what for _, what in trips] == [
        "script acquire",
        "script adjust",
        "pipeline MULTI ... EXEC (3 commands)",
        "GET",
        "GET",
    ]


def test_round_trips_go_to_the_request_they_arrived_during() -> None:
    a = "127.0.0.1:1000"
    windows = [Window(start=10.0, answered=10.5, end=10.6), Window(start=11.0, answered=11.5, end=11.6)]
    commands = [
        _cmd(9.0, a, "GET", "before-the-run"),
        _cmd(10.1, a, "EVALSHA", "sha", "1", "k", "acquire"),
        _cmd(10.55, a, "EVALSHA", "sha", "1", "k", "release"),
        _cmd(11.2, a, "EVALSHA", "sha", "1", "k", "acquire"),
        _cmd(11.3, "lua", "TIME"),
        _cmd(12.0, a, "GET", "after-the-run"),
    ]
    report = roundtrips.attribute(commands, windows).as_dict()
    assert report["round_trips_before_answer"] == 1.0
    assert report["before_answer"] == {"script acquire": 1.0}
    assert report["after_answer"] == {"script release": 0.5}
    assert report["commands_before_answer"] == {"script acquire": 1.0}
    assert report["script_commands"] == {"TIME": 0.5}
    # A timer's command written with the acquire in one pipeline: one round trip, and still the request's acquire.
    commands[1:2] = [_cmd(10.1, a, "GET", "timer"), _cmd(10.10001, a, "EVALSHA", "sha", "1", "k", "acquire")]
    report = roundtrips.attribute(commands, windows).as_dict()
    assert report["before_answer"] == {"pipeline GET ... script acquire (2 commands)": 0.5, "script acquire": 0.5}
    assert report["commands_before_answer"] == {"script acquire": 1.0, "GET": 0.5}
    assert report["start_to_first_round_trip_us_p50"] == pytest.approx(150_000.0)


def test_everything_on_one_request_at_a_time(rds: RedisServer, tmp_path: Path) -> None:
    url = rds.url.rsplit("/", 1)[0] + "/14"
    report = roundtrips.measure("h1", url, f"sqlite:///{tmp_path / 'ledger.db'}", requests=30, warmup=5, hits=False)
    figures = report.as_dict()
    # One admission script call per request, which the answer waits for (alone, or written in one pipeline
    # with a timer's command that a loaded machine sent at the same moment); the script's own reads and
    # writes run inside Redis and are no round trips.
    assert figures["commands_before_answer"]["script acquire"] == 1.0
    assert figures["before_answer"]["script acquire"] >= 0.9
    assert figures["round_trips_before_answer"] < 1.2
    assert figures["script_commands"]["TIME"] >= 1.0
    assert figures["script_commands"]["GET"] >= 2.0


def test_a_merged_script_call_is_named_and_counted_by_the_calls_it_carries() -> None:
    a = "127.0.0.1:1000"
    windows = [Window(start=10.0, answered=10.5, end=10.6)]
    # A tick's acquire (two buckets) and a timer's token correction (one bucket) in one `batch` call.
    acquire = ["2", "acquire", "", "rpm", "60", "60000", "1", "tpm", "1000", "60000", "20"]
    adjust = ["1", "adjust", "", "tpm", "1000", "60000", "-4"]
    merged = _cmd(10.1, a, "EVALSHA", "sha", "3", "k1", "k2", "k3", "batch", *acquire, *adjust)
    report = roundtrips.attribute([merged], windows).as_dict()
    assert report["before_answer"] == {"script batch (acquire, adjust)": 1.0}
    assert report["commands_before_answer"] == {"script acquire": 1.0, "script adjust": 1.0}
    assert roundtrips.kind(_cmd(1.0, a, "EVALSHA", "sha", "1", "k", "acquire", "", "rpm", "1", "1", "1")) == (
        "script acquire"
    )
