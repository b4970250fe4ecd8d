"""The built-in `fake` provider: deterministic text, max_tokens, stop, n, multiple prompts, echo, logprobs,
streaming equal to the non-stream answer, and the error-<status> behaviour."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config import CapsConfig
from providers.base import Endpoint
from providers.fake import FakeAdapter, _generate, _tokens
from tests.helpers.adapters import context, request
from wire.errors import InvalidRequestError, UpstreamStatusError
from wire.schema import Completion, CompletionRequest

ADAPTER = FakeAdapter()
PROMPT = "Say this is a test"


def endpoint(model: str = "text") -> Endpoint:
    return Endpoint(provider="demo", model=model, base_url="")


async def complete(req: CompletionRequest, model: str = "text") -> Completion:
    return await ADAPTER.complete(req, endpoint(model), context())


async def stream(req: CompletionRequest, model: str = "text") -> list[Completion]:
    return [c async for c in ADAPTER.stream(req, endpoint(model), context())]


def fake_request(**fields: Any) -> CompletionRequest:
    fields.setdefault("prompt", PROMPT)
    return request("demo/text", **fields)


async def test_golden_text_is_deterministic() -> None:
    first = await complete(fake_request(max_tokens=64, seed=1))
    again = await complete(fake_request(max_tokens=64, seed=1))
    assert first == again
    assert first.choices[0].text == " the every returns lighthouses wave where brown the"
    assert first.choices[0].finish_reason == "stop"
    assert first.usage is not None
    assert (first.usage.prompt_tokens, first.usage.completion_tokens, first.usage.total_tokens) == (5, 8, 13)
    assert (first.id, first.model, first.created) == ("cmpl-gateway-test-id", "client/model-string", 1_700_000_000)


async def test_seed_and_prompt_change_the_text() -> None:
    base = (await complete(fake_request(max_tokens=64, seed=1))).choices[0].text
    assert (await complete(fake_request(max_tokens=64, seed=2))).choices[0].text != base
    assert (await complete(fake_request(max_tokens=64, seed=1, prompt="Other"))).choices[0].text != base


async def test_max_tokens_gives_finish_length() -> None:
    out = await complete(fake_request(max_tokens=3))
    choice = out.choices[0]
    assert choice.finish_reason == "length"
    assert len(choice.text.split()) == 3
    assert out.usage is not None and out.usage.completion_tokens == 3


async def test_default_limit_is_sixteen_tokens() -> None:
    out = await complete(request("demo/long", PROMPT), model="long")
    assert out.choices[0].finish_reason == "length"
    assert len(out.choices[0].text.split()) == 16


async def test_long_runs_to_max_tokens() -> None:
    out = await complete(request("demo/long", PROMPT, max_tokens=60), model="long")
    assert out.choices[0].finish_reason == "length"
    assert len(out.choices[0].text.split()) == 60


async def test_echo_model_repeats_the_prompt() -> None:
    out = await complete(request("demo/echo", "one two three"), model="echo")
    assert out.choices[0].text == "one two three"
    assert out.choices[0].finish_reason == "stop"


GOLDEN = " the every returns lighthouses wave where brown the"


# Inside one word, across a word boundary (the cut reaches back into an earlier token), a whole word.
@pytest.mark.parametrize("stop", ["ver", "s wave wh", " brown"])
@pytest.mark.parametrize("include", [False, True])
async def test_stop_cuts_the_text(stop: str, include: bool) -> None:
    start = GOLDEN.index(stop)
    end = start + len(stop)
    out = await complete(fake_request(max_tokens=64, seed=1, stop=stop, include_stop_str_in_output=include, logprobs=0))
    choice = out.choices[0]
    assert choice.text == (GOLDEN[:end] if include else GOLDEN[:start])
    assert choice.finish_reason == "stop"
    assert choice.logprobs is not None
    assert "".join(choice.logprobs.tokens) == choice.text
    assert out.usage is not None and out.usage.completion_tokens == len(choice.logprobs.tokens)
    streamed = await stream(fake_request(max_tokens=64, seed=1, stop=stop, include_stop_str_in_output=include))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == choice.text


async def test_n_and_several_prompts_index_choices() -> None:
    out = await complete(fake_request(prompt=["first prompt", "second prompt"], n=2, max_tokens=5))
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    texts = [c.text for c in out.choices]
    assert len(set(texts)) == 4
    single = await complete(fake_request(prompt="second prompt", n=2, max_tokens=5))
    assert [c.text for c in single.choices] == texts[2:]
    assert out.usage is not None and out.usage.prompt_tokens == 4


async def test_echo_prepends_prompt_with_offsets_from_zero() -> None:
    out = await complete(fake_request(echo=True, logprobs=1, max_tokens=4))
    choice = out.choices[0]
    plain = (await complete(fake_request(max_tokens=4))).choices[0].text
    assert choice.text == PROMPT + plain
    assert choice.logprobs is not None
    assert choice.logprobs.tokens[:5] == ["Say", " this", " is", " a", " test"]
    assert choice.logprobs.token_logprobs[0] is None
    assert choice.logprobs.text_offset[:6] == [0, 3, 8, 11, 13, 18]
    assert "".join(choice.logprobs.tokens) == choice.text


@pytest.mark.parametrize("k", [0, 1, 3, 5])
async def test_logprobs_k_alternatives_and_offsets(k: int) -> None:
    out = await complete(fake_request(logprobs=k, max_tokens=10))
    lp = out.choices[0].logprobs
    assert lp is not None
    assert "".join(lp.tokens) == out.choices[0].text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == 10
    assert lp.text_offset[0] == len(PROMPT)
    for i in range(len(lp.tokens) - 1):
        assert lp.text_offset[i + 1] == lp.text_offset[i] + len(lp.tokens[i])
    if k == 0:
        assert lp.top_logprobs is None
        return
    assert lp.top_logprobs is not None
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert top is not None and len(top) == k
        assert top[token] == logprob
        assert logprob is not None and max(top.values()) == logprob


async def test_logprobs_up_to_twenty_through_top_logprobs() -> None:
    out = await complete(fake_request(logprobs=True, top_logprobs=20, max_tokens=2))
    lp = out.choices[0].logprobs
    assert lp is not None and lp.top_logprobs is not None
    assert [len(t or {}) for t in lp.top_logprobs] == [20, 20]


@pytest.mark.parametrize(
    "fields",
    [
        {"max_tokens": 12},
        {"max_tokens": 12, "logprobs": 2},
        {"max_tokens": 6, "echo": True, "logprobs": 1},
        {"prompt": ["a b", "c"], "n": 3, "max_tokens": 4},
    ],
)
async def test_stream_concatenates_to_the_non_stream_answer(fields: dict[str, Any]) -> None:
    whole = await complete(fake_request(**fields))
    chunks = await stream(fake_request(stream=True, **fields))
    *content, last = chunks
    assert last.choices == [] and last.usage == whole.usage
    for choice in whole.choices:
        mine = [c.choices[0] for c in content if c.choices[0].index == choice.index]
        assert "".join(c.text for c in mine) == choice.text
        assert [c.finish_reason for c in mine] == [None] * (len(mine) - 1) + [choice.finish_reason]
        if choice.logprobs is not None:
            assert [t for c in mine if c.logprobs for t in c.logprobs.tokens] == choice.logprobs.tokens
            assert [o for c in mine if c.logprobs for o in c.logprobs.text_offset] == choice.logprobs.text_offset
    assert all(c.usage is None for c in content)
    assert {c.id for c in chunks} == {"cmpl-gateway-test-id"}


async def test_error_429_carries_retry_after_one() -> None:
    with pytest.raises(UpstreamStatusError) as info:
        await complete(fake_request(), model="error-429")
    err = info.value
    assert (err.status, err.upstream_status, err.type, err.retry_after) == (429, 429, "rate_limit_error", 1.0)
    assert err.provider == "demo"
    assert err.message == "demo error (429): fake failure requested by model name"
    with pytest.raises(UpstreamStatusError):
        await stream(fake_request(stream=True), model="error-429")


async def test_error_500_maps_to_502_without_retry_hint() -> None:
    with pytest.raises(UpstreamStatusError) as info:
        await complete(fake_request(), model="error-500")
    assert (info.value.status, info.value.retry_after) == (502, None)


async def test_slow_and_drip_still_answer() -> None:
    slow = await complete(fake_request(max_tokens=3), model="slow-1ms")
    drip = await stream(fake_request(max_tokens=3, stream=True), model="drip-1ms")
    assert "".join(c.choices[0].text for c in drip if c.choices) == slow.choices[0].text


# -- work bounds (issue 11, item 14) -------------------------------------------------------------


def _reference_cut(words: list[str], stops: list[str], include: bool) -> tuple[str, list[str]]:
    """The stop cut as it was (text rebuilt word by word: quadratic), the behaviour to keep."""
    text, tokens = "", list[str]()
    for word in words:
        candidate = text + word
        hit = min(((candidate.find(s), s) for s in stops if s and candidate.find(s) >= 0), default=None)
        if hit is not None:
            pos, s = hit
            cut = pos + (len(s) if include else 0)
            while tokens and len(text) - len(tokens[-1]) >= cut:
                text = text[: len(text) - len(tokens.pop())]
            if len(text) > cut:
                tokens[-1] = tokens[-1][: len(tokens[-1]) - (len(text) - cut)]
            piece = candidate[len(text) : cut] if cut > len(text) else ""
            if piece:
                tokens.append(piece)
            return candidate[:cut], tokens
        text = candidate
        tokens.append(word)
    return text, tokens


@settings(max_examples=300, deadline=None)
@given(
    prompt=st.lists(st.sampled_from(["a", "b", "ab", "ba", "  ", " a", "b "]), min_size=1, max_size=10).map("".join),
    stops=st.lists(st.text(alphabet="ab ", min_size=1, max_size=4), min_size=1, max_size=4),
    include=st.booleans(),
)
def test_the_linear_stop_cut_is_the_word_by_word_one(prompt: str, stops: list[str], include: bool) -> None:
    req = fake_request(prompt=prompt, max_tokens=50, stop=stops, include_stop_str_in_output=include)
    words = _tokens(prompt)
    g = _generate(prompt, words, 0, req, "echo")
    assert (g.text, g.tokens) == _reference_cut(words[:50], stops, include)
    assert len(g.logprobs) == len(g.tokens)


@given(st.text(alphabet=" \t\nab", max_size=40))
def test_tokens_are_what_the_backtracking_findall_gave(text: str) -> None:
    assert _tokens(text) == re.findall(r"\s*\S+", text)


def test_long_is_linear_in_max_tokens() -> None:
    start = time.perf_counter()
    g = _generate("go", [], 0, fake_request(max_tokens=200_000, stop=["never there"]), "long")
    assert (len(g.tokens), g.finish) == (200_000, "length")
    assert time.perf_counter() - start < 2.0


CAPS = CapsConfig(fake_max_tokens=100, emulated_answer_bytes=64 * 1024)


@pytest.mark.parametrize(
    ("model", "fields", "param"),
    [
        ("long", {"max_tokens": 101}, "max_tokens"),
        ("echo", {"prompt": "x" * 40_000, "n": 2}, "n"),
        ("text", {"prompt": "x" * 40_000, "echo": True, "n": 2}, "n"),
        ("echo", {"prompt": "x" * 40_000, "logprobs": 1}, "logprobs"),
        ("echo", {"prompt": "x" * 40_000, "echo": True}, "echo"),
    ],
)
def test_admit_refuses_work_beyond_the_caps(model: str, fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        ADAPTER.admit(fake_request(**fields), endpoint(model), CAPS)
    assert (err.value.status, err.value.param) == (400, param)


@pytest.mark.parametrize(
    ("model", "fields"),
    [
        ("long", {"max_tokens": 100}),
        ("text", {"prompt": "x" * 40_000, "n": 2, "max_tokens": 100}),
        ("echo", {"prompt": "x" * 30_000}),
    ],
)
def test_admit_lets_work_within_the_caps_through(model: str, fields: dict[str, Any]) -> None:
    ADAPTER.admit(fake_request(**fields), endpoint(model), CAPS)
