"""Chat's `echo` without a socket: which text leads the answer (vLLM's rule of roles), a stream's choices each
led once however their chunks interleave, the cache key, and no kind's chat body carrying the field."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any, Literal

import msgspec
import pytest

from gateway.cache.key import cache_key
from gateway.config import CapsConfig
from gateway.path.chat_request import normalize_chat
from gateway.path.echo import Lead, echoed, unechoed
from gateway.path.opened import Opened
from providers.base import CallContext, map_params
from providers.registry import REGISTRY
from wire.chat import ChatChunk, ChatRequest, ChunkChoice, Delta, decode_chat
from wire.errors import InvalidRequestError

USER = {"role": "user", "content": "hi"}


def _req(messages: list[Any], **fields: Any) -> ChatRequest:
    body = {"model": "x/m", "messages": messages, **fields}
    return normalize_chat(decode_chat(msgspec.json.encode(body)))


def test_the_echoed_text_follows_the_answers_role() -> None:
    prefill = [USER, {"role": "assistant", "content": "Sure: "}]
    assert echoed(_req(prefill, echo=True, continue_final_message=True)) == "Sure: "
    assert echoed(_req(prefill, echo=True)) == "Sure: "  # a new assistant turn after an assistant message
    assert echoed(_req([USER], echo=True)) == ""  # the answer's role is not the user's
    assert echoed(_req([USER], echo=True, add_generation_prompt=False)) == "hi"  # the user's turn goes on
    assert echoed(_req(prefill)) == "" and echoed(_req(prefill, echo=False)) == ""
    parts = [USER, {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert echoed(_req(parts, echo=True, continue_final_message=True)) == "a\nb"
    req = _req(prefill, echo=True, continue_final_message=True)
    assert unechoed(req, "Sure: yes") == "yes" and unechoed(req, "other") == "other"


def _chunk(*choices: tuple[int, Literal["assistant"] | None, str | None]) -> ChatChunk:
    return ChatChunk(
        "c", 1, "m", [ChunkChoice(i, Delta(role=role, content=text), None, None) for i, role, text in choices]
    )


def test_each_choice_of_a_stream_is_led_once() -> None:
    async def upstream() -> AsyncGenerator[ChatChunk, None]:
        yield _chunk((1, "assistant", ""))
        yield _chunk((0, None, "x"), (1, None, "y"))
        yield _chunk((0, None, "z"))
        yield ChatChunk("c", 1, "m", [])  # a usage chunk: no choice

    async def run() -> dict[int, str]:
        texts: dict[int, str] = {}
        chunks = upstream()
        opened = Opened(chunks, await anext(chunks), ctx=CallContext("c", 1, "m", chat=True))
        opened.rewrite(Lead("E: ").lead)
        assert isinstance(opened.first, ChatChunk)
        for c in [opened.first, *[c async for c in opened.chunks if isinstance(c, ChatChunk)]]:
            for ch in c.choices:
                texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
        return texts

    assert asyncio.run(run()) == {0: "E: xz", 1: "E: y"}


def test_echo_is_keyed_and_never_sent_upstream() -> None:
    prefill = [USER, {"role": "assistant", "content": "Sure: "}]
    on, off = _req(prefill, echo=True), _req(prefill, echo=False)
    assert cache_key(on, b"") != cache_key(off, b"") == cache_key(_req(prefill), b"")
    for kind, cls in REGISTRY.items():
        if cls.chat_params is not None:
            body = map_params(on, cls.chat_params, "p", False)[0]
            assert "echo" not in body and "echo_last" not in body, kind


def test_echo_copies_are_bounded_before_any_call() -> None:
    caps = CapsConfig(emulated_answer_bytes=4096)
    long = [USER, {"role": "assistant", "content": "x" * 1000}]

    def ask(**fields: Any) -> ChatRequest:
        body = {"model": "x/m", "messages": long, "echo": True, "continue_final_message": True, **fields}
        return normalize_chat(decode_chat(msgspec.json.encode(body)), caps)

    assert echoed(ask(n=4)) == "x" * 1000  # 4,000 bytes: within the bound
    with pytest.raises(InvalidRequestError) as refused:
        ask(n=5)
    assert refused.value.param == "echo" and "4096" in refused.value.message
    # Nothing is echoed after a user message: no copies, whatever its size.
    body = {"model": "x/m", "messages": [{"role": "user", "content": "y" * 10_000}], "echo": True, "n": 8}
    assert echoed(normalize_chat(decode_chat(msgspec.json.encode(body)), caps)) == ""
