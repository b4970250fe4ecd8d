"""The engine-metrics parser and inflater as pure functions: per kind, piece by piece, hostile values refused.

The reads over real sockets (a 400 MiB body, a gzip bomb, a slow replica) are in test_hostile_metrics.py.
"""

from __future__ import annotations

import gzip
import time
import zlib

import pytest

from gateway.fleet.exposition import (
    MAX_LINE,
    MAX_SAMPLES,
    PIECE,
    Exposition,
    Inflater,
    Unreadable,
    parse,
    samples_of,
)
from gateway.fleet.picker import EngineLoad
from providers.engine import LLAMACPP_GAUGES, SGLANG_GAUGES, VLLM_GAUGES

VLLM = b"""# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
vllm:num_requests_running{engine="0",model_name="m"} 7.0
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.5
vllm:num_requests_waiting_by_reason{reason="x"} 99
vllm:num_requests_waiting_total 1e9
"""


def test_engine_metrics_are_parsed_per_kind_and_missing_ones_are_unreadable() -> None:
    # Waiting and running are summed over labels (one per data-parallel engine); KV usage is the fullest.
    assert parse(VLLM, VLLM_GAUGES) == EngineLoad(waiting=5.0, running=7.0, kv_usage=0.5)
    assert parse(b"sglang:num_queue_reqs 4\nsglang:num_running_reqs 1\n", SGLANG_GAUGES) == EngineLoad(4.0, 1.0)
    assert parse(b"llamacpp:requests_deferred 2 1700000000000", LLAMACPP_GAUGES) == EngineLoad(2.0, 0.0)
    assert parse(b'vllm:num_requests_waiting{a="}"} 1\n', VLLM_GAUGES) == EngineLoad(1.0, 0.0)
    with pytest.raises(Unreadable, match="no vllm:num_requests_waiting series"):
        parse(b"<html>not metrics</html>", VLLM_GAUGES)
    with pytest.raises(Unreadable, match="no vllm:num_requests_waiting series"):
        parse(b'vllm:num_requests_waiting{a="b"} NaNx\n', VLLM_GAUGES)


@pytest.mark.parametrize("value", ["-1e9", "-1", "NaN", "+Inf", "-Inf", "1e7", "1e308"])
def test_a_negative_not_finite_or_absurd_value_makes_the_reading_unreadable(value: str) -> None:
    body = f"vllm:num_requests_waiting {value}\nvllm:num_requests_running 1\n".encode()
    with pytest.raises(Unreadable, match="invalid value of vllm:num_requests_waiting") as refused:
        parse(body, VLLM_GAUGES)
    assert refused.value.kind == "invalid_value"
    body = f"vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc {value.replace('1e7', '1.5')}\n".encode()
    with pytest.raises(Unreadable, match="invalid value of vllm:kv_cache_usage_perc"):
        parse(body, VLLM_GAUGES)


def test_many_valid_samples_cannot_add_up_to_an_absurd_load() -> None:
    body = b"".join(b'vllm:num_requests_waiting{i="%d"} 900000\n' % i for i in range(3))
    with pytest.raises(Unreadable, match="absurd total"):
        parse(body, VLLM_GAUGES)


def test_the_scan_matches_the_wanted_names_only_whole_and_with_or_without_labels() -> None:
    rx = samples_of(("vllm:num_requests_waiting", "vllm:num_requests_running"))
    text = b"""# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting 1
vllm:num_requests_waiting{engine="0",model_name="m"} 2.5 1700000000000
vllm:num_requests_running{a="} 9",b="x"}	3
vllm:num_requests_waiting_total 4
vllm:num_requests_waiting_by_reason{reason="x"} 5
vllm:num_requests_waitingx 6
xvllm:num_requests_waiting 7
 vllm:num_requests_waiting 8
vllm:num_requests_waiting
vllm:num_requests_waiting{a="b"}
a 0
vllm:num_requests_waiting\t9\r
vllm_num_requests_waiting 10
"""
    found = [(m.group(1), m.group(2)) for m in rx.finditer(text)]
    assert found == [
        (b"vllm:num_requests_waiting", b"1"),
        (b"vllm:num_requests_waiting", b"2.5"),
        (b"vllm:num_requests_running", b"3"),
        (b"vllm:num_requests_waiting", b"9"),
    ]
    # A name's regex characters are literal (`.` is no wildcard) and a name that prefixes another is no cut.
    rx = samples_of(("a.b", "a.bc"))
    assert [m.group(1) for m in rx.finditer(b"aXb 1\na.bc 2\na.b 3\na.bcd 4\n")] == [b"a.bc", b"a.b"]
    # Through the parser: the foreign series that share a prefix with a wanted one add nothing.
    assert parse(text, VLLM_GAUGES) == EngineLoad(waiting=12.5, running=3.0)


def test_foreign_lines_cost_no_python_step_and_wanted_samples_are_capped() -> None:
    # Two million tiny foreign samples around the wanted one: parsed, and the wanted one found.
    body = b"a 0\n" * 1_000_000 + b"vllm:num_requests_waiting 3\n" + b"b 0\n" * 1_000_000
    start = time.process_time()
    assert parse(body, VLLM_GAUGES) == EngineLoad(3.0, 0.0)
    # Scanned in C: well under a second (a Python step per line took several seconds on the same machine).
    assert time.process_time() - start < 0.5
    # Samples of the wanted series are each a Python step: past MAX_SAMPLES the read is refused.
    body = b"vllm:num_requests_waiting 0\n" * (MAX_SAMPLES + 1)
    with pytest.raises(Unreadable, match=f"more than {MAX_SAMPLES} samples") as refused:
        parse(body, VLLM_GAUGES)
    assert refused.value.kind == "too_large"
    assert parse(body[: -len(b"vllm:num_requests_waiting 0\n")], VLLM_GAUGES) == EngineLoad(0.0, 0.0)


def test_pieces_cut_anywhere_give_the_same_load() -> None:
    expected = parse(VLLM, VLLM_GAUGES)
    for size in (1, 2, 7, 33):
        exp = Exposition(VLLM_GAUGES, 1 << 20)
        for start in range(0, len(VLLM), size):
            exp.feed(VLLM[start : start + size])
        assert exp.load() == expected


def test_the_cap_counts_every_byte_fed_and_an_overlong_line_is_skipped() -> None:
    exp = Exposition(VLLM_GAUGES, 1000)
    exp.feed(b"#" * 1000)
    with pytest.raises(Unreadable, match="larger than 1000 bytes"):
        exp.feed(b"\n")
    # A line longer than MAX_LINE is dropped without being held; the lines after it still count.
    exp = Exposition(VLLM_GAUGES, 1 << 30)
    exp.feed(b"vllm:num_requests_waiting 5" + b"0" * MAX_LINE)
    exp.feed(b"0" * MAX_LINE + b"\nvllm:num_requests_waiting 2\n")
    assert exp.load() == EngineLoad(2.0, 0.0)
    # Also one that is under MAX_LINE in each of the two reads it spans, but longer all told.
    half = b'vllm:num_requests_waiting{pad="' + b"x" * (MAX_LINE // 2 + 100)
    exp = Exposition(VLLM_GAUGES, 1 << 30)
    exp.feed(b"vllm:num_requests_waiting 2\n" + half)
    exp.feed(b"x" * (MAX_LINE // 2 + 100) + b'"} 7\n')
    assert exp.load() == EngineLoad(2.0, 0.0)


def test_a_line_arriving_byte_by_byte_counts_up_to_max_line_and_is_skipped_past_it() -> None:
    def fed_bytewise(line: bytes) -> EngineLoad:
        exp = Exposition(VLLM_GAUGES, 1 << 30)
        for byte in (line[i : i + 1] for i in range(len(line))):
            exp.feed(byte)
        exp.feed(b"vllm:num_requests_waiting 1\n")
        return exp.load()

    head = b'vllm:num_requests_waiting{pad="'
    longest = head + b"x" * (MAX_LINE - len(head) - 4) + b'"} 2\n'
    assert len(longest) == MAX_LINE + 1  # MAX_LINE bytes and the newline
    assert fed_bytewise(longest) == EngineLoad(3.0, 0.0)
    assert fed_bytewise(longest[:1] + longest) == EngineLoad(1.0, 0.0)


def test_a_gzip_bomb_inflates_one_piece_at_a_time() -> None:
    bomb = gzip.compress(b"\n" * (256 * 1024 * 1024), compresslevel=9)
    assert len(bomb) < 300_000
    inflater = Inflater("gzip")
    pieces = inflater.pieces(bomb)
    assert [len(p) for p in pieces] == [PIECE]  # not 256 MiB: the rest waits in the inflater
    total = PIECE
    for _ in range(10):
        more = inflater.more()
        assert len(more) == PIECE
        total += len(more)
    assert total == 11 * PIECE
    # deflate (zlib) too; anything else, and a body that is not what it claims, is unreadable.
    assert Inflater("deflate").pieces(zlib.compress(b"x 1\n")) == [b"x 1\n"]
    assert Inflater("identity").pieces(b"abc") == [b"abc"]
    with pytest.raises(Unreadable, match="unsupported content-encoding 'br'"):
        Inflater("br")
    with pytest.raises(Unreadable, match="malformed compressed body"):
        Inflater("gzip").pieces(b"not gzip at all")
