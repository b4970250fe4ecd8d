"""providers/thinking.py: a streamed block is listed whole or not at all, and what an upstream sends cannot grow
what a call keeps past one block of BLOCK_CHARS."""

from __future__ import annotations

import msgspec

from providers import thinking
from providers.base import CallContext
from wire.chat import decode_chat
from wire.messages import AssistantMessage


def _ctx() -> CallContext:
    return CallContext(id="chatcmpl-t", created=1, model="m", chat=True)


def _blocks(ctx: CallContext, block: int) -> list[object] | None:
    out = thinking.ended(ctx, block)
    return None if out is None else msgspec.to_builtins(out)


def test_a_block_is_listed_whole_once_with_its_signature() -> None:
    ctx = _ctx()
    for text in ("Let ", "me ", "think."):
        thinking.piece(ctx, 0, text)
    thinking.signature(ctx, 0, "Eq8C")
    assert _blocks(ctx, 0) == [{"type": "thinking", "thinking": "Let me think.", "signature": "Eq8C"}]
    assert _blocks(ctx, 0) is None  # ended: not listed twice
    thinking.piece(ctx, 0, "late")  # a piece after its end starts nothing
    assert _blocks(ctx, 0) is None


def test_an_unsigned_block_and_an_interleaved_one_are_not_listed() -> None:
    ctx = _ctx()
    thinking.piece(ctx, 0, "no signature comes")
    assert _blocks(ctx, 0) is None
    # Block 2 starts while block 1 is kept: block 1 can no longer be listed whole, nor started again.
    thinking.piece(ctx, 1, "one")
    thinking.piece(ctx, 2, "two")
    thinking.piece(ctx, 1, " more")
    thinking.signature(ctx, 1, "s1")
    thinking.signature(ctx, 2, "s2")
    assert _blocks(ctx, 1) is None
    assert _blocks(ctx, 2) == [{"type": "thinking", "thinking": "two", "signature": "s2"}]


def test_a_block_past_the_cap_streams_unlisted_and_frees_what_it_held() -> None:
    ctx = _ctx()
    piece = "x" * 65536
    for _ in range(thinking.BLOCK_CHARS // len(piece) + 1):
        thinking.piece(ctx, 0, piece)
    kept = ctx.state["thinking_block"]
    assert kept.text is None and kept.signature == []
    thinking.signature(ctx, 0, "sig")
    assert _blocks(ctx, 0) is None
    thinking.piece(ctx, 1, "next block")  # the next block is kept again
    thinking.signature(ctx, 1, "sig")
    assert _blocks(ctx, 1) == [{"type": "thinking", "thinking": "next block", "signature": "sig"}]


def test_what_goes_back_to_an_openai_wire_server() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": "a",
                "reasoning_content": "why",
                "thinking_blocks": [{"type": "thinking", "thinking": "why", "signature": "s"}],
            },
            {"role": "assistant", "content": "b"},
        ],
    }
    messages = decode_chat(msgspec.json.encode(body)).messages
    assert msgspec.to_builtins(thinking.sent_messages(messages, None))[1] == {"role": "assistant", "content": "a"}
    assert msgspec.to_builtins(thinking.sent_messages(messages, "reasoning_content"))[1] == {
        "role": "assistant",
        "content": "a",
        "reasoning_content": "why",
    }
    assert msgspec.to_builtins(thinking.sent_messages(messages, "reasoning"))[1] == {
        "role": "assistant",
        "content": "a",
        "reasoning": "why",
    }
    plain = messages[:1] + messages[2:]
    assert thinking.sent_messages(plain, None) is plain  # nothing to leave out: the list itself
    assert isinstance(messages[1], AssistantMessage) and messages[1].thinking_blocks is not None  # not changed


def test_what_goes_back_to_mistral_as_content_chunks() -> None:
    think = {"type": "thinking", "thinking": [{"type": "text", "text": "why"}]}
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "reasoning_content": "why"},
            # A turn that called tools: no text, the thinking alone.
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "why",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "{}"},
            {"role": "assistant", "content": [{"type": "text", "text": "p"}], "reasoning_content": "why"},
            # Another provider's signed blocks and no reasoning_content: the blocks are left out, nothing added.
            {
                "role": "assistant",
                "content": "b",
                "thinking_blocks": [{"type": "thinking", "thinking": "x", "signature": "s"}],
            },
            {"role": "assistant", "content": "", "reasoning_content": "why"},
        ],
    }
    messages = decode_chat(msgspec.json.encode(body)).messages
    sent = msgspec.to_builtins(thinking.chunked_messages(messages))
    assert sent[1] == {"role": "assistant", "content": [think, {"type": "text", "text": "a"}]}
    assert sent[2]["content"] == [think] and sent[2]["tool_calls"][0]["id"] == "c1"
    assert sent[4] == {"role": "assistant", "content": [think, {"type": "text", "text": "p"}]}
    assert sent[5] == {"role": "assistant", "content": "b"}
    assert sent[6] == {"role": "assistant", "content": [think]}
    plain = messages[:1]
    assert thinking.chunked_messages(plain) is plain
