"""The gateway's own implementations of what a provider lacks (gateway/emulation/planning.py)."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import AsyncGenerator
from typing import Any, ClassVar

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import emulation
from gateway.config import CapsConfig
from gateway.emulation.client_schema import Work, WorkExhausted
from gateway.path.request import normalize
from providers.base import EMULATED, Adapter, CallContext, Param, Table, UpstreamRequest, table
from wire.errors import InvalidRequestError, UpstreamError
from wire.schema import Choice, Completion, CompletionRequest, Logprobs, Usage, decode_request

CTX = CallContext(id="cmpl-test", created=1, model="x/m")


def req(**fields: Any) -> CompletionRequest:
    body = {"model": "x/m", "prompt": "p", **fields}
    return normalize(decode_request(msgspec.json.encode(body)))


class OnePrompt(Adapter):
    """A provider shaped like the chat-style ones: one text prompt, no n, no echo, guided emulated."""

    kind = "one-prompt"
    max_stop = 2
    prompt_forms = frozenset({"text"})
    params: ClassVar[Table] = table(
        max_tokens=Param(),
        stop=Param(),
        logprobs=Param(),
        n=EMULATED,
        best_of=EMULATED,
        echo=EMULATED,
        include_stop_str_in_output=EMULATED,
        guided_json=EMULATED,
        guided_regex=EMULATED,
        guided_choice=EMULATED,
        guided_grammar=EMULATED,
    )

    def build_request(self, req: CompletionRequest, endpoint: Any, body: dict[str, Any]) -> UpstreamRequest:
        raise AssertionError("pure planning tests never build requests")

    def parse_response(self, body: bytes, ctx: CallContext) -> Completion:
        raise AssertionError

    def parse_event(self, event: str | None, data: bytes, ctx: CallContext) -> Completion | None:
        raise AssertionError

    def map_error(self, status: int, headers: Any, body: bytes, provider: str) -> Any:
        raise AssertionError


ADAPTER = OnePrompt()


def answer(text: str, lps: list[float] | None = None, finish: str = "stop") -> Completion:
    logprobs = None
    if lps is not None:
        tokens = [text[i : i + 1] for i in range(len(lps))]
        logprobs = Logprobs(
            tokens=tokens, token_logprobs=list(lps), top_logprobs=None, text_offset=list(range(len(lps)))
        )
    return Completion(
        id="up",
        created=1,
        model="x/m",
        choices=[Choice(text, 0, logprobs, finish)],  # type: ignore[arg-type]
        usage=Usage(prompt_tokens=2, completion_tokens=3, total_tokens=5),
    )


# -- stop scanning -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pieces", "stops", "include", "sent", "stopped"),
    [
        # Only the characters that could still begin a stop are held back.
        (["Hello wor", "ld! END", " tail"], ["END"], False, ["Hello wor", "ld! "], True),
        (["ab", "cE", "N", "D"], ["END"], True, ["ab", "c", "", "END"], True),
        (["xE", "Nope"], ["END"], False, ["x", "ENope"], False),
        (["aaXY", "Zb"], ["XYZ", "YZQ"], False, ["aa", ""], True),
    ],
)
def test_stop_scanner_holds_back_only_possible_starts(
    pieces: list[str], stops: list[str], include: bool, sent: list[str], stopped: bool
) -> None:
    scanner = emulation.StopScanner(stops, include)
    out: list[str] = []
    hit = False
    for piece in pieces:
        text, hit = scanner.feed(piece)
        out.append(text)
        if hit:
            break
    assert out == sent
    assert hit is stopped


def test_find_stop_takes_the_earliest() -> None:
    assert emulation.find_stop("one two three", ["three", "two"]) == (4, "two")
    assert emulation.find_stop("nothing", ["x"]) is None


# -- planning ------------------------------------------------------------------------------------


def test_nothing_to_emulate_is_none() -> None:
    assert emulation.plan(ADAPTER, req(max_tokens=3), "p", 2) is None


def test_plan_fans_out_prompts_and_n() -> None:
    em = emulation.plan(ADAPTER, req(prompt=["a", "b"], n=3), "p", 2)
    assert em is not None
    assert (em.prompts, em.fan_n, em.n) == (["a", "b"], 3, 3)
    subs = emulation.sub_requests(em, req(prompt=["a", "b"], n=3))
    assert [(s.prompt, s.n) for s in subs] == [("a", None)] * 3 + [("b", None)] * 3


def test_plan_enforces_stops_beyond_the_providers_count() -> None:
    em = emulation.plan(ADAPTER, req(stop=["a", "b", "c"]), "p", 2)
    assert em is not None
    assert (em.stops, em.upstream_stop) == (["a", "b", "c"], ["a", "b"])


def test_plan_keeps_stop_strings_itself_when_the_provider_would_strip_them() -> None:
    em = emulation.plan(ADAPTER, req(stop=["END"], include_stop_str_in_output=True), "p", 2)
    assert em is not None
    assert (em.stops, em.upstream_stop, em.include_stop) == (["END"], None, True)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"echo": True, "logprobs": 1}, "echo"),
        ({"guided_grammar": "root ::= 'a'"}, "guided_grammar"),
        ({"guided_regex": "("}, "guided_regex"),
    ],
)
def test_plan_refuses_what_cannot_be_emulated(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        emulation.plan(ADAPTER, req(**fields), "p", 2)
    assert err.value.param == param


def test_best_of_needs_logprobs_to_rank() -> None:
    class NoLogprobs(OnePrompt):
        params: ClassVar[Table] = table(OnePrompt.params, drop=("logprobs",))

    with pytest.raises(InvalidRequestError) as err:
        emulation.plan(NoLogprobs(), req(best_of=3), "p", 2)
    assert (err.value.param, err.value.message) == (
        "best_of",
        "'best_of' cannot be emulated for provider 'p': it returns no logprobs",
    )


# -- non-stream merging --------------------------------------------------------------------------


async def test_fan_out_indexes_and_usage() -> None:
    r = req(prompt=["a", "b"], n=2)
    em = emulation.plan(ADAPTER, r, "p", 2)
    assert em is not None
    seen: list[str] = []

    async def call(sub: CompletionRequest) -> Completion:
        assert isinstance(sub.prompt, str)
        seen.append(sub.prompt)
        return answer(f"{sub.prompt}{seen.count(sub.prompt)}")

    c = await emulation.complete(em, r, CTX, call)
    assert [(ch.index, ch.text) for ch in c.choices] == [(0, "a1"), (1, "a2"), (2, "b1"), (3, "b2")]
    assert c.usage == Usage(prompt_tokens=8, completion_tokens=12, total_tokens=20)
    assert (c.id, c.model) == ("cmpl-test", "x/m")


async def test_best_of_keeps_the_highest_mean_logprob_and_hides_logprobs_not_asked_for() -> None:
    r = req(best_of=3, n=1)
    em = emulation.plan(ADAPTER, r, "p", 2)
    assert em is not None
    replies = iter([answer("low", [-3.0, -3.0]), answer("best", [-0.1, -0.2]), answer("mid", [-1.0, -1.0])])

    async def call(sub: CompletionRequest) -> Completion:
        assert sub.logprobs == 0 and sub.best_of is None  # asked for the logprobs it ranks by
        return next(replies)

    c = await emulation.complete(em, r, CTX, call)
    assert [(ch.index, ch.text, ch.logprobs) for ch in c.choices] == [(0, "best", None)]


async def test_echo_and_stop_enforced_on_the_answer() -> None:
    r = req(prompt="Q: ", echo=True, stop=["x", "y", "END"])
    em = emulation.plan(ADAPTER, r, "p", 2)
    assert em is not None

    async def call(sub: CompletionRequest) -> Completion:
        assert sub.stop == ["x", "y"] and sub.echo is None
        return answer("fine END more", finish="length")

    c = await emulation.complete(em, r, CTX, call)
    assert [(ch.text, ch.finish_reason) for ch in c.choices] == [("Q: fine ", "stop")]


@pytest.mark.parametrize(
    ("fields", "replies", "calls"),
    [
        ({"guided_json": {"type": "object", "required": ["a"]}}, ['{"b": 1}', '{"a": 2}'], 2),
        ({"guided_regex": "[0-9]+"}, ["12a", "34"], 2),
        ({"guided_choice": ["yes", "no"]}, [" yes "], 1),
    ],
)
async def test_guided_output_is_validated_and_retried(fields: dict[str, Any], replies: list[str], calls: int) -> None:
    r = req(**fields)
    em = emulation.plan(ADAPTER, r, "p", 2)
    assert em is not None
    it = iter(replies)
    made = 0

    async def call(sub: CompletionRequest) -> Completion:
        nonlocal made
        made += 1
        assert sub.guided_json is None and sub.guided_regex is None and sub.guided_choice is None
        return answer(next(it))

    c = await emulation.complete(em, r, CTX, call)
    assert c.choices[0].text == replies[-1]
    assert made == calls


async def test_guided_output_never_valid_is_a_502_not_an_answer() -> None:
    r = req(guided_json={"type": "array"})
    em = emulation.plan(ADAPTER, r, "p", 1)
    assert em is not None
    made = 0

    async def call(sub: CompletionRequest) -> Completion:
        nonlocal made
        made += 1
        return answer("not json")

    with pytest.raises(UpstreamError) as err:
        await emulation.complete(em, r, CTX, call)
    assert (made, err.value.status, err.value.code, err.value.param) == (2, 502, "guided_output_invalid", "guided_json")
    assert err.value.retryable is False


# -- stream merging ------------------------------------------------------------------------------


class FakeOpened:
    """The shape of pipeline.Opened that emulation.stream reads: first chunk and the rest."""

    def __init__(self, texts: list[str], finish: str = "length") -> None:
        chunks = [
            Completion(
                id="u",
                created=1,
                model="x/m",
                choices=[Choice(t, 0, None, finish if i == len(texts) - 1 else None)],  # type: ignore[arg-type]
            )
            for i, t in enumerate(texts)
        ]
        chunks[-1].usage = Usage(prompt_tokens=1, completion_tokens=len(texts), total_tokens=1 + len(texts))
        self.first: Completion | None = chunks[0]
        self.chunks = self._rest(chunks[1:])

    @staticmethod
    async def _rest(chunks: list[Completion]) -> AsyncGenerator[Completion, None]:
        for c in chunks:
            yield c


async def test_stream_merge_reindexes_and_sums_usage() -> None:
    r = req(prompt="p", n=2, stream=True)
    em = emulation.plan(ADAPTER, r, "p", 2)
    assert em is not None
    out = [c async for c in emulation.stream(em, r, CTX, [FakeOpened(["a", "b"]), FakeOpened(["c"])])]
    texts = sorted((ch.index, ch.text, ch.finish_reason) for c in out for ch in c.choices)
    assert texts == [(0, "a", None), (0, "b", "length"), (1, "c", "length")]
    assert out[-1].choices == [] and out[-1].usage == Usage(prompt_tokens=2, completion_tokens=3, total_tokens=5)


async def test_stream_stop_holds_back_and_ends_the_choice() -> None:
    r = req(prompt="p", stop=["EN", "x", "y"], stream=True, include_stop_str_in_output=False)
    em = emulation.plan(ADAPTER, r, "p", 2)
    assert em is not None
    out = [c async for c in emulation.stream(em, r, CTX, [FakeOpened(["one E", "Nd", " never"])])]
    content = [(ch.text, ch.finish_reason) for c in out for ch in c.choices]
    assert "".join(t for t, _ in content) == "one "
    assert content[-1][1] == "stop"


async def test_a_provider_that_keeps_the_stop_string_has_it_cut() -> None:
    class KeepsStop(OnePrompt):
        stop_in_output = True

    r = req(stop=["test"])
    em = emulation.plan(KeepsStop(), r, "p", 2)
    assert em is not None
    assert (em.stops, em.upstream_stop, em.include_stop) == (["test"], ["test"], False)

    async def call(sub: CompletionRequest) -> Completion:
        assert sub.stop == ["test"]  # still sent, so the provider stops early
        return answer("this is a test")

    c = await emulation.complete(em, r, CTX, call)
    assert [(ch.text, ch.finish_reason) for ch in c.choices] == [("this is a ", "stop")]
    # Asked to keep it: still sent upstream (to end early), and the gateway's cut keeps the string.
    kept = emulation.plan(KeepsStop(), req(stop=["test"], include_stop_str_in_output=True), "p", 2)
    assert kept is not None
    assert (kept.stops, kept.upstream_stop, kept.include_stop) == (["test"], ["test"], True)


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
        ({"guided_choice": ["x" * 40_000, "y" * 40_000]}, "guided_choice"),
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


# -- an engine's token-native fields through emulation -------------------------------------------


def _native(c: Completion, ids: list[int]) -> Completion:
    c.choices = [msgspec.structs.replace(ch, token_ids=ids, prompt_token_ids=[1, 2], stop_reason=7) for ch in c.choices]
    return c


async def test_fan_out_keeps_each_choices_token_ids_and_stop_reason() -> None:
    r = req(n=2)
    em = emulation.plan(ADAPTER, r, "p", 2)
    assert em is not None
    made = itertools.count(10)

    async def call(sub: CompletionRequest) -> Completion:
        return _native(answer("t"), [next(made)])

    c = await emulation.complete(em, r, CTX, call)
    assert [(ch.index, ch.token_ids, ch.prompt_token_ids, ch.stop_reason) for ch in c.choices] == [
        (0, [10], [1, 2], 7),
        (1, [11], [1, 2], 7),
    ]


async def test_stream_merge_keeps_token_ids_unless_the_gateway_cut_the_chunk() -> None:
    r = req(prompt="p", n=2, stream=True, stop=["EN", "x", "y"])
    em = emulation.plan(ADAPTER, r, "p", 2)
    assert em is not None
    opened = [FakeOpened(["ab"]), FakeOpened(["cd EN"])]
    for o in opened:
        assert o.first is not None
        _native(o.first, [5])
    out = [c async for c in emulation.stream(em, r, CTX, opened)]
    got = sorted((ch.index, ch.text, ch.token_ids, ch.stop_reason) for c in out for ch in c.choices)
    assert got == [(0, "ab", [5], 7), (1, "cd ", None, None)]
