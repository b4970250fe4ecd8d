"""OpenAI's chat conversation as Cohere's v2 `/chat` request, and Cohere's answers and stream events back as
`chat.completion` and its chunks (providers/cohere.py sends and reads them).

Cohere v2's messages are nearly OpenAI's: `developer` messages become `system` ones, an assistant's
`tool_calls` and a `tool` message's `tool_call_id` pass as they are. Tools keep OpenAI's function shape;
`tool_choice` is `REQUIRED` or `NONE` (a named function: the tools narrowed to it, and `REQUIRED`);
`response_format` is `json_object` with an optional `json_schema`. Answers: `text` content items join into
the content, `thinking` items into `reasoning_content` (the `tool_plan` left out), `tool_calls` pass with
their ids and arguments as sent. Streams: `message-start` gives the role, `content-delta` the text or
the thinking, `tool-call-start` a call's id and name (and any first arguments), `tool-call-delta` its
arguments' pieces as sent, `message-end` the finish reason and usage.
"""

from __future__ import annotations

from typing import Any, Final

from providers.base import CallContext
from providers.call_cap import stream_calls
from providers.call_ids import made_call_id
from providers.chat_parts import answer_message, assistant_text
from providers.finish import finish_reason
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
from wire.errors import InvalidRequestError, shown
from wire.messages import (
    AssistantMessage,
    DeveloperMessage,
    FunctionCall,
    ImagePart,
    Message,
    SystemMessage,
    TextPart,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from wire.schema import Usage

# Cohere's finish words that end a turn of tool calls.
_TOOL_CALL: Final = frozenset({"TOOL_CALL", "TOOL_CALLS"})


def tools(body: dict[str, Any], value: list[dict[str, Any]]) -> None:
    out = []
    for t in value:
        fn = t["function"]
        # Only the fields Cohere's ToolV2Function has (OpenAI's `strict` is not one of them: below).
        function = {k: fn[k] for k in ("name", "description", "parameters") if fn.get(k) is not None}
        out.append({"type": "function", "function": function})
    body["tools"] = out
    if all(t["function"].get("strict") is True for t in value):
        # Cohere's one flag for all the request's tools (`strict_tools`): only when every function asks it
        # (the `tools` rule's `strict="all"`; the gateway refuses or drops a mixed request's).
        body["strict_tools"] = True


def tool_choice(body: dict[str, Any], choice: str | dict[str, Any]) -> None:
    if isinstance(choice, dict):
        # Cohere cannot name one tool: offering only that one and requiring a call is the same request.
        name = choice["function"]["name"]
        narrowed = [t for t in body.get("tools", ()) if t["function"]["name"] == name]
        if not narrowed:
            raise InvalidRequestError(
                f"'tool_choice' names function '{shown(name)}', which is not one of the tools",
                param="tool_choice",
                code="invalid_value",
            )
        body["tools"] = narrowed
        body["tool_choice"] = "REQUIRED"
    elif choice != "auto":  # Cohere's default: the model decides
        body["tool_choice"] = choice.upper()


def response_format(body: dict[str, Any], value: dict[str, Any]) -> None:
    kind = value.get("type")
    if kind == "text":
        return
    out: dict[str, Any] = {"type": "json_object"}
    spec = value.get("json_schema")
    if kind == "json_schema":
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if schema is None:
            raise InvalidRequestError(
                "'response_format' of type json_schema needs json_schema.schema",
                param="response_format",
                code="invalid_value",
            )
        out["json_schema"] = schema
    body["response_format"] = out


def _texts(content: str | list[TextPart]) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)


def _user(m: UserMessage) -> str | list[dict[str, Any]]:
    if isinstance(m.content, str):
        return m.content
    return [
        {"type": "text", "text": p.text}
        if isinstance(p, TextPart)
        else {"type": "image_url", "image_url": {"url": p.image_url.url}}
        for p in m.content
        if isinstance(p, TextPart | ImagePart)
    ]


def _assistant(m: AssistantMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant"}
    text = assistant_text(m)
    if text:
        out["content"] = text
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in m.tool_calls
        ]
    return out


def to_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """The `messages` of Cohere's v2 chat request."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, SystemMessage | DeveloperMessage):
            out.append({"role": "system", "content": _texts(m.content)})
        elif isinstance(m, UserMessage):
            out.append({"role": "user", "content": _user(m)})
        elif isinstance(m, AssistantMessage):
            out.append(_assistant(m))
        else:
            assert isinstance(m, ToolMessage)
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": _texts(m.content)})
    return out


def finish(word: str | None, calls: bool) -> ChatFinishReason | None:
    if word in _TOOL_CALL or (calls and finish_reason(word) == "stop"):
        return "tool_calls"
    return finish_reason(word)


def chat_answer(message: Any, word: str | None, usage: Usage | None, ctx: CallContext) -> ChatCompletion:
    """A v2 chat answer's message (its `content` items and `tool_calls`) as `chat.completion`."""
    content = message.content if message is not None else []
    text = "".join(item.text for item in content if item.type == "text")
    ups = [c for c in (message.tool_calls if message is not None else None) or () if c.function is not None]
    calls = [
        ToolCall(
            id=c.id or made_call_id(ctx, 0, k),
            function=FunctionCall(name=c.function.name, arguments=c.function.arguments),
        )
        for k, c in enumerate(ups)
    ]
    thinking = "".join(item.thinking for item in content if item.type == "thinking")
    reply = answer_message(text, calls, thinking)
    return ChatCompletion(
        ctx.id, ctx.created, ctx.model, [ChatChoice(0, reply, finish(word, bool(calls)), None)], usage=usage
    )


def _chunk(
    ctx: CallContext, delta: Delta, why: ChatFinishReason | None = None, usage: Usage | None = None
) -> ChatChunk:
    return ChatChunk(ctx.id, ctx.created, ctx.model, [ChunkChoice(0, delta, why, None)], usage=usage)


def _field(node: Any, *path: str) -> Any:
    """`node[path[0]][path[1]]...` of a free-form event part, None where any step is missing."""
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def chat_event(kind: str | None, index: int | None, message: Any, ctx: CallContext) -> ChatChunk | None:
    """A stream event other than `message-end` (its `type`, its `index` and its `delta.message`) as a chunk."""
    if kind == "message-start":
        return _chunk(ctx, Delta(role="assistant", content=""))
    if kind == "content-delta":
        text = _field(message, "content", "text")
        if isinstance(text, str) and text:
            return _chunk(ctx, Delta(content=text))
        thinking = _field(message, "content", "thinking")  # a reasoning model's
        return _chunk(ctx, Delta(reasoning_content=thinking)) if isinstance(thinking, str) and thinking else None
    calls = stream_calls(ctx.state)
    if kind == "tool-call-start":
        call = _field(message, "tool_calls")
        if isinstance(call, list):  # the SDK types it as one call; take a list of one as well
            call = call[0] if call else None
        name = _field(call, "function", "name")
        if not isinstance(name, str):
            return None
        at = calls.start(index)
        arguments = _field(call, "function", "arguments")
        function = FunctionDelta(name=name, arguments=arguments if isinstance(arguments, str) else "")
        call_id = _field(call, "id")
        if not isinstance(call_id, str) or not call_id:
            call_id = made_call_id(ctx, 0, at)
        start = ToolCallDelta(index=at, id=call_id, type="function", function=function)
        return _chunk(ctx, Delta(tool_calls=[start]))
    if kind == "tool-call-delta":
        piece = _field(message, "tool_calls", "function", "arguments")
        slot = calls.of(index)
        if slot is None or not isinstance(piece, str) or not piece:
            return None  # arguments of a call that never started: nothing to attach them to
        return _chunk(ctx, Delta(tool_calls=[ToolCallDelta(index=slot, function=FunctionDelta(arguments=piece))]))
    # content-start/-end, tool-plan-delta, tool-call-end, citation-*, debug, and event types added later.
    return None


def chat_end(word: str | None, usage: Usage | None, ctx: CallContext) -> ChatChunk:
    """`message-end`: the finish chunk, with the stream's usage."""
    return _chunk(ctx, Delta(), finish(word, bool(ctx.state.get("tool_index"))), usage)


__all__ = [
    "chat_answer",
    "chat_end",
    "chat_event",
    "finish",
    "response_format",
    "to_messages",
    "tool_choice",
    "tools",
]
