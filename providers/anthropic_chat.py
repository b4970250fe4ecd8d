"""OpenAI's chat conversation as Anthropic's Messages API, and Anthropic's answers back as `chat.completion`.

Requests: `system` and `developer` messages become `system`; user content `text` and `image` blocks; an
assistant's `tool_calls` `tool_use` blocks (arguments must be a JSON object); `tool` messages
`tool_result` blocks of a user turn (turns of one role are merged: the API wants them to alternate).
Answers: `text` blocks join into the content, `thinking` blocks into `reasoning_content` (and with
`redacted_thinking` ones, signed, into `thinking_blocks`: providers/thinking.py), `tool_use` blocks become
`tool_calls`. Streams: `thinking_delta` pieces are `reasoning_content` deltas;
`message_start` gives the role chunk, a `tool_use` block's start its `id` and `name` (its tool-call index
counts tool blocks started, under a repeated block index too: providers/call_cap.py), `input_json_delta` the
arguments' pieces as sent, `message_delta` the finish reason and usage. What maps to what: docs/chat.md;
the recordings: tests/fixtures/SOURCES.md.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

import msgspec

from providers import thinking
from providers.base import EMULATED, CallContext, Param, Table, stop_list, table
from providers.call_cap import stream_calls
from providers.chat_parts import answer_message, assistant_text, call_arguments
from wire.chat import (
    ChatChoice,
    ChatChunk,
    ChatCompletion,
    ChatFinishReason,
    ChunkChoice,
    Delta,
    FunctionDelta,
    ToolCallDelta,
)
from wire.errors import InvalidRequestError, UnsupportedParamError
from wire.messages import (
    AssistantMessage,
    DeveloperMessage,
    FunctionCall,
    ImagePart,
    Message,
    RedactedThinkingBlock,
    SystemMessage,
    TextPart,
    ThinkingBlock,
    ThinkingBlocks,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from wire.schema import Usage


class Block(Protocol):
    """A content block as the adapter decodes it."""

    type: str
    text: str
    thinking: str
    signature: str
    data: str
    id: str
    name: str
    input: Any


class BlockDelta(Protocol):
    type: str | None
    text: str | None
    thinking: str | None
    signature: str | None
    partial_json: str | None


def top_k(body: dict[str, Any], value: int) -> None:
    if value >= 0:  # the gateway's -1 means every token, which is Anthropic's default
        body["top_k"] = value


def _tools(body: dict[str, Any], tools: list[dict[str, Any]]) -> None:
    body["tools"] = [
        {
            "name": t["function"]["name"],
            **({"description": t["function"]["description"]} if t["function"].get("description") else {}),
            "input_schema": t["function"].get("parameters") or {"type": "object", "properties": {}},
            # Anthropic's strict tool use: the call's input validated against input_schema, as OpenAI's.
            **({"strict": True} if t["function"].get("strict") is True else {}),
        }
        for t in tools
    ]


def _tool_choice(body: dict[str, Any], choice: str | dict[str, Any]) -> None:
    if isinstance(choice, dict):
        chosen: dict[str, Any] = {"type": "tool", "name": choice["function"]["name"]}
    else:
        chosen = {"type": {"auto": "auto", "required": "any", "none": "none"}[choice]}
    body["tool_choice"] = body.get("tool_choice", {}) | chosen


def _parallel(body: dict[str, Any], parallel: bool) -> None:
    choice = body.setdefault("tool_choice", {"type": "auto"})
    if not parallel and choice.get("type") != "none":
        choice["disable_parallel_tool_use"] = True


# Anthropic's `output_config.effort` levels (platform.claude.com/docs/en/build-with-claude/effort; `xhigh` and
# `max` on its newest models), which OpenAI's `reasoning_effort` names the same way. OpenAI's `none` and
# `minimal` have no level below `low`: refused, not raised to `low`.
EFFORTS: Final = frozenset({"low", "medium", "high", "xhigh", "max"})


def effort(body: dict[str, Any], value: str) -> None:
    if value not in EFFORTS:
        raise UnsupportedParamError(
            "reasoning_effort",
            "anthropic",
            f"Anthropic's effort (output_config.effort) is low, medium, high, xhigh or max: reasoning_effort "
            f"'{value}' has no level there",
        )
    body.setdefault("output_config", {})["effort"] = value


def refuse_two_efforts(extra: dict[str, Any]) -> None:
    """A 400 when the client's extras also set `output_config.effort`: one of the two would be dropped."""
    config = extra.get("output_config")
    if isinstance(config, dict) and "effort" in config:
        raise InvalidRequestError(
            "'reasoning_effort' sets Anthropic's output_config.effort, which 'inference_extra_params' already "
            "sets; send one of them",
            param="reasoning_effort",
            code="invalid_value",
        )


# What both of Anthropic's routes (completions and chat) take the same way.
SAMPLING: Final[Table] = table(
    max_tokens=Param(),
    temperature=Param(),
    top_p=Param(),
    top_k=Param(apply=top_k),
    stop=Param(to="stop_sequences", convert=stop_list),
    user=Param(to="metadata.user_id"),
    reasoning_effort=Param(apply=effort),
)
CHAT_PARAMS: Final[Table] = table(
    SAMPLING,
    n=EMULATED,  # one Messages call per choice (gateway/emulation/chat.py)
    tools=Param(apply=_tools),
    tool_choice=Param(apply=_tool_choice),
    parallel_tool_calls=Param(apply=_parallel),
)


def _text(content: str | list[TextPart]) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)


def _image(url: str) -> dict[str, Any]:
    if url.startswith("data:") and ";base64," in url:
        media, _, data = url[len("data:") :].partition(";base64,")
        return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _user(m: UserMessage) -> list[dict[str, Any]]:
    if isinstance(m.content, str):
        return [{"type": "text", "text": m.content}]
    return [
        {"type": "text", "text": p.text} if isinstance(p, TextPart) else _image(p.image_url.url)
        for p in m.content
        if isinstance(p, TextPart | ImagePart)
    ]


def _assistant(m: AssistantMessage) -> list[dict[str, Any]]:
    # The turn's thinking first, as Anthropic wants it before the tool calls it led to.
    blocks: list[dict[str, Any]] = [
        {"type": "redacted_thinking", "data": b.data}
        if isinstance(b, RedactedThinkingBlock)
        else {"type": "thinking", "thinking": b.thinking, "signature": b.signature}
        for b in thinking.returned(m)
    ]
    text = assistant_text(m)
    if text:
        blocks.append({"type": "text", "text": text})
    for call in m.tool_calls or ():
        args = call_arguments(call, "Anthropic")
        blocks.append({"type": "tool_use", "id": call.id, "name": call.function.name, "input": args})
    return blocks


def to_messages(messages: list[Message]) -> tuple[str | None, list[dict[str, Any]]]:
    """The `system` text and the alternating turns of Anthropic's request."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, SystemMessage | DeveloperMessage):
            system.append(_text(m.content))
            continue
        if isinstance(m, UserMessage):
            role, blocks = "user", _user(m)
        elif isinstance(m, AssistantMessage):
            role, blocks = "assistant", _assistant(m)
        else:
            assert isinstance(m, ToolMessage)
            role, blocks = "user", [{"type": "tool_result", "tool_use_id": m.tool_call_id, "content": _text(m.content)}]
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return ("\n\n".join(system) or None), turns


def chat_chunk(
    ctx: CallContext, delta: Delta, finish: ChatFinishReason | None = None, usage: Usage | None = None
) -> ChatChunk:
    return ChatChunk(ctx.id, ctx.created, ctx.model, [ChunkChoice(0, delta, finish, None)], usage=usage)


def chat_answer(
    blocks: list[Any], finish: ChatFinishReason | None, usage: Usage | None, ctx: CallContext
) -> ChatCompletion:
    text = "".join(b.text for b in blocks if b.type == "text")
    calls = [
        ToolCall(id=b.id, function=FunctionCall(name=b.name, arguments=msgspec.json.encode(b.input or {}).decode()))
        for b in blocks
        if b.type == "tool_use"
    ]
    reasoning = "".join(b.thinking for b in blocks if b.type == "thinking")
    signed: ThinkingBlocks = [
        ThinkingBlock(b.thinking, b.signature) if b.type == "thinking" else RedactedThinkingBlock(b.data)
        for b in blocks
        if (b.type == "thinking" and b.signature) or b.type == "redacted_thinking"
    ]
    message = answer_message(text, calls, reasoning, signed)
    return ChatCompletion(ctx.id, ctx.created, ctx.model, [ChatChoice(0, message, finish, None)], usage=usage)


def chat_delta(index: int | None, block: Block | None, delta: BlockDelta | None, ctx: CallContext) -> ChatChunk | None:
    """A `content_block_start` (`block` set) or `content_block_delta` (`delta` set) as a chat chunk."""
    calls = stream_calls(ctx.state)
    if block is not None:
        if block.type != "tool_use":
            calls.other(index)  # its index's pieces are no longer an earlier call's arguments
            if block.type == "redacted_thinking":
                return chat_chunk(ctx, Delta(thinking_blocks=[RedactedThinkingBlock(block.data)]))
            return None  # a text block's text comes in its deltas
        start = ToolCallDelta(
            index=calls.start(index),
            id=block.id,
            type="function",
            function=FunctionDelta(name=block.name, arguments=""),
        )
        return chat_chunk(ctx, Delta(tool_calls=[start]))
    if delta is None:
        return None
    if delta.type == "text_delta" and delta.text:
        return chat_chunk(ctx, Delta(content=delta.text))
    if delta.type == "thinking_delta" and delta.thinking:
        thinking.piece(ctx, index, delta.thinking)
        return chat_chunk(ctx, Delta(reasoning_content=delta.thinking))
    if delta.type == "signature_delta" and delta.signature:
        thinking.signature(ctx, index, delta.signature)
        return None
    if delta.type == "input_json_delta" and delta.partial_json:
        at = calls.of(index)
        if at is None:
            return None  # arguments of a block that never started: nothing to attach them to
        return chat_chunk(
            ctx, Delta(tool_calls=[ToolCallDelta(index=at, function=FunctionDelta(arguments=delta.partial_json))])
        )
    return None  # delta types added later


def block_ended(index: int | None, ctx: CallContext) -> ChatChunk | None:
    """A `content_block_stop`: a signed thinking block's chunk of its own (providers/thinking.py), else None."""
    blocks = thinking.ended(ctx, index)
    return None if blocks is None else chat_chunk(ctx, Delta(thinking_blocks=blocks))


__all__ = [
    "CHAT_PARAMS",
    "SAMPLING",
    "block_ended",
    "chat_answer",
    "chat_chunk",
    "chat_delta",
    "refuse_two_efforts",
    "to_messages",
    "top_k",
]
