"""Chat answers in the cache: always stored as the `chat.completion` the client would get buffered (an
entry's `body`), whether the miss was buffered or streamed, and replayed to a streamed request as a
`chat.completion.chunk` stream made from it.

A chat stream's chunks are not kept as they came (their deltas say nothing a client needs beyond what
they add up to): `Assembly` adds them up as the relay sends them, the content, refusal and tool-call
arguments joined per choice, the logprobs and signed thinking blocks concatenated, so one entry serves both
kinds of request and a client reassembling the replayed deltas gets the stored answer exactly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Final

import msgspec

from gateway.cache.batch import kept
from gateway.cache.entry import VERSION, Entry, dump
from gateway.cache.job import Storing
from gateway.upstream.framing import DONE, sse_event
from providers.base import CallContext
from wire.chat import (
    ChatChoice,
    ChatChunk,
    ChatCompletion,
    ChatFinishReason,
    ChatLogprobs,
    ChatMessage,
    TokenLogprob,
    answer_chunks,
)
from wire.messages import FunctionCall, RedactedThinkingBlock, ThinkingBlock, ThinkingBlocks, ToolCall
from wire.schema import Usage, encode

# What one logprob entry counts against the entry's room besides its token (its numbers and keys, encoded).
_LOGPROB: Final = 48


class _Call:
    __slots__ = ("id", "name", "arguments")

    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.arguments: list[str] = []


class _Choice:
    """One choice's deltas so far."""

    __slots__ = ("content", "refusal", "reasoning", "blocks", "calls", "logprobs", "token_ids", "finish", "why")

    def __init__(self) -> None:
        self.content: list[str] | None = None
        self.refusal: list[str] | None = None
        self.reasoning: list[str] | None = None
        self.blocks: ThinkingBlocks | None = None
        self.calls: dict[int, _Call] = {}
        self.logprobs: list[TokenLogprob] | None = None
        self.token_ids: list[int] | None = None
        self.finish: ChatFinishReason | None = None
        self.why: int | str | None = None

    def answer(self, index: int) -> ChatChoice:
        calls = [
            ToolCall(id=c.id, function=FunctionCall(name=c.name, arguments="".join(c.arguments)))
            for _, c in sorted(self.calls.items())
        ]
        message = ChatMessage(
            role="assistant",
            content="".join(self.content) if self.content is not None else None,
            tool_calls=calls or None,
            refusal="".join(self.refusal) if self.refusal is not None else None,
            reasoning_content="".join(self.reasoning) if self.reasoning is not None else None,
            thinking_blocks=self.blocks,
        )
        lp = ChatLogprobs(content=self.logprobs) if self.logprobs is not None else None
        return ChatChoice(index, message, self.finish, lp, self.token_ids, self.why)


class Assembly:
    """A chat stream's chunks added up into its answer, within `room` bytes (past it, `add` says False and the
    stream is not stored)."""

    __slots__ = ("choices", "fingerprint", "prompt_ids", "size", "room")

    def __init__(self, room: int) -> None:
        self.choices: dict[int, _Choice] = {}
        self.fingerprint: str | None = None
        self.prompt_ids: list[int] | None = None
        self.size = 0
        self.room = room

    def add(self, chunk: ChatChunk) -> bool:
        if chunk.system_fingerprint:
            self.fingerprint = chunk.system_fingerprint
        size = self.size
        if chunk.prompt_token_ids is not None and self.prompt_ids is None:
            self.prompt_ids = chunk.prompt_token_ids
            size += 8 * len(chunk.prompt_token_ids)
        for ch in chunk.choices:
            have = self.choices.get(ch.index)
            if have is None:
                have = self.choices[ch.index] = _Choice()
            d = ch.delta
            if d.content is not None:
                (have.content if have.content is not None else _start(have, "content")).append(d.content)
                size += len(d.content)
            if d.refusal is not None:
                (have.refusal if have.refusal is not None else _start(have, "refusal")).append(d.refusal)
                size += len(d.refusal)
            if d.reasoning_content is not None:
                (have.reasoning if have.reasoning is not None else _start(have, "reasoning")).append(
                    d.reasoning_content
                )
                size += len(d.reasoning_content)
            if d.thinking_blocks is not None:
                (have.blocks if have.blocks is not None else _start(have, "blocks")).extend(d.thinking_blocks)
                size += sum(_block_size(b) for b in d.thinking_blocks)
            for t in d.tool_calls or ():
                call = have.calls.get(t.index)
                if call is None:
                    call = have.calls[t.index] = _Call()
                if t.id:
                    call.id = t.id
                f = t.function
                if f is not None:
                    if f.name:
                        call.name = f.name
                    if f.arguments:
                        call.arguments.append(f.arguments)
                        size += len(f.arguments)
                size += 64
            lp = ch.logprobs
            if lp is not None and lp.content:
                (have.logprobs if have.logprobs is not None else _start(have, "logprobs")).extend(lp.content)
                size += sum(len(t.token) + _LOGPROB * (1 + len(t.top_logprobs)) for t in lp.content)
            ids = ch.token_ids
            if ids is not None:
                (have.token_ids if have.token_ids is not None else _start(have, "token_ids")).extend(ids)
                size += 8 * len(ids)
            if ch.finish_reason is not None:
                have.finish = ch.finish_reason
                have.why = ch.stop_reason
        self.size = size
        return size <= self.room

    def answer(self, usage: Usage | None, n: int) -> ChatCompletion | None:
        """What the stream came to; None unless every choice got its finish reason."""
        choices = self.choices
        if len(choices) < n or any(c.finish is None for c in choices.values()):
            return None
        return ChatCompletion(
            id="",
            created=0,
            model="",
            choices=[c.answer(i) for i, c in sorted(choices.items())],
            system_fingerprint=self.fingerprint,
            usage=usage,
            prompt_token_ids=self.prompt_ids,
        )


def _block_size(block: ThinkingBlock | RedactedThinkingBlock) -> int:
    if isinstance(block, RedactedThinkingBlock):
        return len(block.data)
    return len(block.thinking) + len(block.signature or "")


def _start(choice: _Choice, field: str) -> list[object]:
    parts: list[object] = []
    setattr(choice, field, parts)
    return parts


def store_answer(lookup: Storing, answer: ChatCompletion, provider: str, target: str) -> bytes | None:
    """A chat answer stored as its client bytes (`Entry.body`): in memory, or returned for a remote store;
    nothing unless every choice got its finish reason."""
    if len(answer.choices) < lookup.n or any(c.finish_reason is None for c in answer.choices):
        return None
    body = encode(answer)
    cache = lookup.cache
    entry = Entry(
        VERSION, cache.clock(), lookup.rec.model, provider, target, answer.usage, [], answer.system_fingerprint, body
    )
    return kept(lookup, dump(entry), entry, 0)


_answer = msgspec.json.Decoder(ChatCompletion).decode


async def replay(entry: Entry, ctx: CallContext, want_usage: bool) -> AsyncIterator[bytes]:
    """A stored chat answer as this request's stream (wire/chat.py `answer_chunks`: per choice the role, its
    content with its logprobs, its refusal, its tool calls each whole, its finish; then the usage), [DONE]."""
    assert entry.body is not None
    stored = msgspec.structs.replace(
        _answer(entry.body),
        id=ctx.id,
        created=ctx.created,
        model=ctx.model,
        system_fingerprint=entry.system_fingerprint,
        usage=entry.usage if want_usage else None,
    )
    last: ChatChunk | None = None
    for chunk in answer_chunks(stored):
        if last is not None:
            yield sse_event(encode(last))
        last = chunk
    if last is not None:
        if ctx.usage_last and not want_usage:  # the route's dialect: the usage on the last chunk, unasked
            last.usage = entry.usage
        yield sse_event(encode(last))
    yield DONE


__all__ = ["Assembly", "replay", "store_answer"]
