"""Merging a provider's answers, whole and streamed, into the one the client asked for (gateway/emulation), with
an engine's token-native fields kept through it."""

from __future__ import annotations

import itertools
from collections.abc import AsyncGenerator
from typing import Any

import msgspec
import pytest

from gateway import emulation
from providers.base import CallContext
from tests.unit.emulation_setup import ADAPTER, OnePrompt, answer, req
from wire.errors import UpstreamError
from wire.schema import Choice, Completion, CompletionRequest, Usage

CTX = CallContext(id="cmpl-test", created=1, model="x/m")


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
