"""Chat emulation (gateway/emulation/chat.py): what is planned for which kind, and how answers and streams
are folded: choices re-indexed, stops cut across chunk borders, usage summed, bounds refused by name."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from gateway.config import CapsConfig
from gateway.emulation import chat as emulation
from gateway.path.chat_request import normalize_chat
from providers.registry import REGISTRY
from wire.chat import (
    ChatChoice,
    ChatChunk,
    ChatCompletion,
    ChatLogprobs,
    ChatMessage,
    ChatRequest,
    ChunkChoice,
    Delta,
    FunctionDelta,
    TokenLogprob,
    ToolCallDelta,
    decode_chat,
)
from wire.errors import InvalidRequestError
from wire.schema import Usage

CAPS = CapsConfig()


def _req(**fields: Any) -> ChatRequest:
    body = {"model": "x/m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return normalize_chat(decode_chat(msgspec.json.encode(body)))


def _plan(kind: str, **fields: Any) -> emulation.ChatEmulation | None:
    cls = REGISTRY[kind]
    assert cls.chat_params is not None
    return emulation.plan(cls(), cls.chat_params, _req(**fields), "p", CAPS)


def test_what_is_planned_per_kind() -> None:
    assert _plan("anthropic") is None
    assert _plan("openai", n=3, stop=["a", "b"]) is None  # OpenAI takes both
    em = _plan("anthropic", n=3)
    assert em is not None and (em.fan_n, em.n, em.stops) == (3, 3, None)
    stops = ["a", "b", "c", "d", "e"]
    em = _plan("openai", n=2, stop=stops)
    assert em is not None and (em.fan_n, em.stops, em.upstream_stop) == (1, stops, stops[:4])
    em = _plan("tgi", n=2, stop=stops)
    assert em is not None and (em.fan_n, em.upstream_stop) == (2, stops[:4])
    subs = emulation.sub_requests(em, _req(n=2, stop=stops))
    assert [(s.n, s.stop) for s in subs] == [(None, stops[:4])] * 2
    # Bedrock fans `n` out and, keeping the stop it matched, is sent every stop for the gateway to cut.
    em = _plan("bedrock", n=2, stop=stops)
    assert em is not None and (em.fan_n, em.stops, em.upstream_stop) == (2, stops, stops)
    em = _plan("bedrock", stop=["a"])
    assert em is not None and (em.fan_n, em.stops, em.upstream_stop) == (1, ["a"], ["a"])
    assert _plan("cohere", stop=stops) is None  # Cohere takes five
    em = _plan("cohere", n=2, stop=[*stops, "f"])
    assert em is not None and (em.fan_n, em.upstream_stop) == (2, stops)
    em = _plan("gemini", n=2, stop=[*stops, "f"])
    assert em is not None and (em.fan_n, em.upstream_stop) == (1, stops)  # `candidateCount` is Gemini's


def test_bounds_are_refused_naming_the_field() -> None:
    with pytest.raises(InvalidRequestError) as stop:
        _plan("openai", stop=["x" * 2000] * 5)  # 10,000 characters to scan for, over caps.stop_chars
    assert stop.value.param == "stop"
    big = "y" * (CAPS.emulated_answer_bytes // 2)
    with pytest.raises(InvalidRequestError) as n:
        _plan("anthropic", n=3, messages=[{"role": "user", "content": big}])
    assert n.value.param == "n"
    # An image is copied into every call too, though the rendered conversation holds only its place.
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + big}}
    with pytest.raises(InvalidRequestError) as n:
        _plan("anthropic", n=3, messages=[{"role": "user", "content": [{"type": "text", "text": "what?"}, image]}])
    assert n.value.param == "n"
    assert _plan("anthropic", n=1, messages=[{"role": "user", "content": [image]}]) is None


def _answer(content: str, usage: int, logprobs: list[str] | None = None) -> ChatCompletion:
    lp = None
    if logprobs is not None:
        lp = ChatLogprobs(content=[TokenLogprob(t, -0.5, None, []) for t in logprobs])
    choice = ChatChoice(0, ChatMessage(role="assistant", content=content), "length", lp)
    return ChatCompletion("chatcmpl-x", 7, "x/m", [choice], usage=Usage(usage, usage, 2 * usage))


async def test_buffered_choices_are_reindexed_cut_and_summed() -> None:
    req = _req(n=2, stop=["a", "b", "c", "d", "STOP"])
    em = _plan("tgi", n=2, stop=["a", "b", "c", "d", "STOP"])
    assert em is not None
    answers = iter([_answer("Hi there STOP more", 3, ["Hi", " there", " ST", "OP more"]), _answer("xyz", 4)])

    firsts: list[int] = []

    async def call(sub: ChatRequest, *, first: int = 0) -> ChatCompletion:
        assert sub.n is None and sub.stop == ["a", "b", "c", "d"]
        firsts.append(first)  # each call told which choice of the answer it makes (its tool call ids carry it)
        return next(answers)

    got = await emulation.complete(em, req, call)
    assert firsts == [0, 1]
    assert [(c.index, c.message.content, c.finish_reason) for c in got.choices] == [
        (0, "Hi there ", "stop"),
        (1, "xyz", "length"),
    ]
    lp = got.choices[0].logprobs
    assert lp is not None and lp.content is not None
    assert [t.token for t in lp.content] == ["Hi", " there", " "]  # the logprobs of the text kept
    assert got.usage == Usage(7, 7, 14)


class _Sub:
    def __init__(self, chunks: list[ChatChunk]) -> None:
        self.first: ChatChunk | None = chunks[0]
        self.rest = chunks[1:]
        self.chunks: AsyncIterator[ChatChunk] = self._gen()

    async def _gen(self) -> AsyncIterator[ChatChunk]:
        for c in self.rest:
            yield c


def _chunk(delta: Delta, finish: Any = None, usage: Usage | None = None) -> ChatChunk:
    choices = [] if usage is not None else [ChunkChoice(0, delta, finish, None)]
    return ChatChunk("chatcmpl-x", 7, "x/m", choices, usage=usage)


async def test_streams_are_merged_and_cut_at_a_stop_across_chunks() -> None:
    em = _plan("tgi", n=2, stop=["a1", "b1", "c1", "d1", "END"])
    assert em is not None
    call = ToolCallDelta(index=0, id="call_1", type="function", function=FunctionDelta(name="f", arguments="{}"))
    one = [
        _chunk(Delta(role="assistant", content="")),
        _chunk(Delta(content="Paris E")),
        _chunk(Delta(content="ND then")),
        _chunk(Delta(tool_calls=[call])),
        _chunk(Delta(), "tool_calls"),
        _chunk(Delta(), usage=Usage(5, 4, 9)),
    ]
    two = [
        _chunk(Delta(role="assistant", content="")),
        _chunk(Delta(content="Lyon E")),
        _chunk(Delta(content="ve")),
        _chunk(Delta(), "stop"),
        _chunk(Delta(), usage=Usage(5, 3, 8)),
    ]
    out = [c async for c in emulation.stream(em, [_Sub(one), _Sub(two)])]
    per: dict[int, list[ChunkChoice]] = {}
    for c in out:
        for ch in c.choices:
            per.setdefault(ch.index, []).append(ch)
    text = {i: "".join(ch.delta.content or "" for ch in chs) for i, chs in per.items()}
    assert text == {0: "Paris ", 1: "Lyon Eve"}
    # Choice 0 stopped inside its text: it ends there, its tool call never made.
    assert [ch.finish_reason for ch in per[0] if ch.finish_reason] == ["stop"]
    assert not any(ch.delta.tool_calls for ch in per[0])
    assert [ch.delta.role for ch in per[1]][0] == "assistant"
    # The streams were closed once both choices had ended, before every call's usage came: none is
    # reported (the relay estimates), rather than a part of it.
    assert all(c.usage is None for c in out)


async def test_fanned_out_streams_sum_their_usage() -> None:
    em = _plan("anthropic", n=2)
    assert em is not None
    subs = [
        _Sub([_chunk(Delta(role="assistant", content="a")), _chunk(Delta(), "stop"), _chunk(Delta(), usage=u)])
        for u in (Usage(5, 4, 9), Usage(5, 3, 8))
    ]
    out = [c async for c in emulation.stream(em, subs)]
    assert sorted(ch.index for c in out for ch in c.choices if ch.finish_reason) == [0, 1]
    assert [c.usage for c in out if c.usage is not None] == [Usage(10, 7, 17)]
    assert out[-1].choices == [] and out[-1].usage is not None


async def test_token_ids_stay_with_the_text_they_describe() -> None:
    """Each chunk's `token_ids` are relayed while its text is, dropped from a chunk a stop cut (they describe
    text the client does not get); the prompt's ids, the same for every fanned-out call, are relayed once."""
    em = _plan("tgi", n=2, stop=["a1", "b1", "c1", "d1", "END"])
    assert em is not None

    def sub(*texts: str) -> _Sub:
        first = _chunk(Delta(role="assistant", content=""))
        first.prompt_token_ids = [1, 2]
        chunks = [first]
        for k, text in enumerate(texts):
            c = _chunk(Delta(content=text))
            c.choices[0].token_ids = [10 * (k + 1)]
            chunks.append(c)
        chunks.append(_chunk(Delta(), "stop"))
        return _Sub(chunks)

    out = [c async for c in emulation.stream(em, [sub("Paris", " then END x"), sub("Lyon", " Eve")])]
    assert [c.prompt_token_ids for c in out if c.prompt_token_ids is not None] == [[1, 2]]
    per: dict[int, list[ChunkChoice]] = {}
    for c in out:
        for ch in c.choices:
            per.setdefault(ch.index, []).append(ch)
    assert [i for ch in per[1] for i in ch.token_ids or ()] == [10, 20]  # nothing cut: every id
    assert [i for ch in per[0] for i in ch.token_ids or ()] == [10]  # the cut chunk's ids are not its text's
    assert "".join(ch.delta.content or "" for ch in per[0]) == "Paris then "
