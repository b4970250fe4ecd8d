"""An assistant turn for APIs that take and answer it as typed blocks (Anthropic, Gemini, Bedrock's Converse,
Cohere): read, its text joined and each tool call's arguments as the JSON object those APIs require; and
written back, the answer's blocks as one chat message."""

from __future__ import annotations

from typing import Any

import msgspec

from providers.call_cap import held_calls
from wire.chat import ChatMessage
from wire.errors import InvalidRequestError, shown
from wire.messages import AssistantMessage, TextPart, ThinkingBlocks, ToolCall


def assistant_text(m: AssistantMessage) -> str:
    """The turn's text: its string, or its text and refusal parts joined; a turn that said nothing else (an
    OpenAI refusal, content null) is its `refusal`. A refusal is what the assistant said: without it the turn
    would be empty, which these APIs refuse or drop, and the model would not see that it declined."""
    content = m.content
    if isinstance(content, str):
        text = content
    else:
        text = "".join(p.text if isinstance(p, TextPart) else p.refusal for p in content or ())
    return text or m.refusal or ""


def call_arguments(call: ToolCall, provider: str) -> dict[str, Any]:
    """A tool call's arguments decoded; arguments that are not a JSON object are a 400 naming `provider`."""
    try:
        args = msgspec.json.decode(call.function.arguments or "{}")
    except (msgspec.DecodeError, RecursionError):  # nesting past the interpreter's limit is not an object either
        args = None
    if not isinstance(args, dict):
        raise InvalidRequestError(
            f"Tool call '{shown(call.id)}' has arguments that are not a JSON object, which {provider} requires",
            param="messages",
            code="invalid_value",
        )
    return args


def answer_message(
    text: str, calls: list[ToolCall], reasoning: str, signed: ThinkingBlocks | None = None
) -> ChatMessage:
    """An answer's blocks as the assistant's message: its text (null beside tool calls, else at least ""),
    its tool calls, its thinking as `reasoning_content` and its signed thinking blocks, each left out when
    empty."""
    held_calls(calls)
    return ChatMessage(
        role="assistant",
        content=text or (None if calls else ""),
        tool_calls=calls or None,
        reasoning_content=reasoning or None,
        thinking_blocks=signed or None,
    )
