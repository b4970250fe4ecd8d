"""A model's thinking that comes back in a client's later turn, and the signed blocks of it (Anthropic's
`thinking` and `redacted_thinking` blocks, and Claude's on Bedrock) as the chat answer's `thinking_blocks`.

An assistant message's `reasoning_content` reaches the OpenAI-wire servers that read it, under their name
for it (`sent_messages`), or Mistral's as a `thinking` chunk at the head of the turn's content
(`chunked_messages`), and no other: strict servers refuse a message field they do not know. A signed
block's provider checks its signature when it comes back, and wants the blocks of a turn that called tools
before its `tool_use` blocks while thinking is on: a client that appends the answer's message object sends
them back unchanged. A stream sends each block whole in a chunk of its own when the block ends (its text
came before as `reasoning_content` pieces, kept per block up to `BLOCK_CHARS`).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from providers.base import CallContext
from wire.messages import AssistantMessage, Message, RedactedThinkingBlock, ThinkingBlock, ThinkingBlocks

# A streamed block's text and signature kept until the block ends: at most this many characters together
# (about four times the longest thinking any model produces); a longer block streams its text, unlisted.
BLOCK_CHARS: Final = 2 * 1024 * 1024
_KEY: Final = "thinking_block"


class _Kept:
    """The streamed block kept now: its index, and its text and signature so far (None once past BLOCK_CHARS
    or ended). One per call: the providers stream blocks one after another, at rising indexes."""

    __slots__ = ("chars", "index", "signature", "text")

    def __init__(self, index: int | None) -> None:
        self.index = index
        self.text: list[str] | None = []
        self.chars = 0
        self.signature: list[str] = []


def returned(m: AssistantMessage) -> ThinkingBlocks:
    """The blocks a client sent back that the provider can check: signed thinking and redacted thinking. A
    block without a signature (another provider's, or edited) would be refused by the provider: left out."""
    return [b for b in m.thinking_blocks or () if isinstance(b, RedactedThinkingBlock) or b.signature]


def _kept(ctx: CallContext, block: int | None) -> _Kept | None:
    """Block `block`'s keeping: a new one for a block past the one kept now; None for a block before it (its
    start was not kept, so it cannot be listed whole), or one that ended."""
    kept: _Kept | None = ctx.state.get(_KEY)
    if kept is not None and kept.index == block:
        return kept if kept.text is not None else None
    if kept is None or (block is not None and (kept.index is None or block > kept.index)):
        kept = ctx.state[_KEY] = _Kept(block)
        return kept
    return None


def piece(ctx: CallContext, block: int | None, text: str) -> None:
    """A streamed piece of block `block`'s thinking, kept for the block's signed whole."""
    _keep(_kept(ctx, block), text, False)


def signature(ctx: CallContext, block: int | None, text: str) -> None:
    """A streamed piece of block `block`'s signature (one piece, in every recorded stream)."""
    _keep(_kept(ctx, block), text, True)


def _keep(kept: _Kept | None, text: str, signed: bool) -> None:
    if kept is None or kept.text is None:
        return
    kept.chars += len(text)
    if kept.chars > BLOCK_CHARS:  # too long to keep (its text still streams): text and signature both count
        kept.text, kept.signature = None, []
    else:
        (kept.signature if signed else kept.text).append(text)


def ended(ctx: CallContext, block: int | None) -> ThinkingBlocks | None:
    """Block `block` whole, signed, when it ends; None for a block that was not signed thinking, or whose text
    was past BLOCK_CHARS."""
    kept: _Kept | None = ctx.state.get(_KEY)
    if kept is None or kept.index != block or kept.text is None:
        return None
    text, signed = kept.text, kept.signature
    kept.text, kept.signature = None, []  # ended: a piece that came after it is not kept
    return [ThinkingBlock("".join(text), "".join(signed))] if signed else None


def sent_messages(messages: list[Message], field: str | None) -> list[Any]:
    """The conversation as an OpenAI-wire server gets it: an assistant message's `thinking_blocks` left out,
    and its `reasoning_content` under `field`, or left out. The list itself when no message has either."""
    out: list[Any] | None = None
    for i, a in enumerate(messages):
        if not isinstance(a, AssistantMessage):
            continue
        if a.thinking_blocks is None and (a.reasoning_content is None or field == "reasoning_content"):
            continue
        if out is None:
            out = list(messages)
        native = field == "reasoning_content"  # the server's name is the gateway's: the struct encodes it
        sent = msgspec.structs.replace(
            a, thinking_blocks=None, reasoning_content=a.reasoning_content if native else None
        )
        if field is None or native or a.reasoning_content is None:
            out[i] = sent
        else:
            out[i] = {**msgspec.to_builtins(sent), field: a.reasoning_content}
    return messages if out is None else out


def chunked_messages(messages: list[Message]) -> list[Any]:
    """The conversation as Mistral's chat route takes the model's earlier thinking: an assistant message's
    `reasoning_content` as a `thinking` chunk (its text in one text chunk) before the turn's text, which
    becomes a text chunk; its `thinking_blocks` (other providers' signatures) left out. The shape of
    pydantic-ai's recorded second turn to Mistral, which Mistral's SDK examples ask for: a reasoning model
    that loses its earlier thinking answers worse. The list itself when no message has either field."""
    out: list[Any] | None = None
    for i, a in enumerate(messages):
        if not isinstance(a, AssistantMessage) or (a.thinking_blocks is None and a.reasoning_content is None):
            continue
        if out is None:
            out = list(messages)
        sent = msgspec.structs.replace(a, thinking_blocks=None, reasoning_content=None)
        if not a.reasoning_content:
            out[i] = sent
            continue
        content: list[Any] = [{"type": "thinking", "thinking": [{"type": "text", "text": a.reasoning_content}]}]
        if isinstance(a.content, str):
            if a.content:
                content.append({"type": "text", "text": a.content})
        elif a.content is not None:
            content += a.content
        out[i] = {**msgspec.to_builtins(sent), "content": content}
    return messages if out is None else out


__all__ = ["BLOCK_CHARS", "chunked_messages", "ended", "piece", "returned", "sent_messages", "signature"]
