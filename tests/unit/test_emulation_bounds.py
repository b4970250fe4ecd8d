"""Work bounds of emulation: linear stop scanning, caps on planned work, guided-output checks within budget and
deadline (gateway/emulation)."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import emulation
from gateway.config import CapsConfig
from gateway.emulation.client_schema import Work, WorkExhausted
from tests.unit.emulation_setup import ADAPTER, req
from wire.errors import InvalidRequestError

# -- work bounds (issue 11, items 3 and 14) ------------------------------------------------------


def _reference_scan(pieces: list[str], stops: list[str], include: bool) -> tuple[list[str], bool]:
    """The scanner as it was (rescanning the held text on every chunk): the behaviour to keep."""
    buf, out = "", []
    live = [s for s in stops if s]
    for piece in pieces:
        buf += piece
        hit = emulation.find_stop(buf, live)
        if hit is not None:
            out.append(buf[: hit[0] + (len(hit[1]) if include else 0)])
            return out, True
        hold = 0
        for s in live:
            for k in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:k]):
                    hold = k
                    break
        out.append(buf[: len(buf) - hold])
        buf = buf[len(buf) - hold :]
    return out, False


@settings(max_examples=400, deadline=None)
@given(
    pieces=st.lists(st.text(alphabet="abc", max_size=6), max_size=8),
    stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=5), min_size=1, max_size=4),
    include=st.booleans(),
)
def test_the_linear_stop_scanner_sends_what_the_rescanning_one_did(
    pieces: list[str], stops: list[str], include: bool
) -> None:
    scanner = emulation.StopScanner(stops, include)
    out: list[str] = []
    hit = False
    for piece in pieces:
        text, hit = scanner.feed(piece)
        out.append(text)
        if hit:
            break
    assert (out, hit) == _reference_scan(pieces, stops, include)


def _naive_find(text: str, stops: list[str]) -> tuple[int, str] | None:
    hits = [(text.find(s), i, s) for i, s in enumerate(stops) if s and text.find(s) >= 0]
    return min(hits)[::2] if hits else None


@settings(max_examples=400, deadline=None)
@given(
    text=st.text(alphabet="abc", max_size=30),
    stops=st.lists(st.text(alphabet="abc", max_size=5), min_size=1, max_size=5),
    cuts=st.lists(st.integers(min_value=0, max_value=30), max_size=4),
)
def test_one_automaton_finds_the_earliest_stop_fed_whole_or_in_pieces(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    expected = _naive_find(text, stops)
    assert emulation.find_stop(text, stops) == expected
    # Pieces that are not final (a long chunk read a slice at a time) decide as the whole text does.
    scanner = emulation.StopScanner(stops, include=False)
    bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    sent, stopped = "", False
    for a, b in itertools.pairwise(bounds):
        out, stopped = scanner.feed(text[a:b], final=b == len(text))
        sent += out
        if stopped:
            break
    if not stopped:
        rest, stopped = scanner.flush()
        sent += rest
    assert (sent, stopped) == ((text[: expected[0]], True) if expected else (text, False))


def test_one_automaton_is_linear_in_the_text_whatever_the_number_of_stops() -> None:
    stops = ["a" * 127 + chr(0x100 + i) for i in range(64)]
    scanner = emulation.StopScanner(stops, False)
    start = time.perf_counter()
    for _ in range(64):
        scanner.feed("a" * 4096)
    assert time.perf_counter() - start < 0.5


def test_the_stop_scanner_is_linear_in_a_long_partial_match() -> None:
    # A 4,000-character stop the text keeps almost matching, one character per chunk.
    scanner = emulation.StopScanner(["ab" * 2000 + "!"], False)
    start = time.perf_counter()
    for i in range(40_000):
        scanner.feed("ab"[i % 2])
    assert time.perf_counter() - start < 1.0


CAPS = CapsConfig(emulated_answer_bytes=1024 * 1024, pattern_chars=64, stop_chars=100)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": "x" * 100_000, "n": 11}, "n"),
        ({"prompt": "x" * 100_000, "echo": True, "n": 6}, "n"),
        ({"prompt": "x" * 100_000, "best_of": 11, "logprobs": 1}, "best_of"),
        ({"prompt": ["x" * 60_000] * 9, "echo": True, "n": 2}, "n"),
        ({"stop": ["a", "b", "c" * 65]}, "stop"),
        ({"guided_regex": "(a)\\1"}, "guided_regex"),
        ({"guided_regex": "a" * 65}, "guided_regex"),
        ({"guided_json": {"type": "string", "pattern": "(?!a)"}}, "guided_json"),
        ({"guided_json": {"$ref": "https://example.com/s.json"}}, "guided_json"),
        (
            {
                "guided_json": {
                    "properties": {"a": {"$ref": "#/properties/b"}, "b": {"not": {"$ref": "#/properties/a"}}}
                }
            },
            "guided_json",
        ),
        ({"guided_json": {"type": "strnig"}}, "guided_json"),
        ({"stop": ["a" * 60, "b" * 60], "include_stop_str_in_output": True}, "stop"),
        (
            {
                "guided_json": {
                    "$defs": {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(12)}
                    | {"d12": {"type": "integer"}},
                    "$ref": "#/$defs/d0",
                }
            },
            "guided_json",
        ),
    ],
)
def test_plan_refuses_work_beyond_the_caps(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        emulation.plan(ADAPTER, req(**fields), "p", 2, CAPS)
    assert (err.value.status, err.value.param) == (400, param)


def test_plan_within_the_caps_compiles_the_regex_on_re2() -> None:
    em = emulation.plan(ADAPTER, req(prompt="x" * 100_000, n=5, guided_regex="(a+)+"), "p", 2, CAPS)
    assert em is not None and em.guide is not None
    assert em.guide.check("a" * 30 + "!") == "does not match the regex"
    assert em.guide.check("aaa") is None


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[" * 100 + "]" * 100, "nests deeper than 64 levels"),
        ("[" * 100_000, "nests deeper than 64 levels"),
        ('{"a": "x"}', "does not match the schema ('x' is not of type 'integer')"),
        ('{"a": 1}', None),
    ],
)
def test_guided_json_answers_are_checked_within_bounds(text: str, why: str | None) -> None:
    em = emulation.plan(ADAPTER, req(guided_json={"properties": {"a": {"type": "integer"}}}), "p", 2)
    assert em is not None and em.guide is not None
    assert em.guide.check(text) == why


def test_a_regex_check_beyond_the_match_bound_counts_as_invalid_without_running() -> None:
    # 18,000 RE2 instructions: 1 MB of text would take about 5 s in RE2's NFA.
    em = emulation.plan(ADAPTER, req(guided_regex="(a|b|c|d|e|f|g)*.{0,200}z" * 10), "p", 2)
    assert em is not None and em.guide is not None
    start = time.perf_counter()
    assert em.guide.check("ab" * 500_000) == "is too long to check against the regex within the gateway's bound"
    assert time.perf_counter() - start < 0.1


def test_one_work_budget_is_spent_by_every_check_of_a_request() -> None:
    em = emulation.plan(ADAPTER, req(guided_json={"type": "array", "items": {"type": "integer"}}), "p", 2)
    assert em is not None and em.guide is not None
    work = Work(1000)
    answer = json.dumps(list(range(300)))  # about 300 evaluations
    assert em.guide.check(answer, work) is None
    assert em.guide.check(answer, work) is None
    assert em.guide.check(answer, work) is None
    with pytest.raises(WorkExhausted, match="bound of 1000 evaluations"):
        em.guide.check(answer, work)


def test_a_regex_check_is_charged_to_the_requests_work() -> None:
    em = emulation.plan(ADAPTER, req(guided_regex="(a|b|c|d|e|f|g)*.{0,200}z" * 10), "p", 2)
    assert em is not None and em.guide is not None
    with pytest.raises(WorkExhausted):
        em.guide.check("ab" * 100_000, Work(1000))


def test_a_check_past_the_requests_deadline_gives_up() -> None:
    em = emulation.plan(ADAPTER, req(guided_json={"type": "array", "items": {"type": "integer"}}), "p", 2)
    assert em is not None and em.guide is not None
    with pytest.raises(WorkExhausted) as err:
        em.guide.check(json.dumps(list(range(300))), Work(100_000, deadline=time.monotonic() - 1))
    assert err.value.deadline


def test_an_abandoned_check_stops_alone() -> None:
    work = Work(1000)
    mine = work.share()
    assert mine.draw(10) == 10
    mine.stop()
    with pytest.raises(WorkExhausted, match="ended"):
        mine.draw(10)
    assert work.draw(10) == 10  # the request's other checks, and its later attempts, go on
    assert work.left == 980
