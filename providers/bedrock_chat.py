"""OpenAI's chat conversation as Bedrock's Converse request, and Converse's answers back as `chat.completion`.

Requests: `system` and `developer` messages become `system` blocks; user content `text` and (data-URL)
`image` blocks; an assistant's `tool_calls` `toolUse` blocks (arguments must be a JSON object); `tool`
messages `toolResult` blocks of a user turn (turns of one role merged: Converse wants them to alternate).
`tools` are `toolConfig.tools[].toolSpec`, `tool_choice` `toolConfig.toolChoice` (`required` is `any`),
`response_format: json_schema` `outputConfig.textFormat`. Answers: `text` blocks join into the content,
`reasoningContent` blocks' text into `reasoning_content` (signed ones also `thinking_blocks`), `toolUse`
blocks become `tool_calls`. Streams: `messageStart` gives the role chunk, `reasoningContent` deltas
reasoning pieces, a `toolUse` block's `contentBlockStart` its `id` and `name` (its tool-call index counts
tool blocks only), its deltas the arguments' pieces as sent, `messageStop` the finish reason, `metadata`
the usage chunk. What maps to what: docs/chat.md; the recordings: tests/fixtures/SOURCES.md.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any, Final, Protocol

import msgspec

from providers import thinking
from providers.base import EMULATED, CallContext, Param, Table, out_of_range, stop_list, table
from providers.call_cap import stream_calls
from providers.chat_parts import answer_message, assistant_text, call_arguments
from providers.openai_chat import chat_finish
from wire.chat import (
    ChatChoice,
    ChatChunk,
    ChatCompletion,
    ChatFinishReason,
    ChatRequest,
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

# Converse's ImageBlock formats, by the data URL's media type.
_IMAGE_FORMATS: Final = {"image/png": "png", "image/jpeg": "jpeg", "image/gif": "gif", "image/webp": "webp"}
# A private marker: top_k's target depends on the model, which the parameter table does not see.
TOP_K_MARK: Final = "__top_k"


def _top_k(body: dict[str, Any], value: int) -> None:
    # -1 (and 0) mean "no top-k cut", which is every model's behaviour without the field.
    if value > 0:
        body[TOP_K_MARK] = value


def _tools(body: dict[str, Any], tools: list[dict[str, Any]]) -> None:
    specs = []
    for t in tools:
        f = t["function"]
        spec: dict[str, Any] = {"name": f["name"]}
        if f.get("description"):
            spec["description"] = f["description"]
        spec["inputSchema"] = {"json": f.get("parameters") or {"type": "object", "properties": {}}}
        if f.get("strict") is not None:
            spec["strict"] = f["strict"]
        specs.append({"toolSpec": spec})
    body.setdefault("toolConfig", {})["tools"] = specs


def _tool_choice(body: dict[str, Any], choice: str | dict[str, Any]) -> None:
    if isinstance(choice, dict):
        chosen: dict[str, Any] = {"tool": {"name": choice["function"]["name"]}}
    else:
        chosen = {"any": {}} if choice == "required" else {"auto": {}}
    body.setdefault("toolConfig", {})["toolChoice"] = chosen


def _parallel(body: dict[str, Any], parallel: bool) -> None:
    pass  # true is Converse's behaviour; false is refused by `refused`


def _response_format(body: dict[str, Any], fmt: dict[str, Any]) -> None:
    spec = fmt.get("json_schema") or {}
    if fmt["type"] == "json_schema" and spec.get("schema") is not None:
        definition: dict[str, Any] = {"name": spec["name"], "schema": msgspec.json.encode(spec["schema"]).decode()}
        if spec.get("description"):
            definition["description"] = spec["description"]
        body["outputConfig"] = {
            "textFormat": {"type": "json_schema", "structure": {"jsonSchema": definition}},
        }
    # `text` is Converse's default; `json_object` and a schema-less json_schema are refused by `refused`.


CHAT_PARAMS: Final[Table] = table(
    max_tokens=Param(to="inferenceConfig.maxTokens"),
    temperature=Param(to="inferenceConfig.temperature"),
    top_p=Param(to="inferenceConfig.topP"),
    stop=Param(to="inferenceConfig.stopSequences", convert=stop_list),
    n=EMULATED,  # Converse answers one choice: one call per choice (gateway/emulation/chat.py)
    top_k=Param(apply=_top_k),
    user=Param(to="requestMetadata.user"),
    tools=Param(apply=_tools),
    tool_choice=Param(apply=_tool_choice),
    parallel_tool_calls=Param(apply=_parallel),
    response_format=Param(apply=_response_format),
)


def _refusal(req: ChatRequest) -> tuple[str, str] | None:
    if req.tool_choice == "none":
        # Leaving the tools out instead would fail a conversation that holds tool calls: Converse wants
        # toolConfig beside toolUse blocks.
        return "tool_choice", "'tool_choice: none' (Converse's tool choice is auto, any or a named tool)"
    if req.parallel_tool_calls is False:
        return "parallel_tool_calls", "'parallel_tool_calls: false' (Converse has no switch to forbid them)"
    fmt = req.response_format
    if fmt is not None and fmt["type"] == "json_object":
        return "response_format", "'response_format: json_object' (Converse constrains output to a schema only)"
    if fmt is not None and fmt["type"] == "json_schema" and fmt["json_schema"].get("schema") is None:
        return "response_format", "'response_format.json_schema' without a 'schema'"
    return None


def refused(req: ChatRequest, provider: str) -> None:
    """The 400 for a value of a field the table takes that Converse cannot honour, and for a temperature
    beyond Converse's 0-1 (clamping would change the sampling)."""
    refusal = _refusal(req)
    if refusal is not None:
        field, what = refusal
        raise UnsupportedParamError(field, provider, f"Provider '{provider}' does not support {what}")
    if req.temperature is not None and req.temperature > 1:
        raise out_of_range(provider, "temperature", req.temperature, 0, 1)


# --- the request --------------------------------------------------------------------------------------


def _text(content: str | list[TextPart]) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)


def _image(url: str, provider: str) -> dict[str, Any]:
    media, sep, data = url[len("data:") :].partition(";base64,") if url.startswith("data:") else ("", "", "")
    fmt = _IMAGE_FORMATS.get(media.lower())
    if not sep or fmt is None:
        raise UnsupportedParamError(
            "messages",
            provider,
            f"Provider '{provider}' takes images only inline, as a base64 data URL of a PNG, JPEG, GIF or WebP "
            "image (Converse does not fetch URLs)",
        )
    try:
        base64.b64decode(data, validate=True)
    except binascii.Error:
        raise InvalidRequestError(
            "An image_url data URL is not valid base64", param="messages", code="invalid_value"
        ) from None
    # Converse's JSON wire carries blob bytes as base64 text: the data URL's own.
    return {"image": {"format": fmt, "source": {"bytes": data}}}


def _user(m: UserMessage, provider: str) -> list[dict[str, Any]]:
    if isinstance(m.content, str):
        return [{"text": m.content}]
    return [{"text": p.text} if isinstance(p, TextPart) else _image(p.image_url.url, provider) for p in m.content]


def _assistant(m: AssistantMessage) -> list[dict[str, Any]]:
    # The turn's signed thinking first, as Claude wants it before the tool calls it led to.
    blocks: list[dict[str, Any]] = [
        {"reasoningContent": {"redactedContent": b.data}}
        if isinstance(b, RedactedThinkingBlock)
        else {"reasoningContent": {"reasoningText": {"text": b.thinking, "signature": b.signature}}}
        for b in thinking.returned(m)
    ]
    text = assistant_text(m)
    if text:  # Converse refuses a blank text block
        blocks.append({"text": text})
    for call in m.tool_calls or ():
        args = call_arguments(call, "Bedrock's toolUse")
        blocks.append({"toolUse": {"toolUseId": call.id, "name": call.function.name, "input": args}})
    return blocks


def to_converse(messages: list[Message], provider: str) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    """The `system` blocks and the alternating turns of a Converse request."""
    system: list[dict[str, str]] = []
    turns: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, SystemMessage | DeveloperMessage):
            text = _text(m.content)
            if text:
                system.append({"text": text})
            continue
        if isinstance(m, UserMessage):
            role, blocks = "user", _user(m, provider)
        elif isinstance(m, AssistantMessage):
            role, blocks = "assistant", _assistant(m)
        else:
            assert isinstance(m, ToolMessage)
            result = {"toolUseId": m.tool_call_id, "content": [{"text": _text(m.content)}]}
            role, blocks = "user", [{"toolResult": result}]
        if not blocks:
            continue  # an assistant turn with neither text nor calls says nothing
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return system, turns


# --- the answer ---------------------------------------------------------------------------------------


class ToolUse(msgspec.Struct, rename="camel"):
    tool_use_id: str = ""
    name: str = ""
    input: Any = None


class _ReasoningText(msgspec.Struct):
    text: str | None = None
    signature: str | None = None  # Claude's (chat's `thinking_blocks`)


class Reasoning(msgspec.Struct, rename="camel"):
    """A `reasoningContent` block (its text under `reasoningText`, or encrypted as `redactedContent`) or
    stream delta (its text, signature or `redactedContent` at once)."""

    reasoning_text: _ReasoningText | None = None
    redacted_content: str | None = None  # base64, as JSON carries a blob
    text: str | None = None
    signature: str | None = None


class Block(Protocol):
    """A content block of an answer as providers/bedrock.py decodes it."""

    @property
    def text(self) -> str | None: ...

    @property
    def tool_use(self) -> ToolUse | None: ...

    @property
    def reasoning_content(self) -> Reasoning | None: ...


class _Start(msgspec.Struct, rename="camel"):
    tool_use: ToolUse | None = None


class _ToolPiece(msgspec.Struct):
    input: str | None = None


class _Delta(msgspec.Struct, rename="camel"):
    text: str | None = None
    tool_use: _ToolPiece | None = None
    reasoning_content: Reasoning | None = None


class _Event(msgspec.Struct, rename="camel"):
    content_block_index: int | None = None
    start: _Start | None = None
    delta: _Delta | None = None
    stop_reason: str | None = None


_decode_event = msgspec.json.Decoder(_Event).decode


def chat_answer(
    blocks: Sequence[Block], stop_reason: str | None, usage: Usage | None, ctx: CallContext
) -> ChatCompletion:
    """The output message's blocks as `chat.completion`."""
    text = "".join(b.text for b in blocks if b.text is not None)
    calls = [
        ToolCall(
            id=b.tool_use.tool_use_id,
            function=FunctionCall(
                name=b.tool_use.name,
                arguments=msgspec.json.encode(b.tool_use.input if b.tool_use.input is not None else {}).decode(),
            ),
        )
        for b in blocks
        if b.tool_use is not None
    ]
    reasoning = "".join(
        b.reasoning_content.reasoning_text.text or ""
        for b in blocks
        if b.reasoning_content is not None and b.reasoning_content.reasoning_text is not None
    )
    message = answer_message(text, calls, reasoning, _signed(blocks))
    choice = ChatChoice(0, message, chat_finish(stop_reason), None)
    return ChatCompletion(ctx.id, ctx.created, ctx.model, [choice], usage=usage)


def _signed(blocks: Sequence[Block]) -> ThinkingBlocks:
    """The answer's signed and redacted `reasoningContent` blocks, in order."""
    out: ThinkingBlocks = []
    for b in blocks:
        r = b.reasoning_content
        if r is None:
            continue
        if r.redacted_content:
            out.append(RedactedThinkingBlock(r.redacted_content))
        elif r.reasoning_text is not None and r.reasoning_text.signature:
            out.append(ThinkingBlock(r.reasoning_text.text or "", r.reasoning_text.signature))
    return out


def _chunk(
    ctx: CallContext, delta: Delta, finish: ChatFinishReason | None = None, usage: Usage | None = None
) -> ChatChunk:
    return ChatChunk(ctx.id, ctx.created, ctx.model, [ChunkChoice(0, delta, finish, None)], usage=usage)


def chat_event(event: str | None, data: bytes, ctx: CallContext) -> ChatChunk | None:
    """One ConverseStream event (not an exception, nor `metadata`) as a chat chunk, or None."""
    if event == "messageStart":
        return _chunk(ctx, Delta(role="assistant", content=""))
    if event == "contentBlockDelta":
        ev = _decode_event(data)
        d = ev.delta
        if d is None:
            return None
        if d.text:
            return _chunk(ctx, Delta(content=d.text))
        if d.tool_use is not None and d.tool_use.input:
            at = stream_calls(ctx.state).of(ev.content_block_index)
            if at is None:
                return None  # arguments of a block that never started: nothing to attach them to
            piece = ToolCallDelta(index=at, function=FunctionDelta(arguments=d.tool_use.input))
            return _chunk(ctx, Delta(tool_calls=[piece]))
        r = d.reasoning_content
        if r is not None:
            if r.text:
                thinking.piece(ctx, ev.content_block_index, r.text)
                return _chunk(ctx, Delta(reasoning_content=r.text))
            if r.signature:
                thinking.signature(ctx, ev.content_block_index, r.signature)
            elif r.redacted_content:
                return _chunk(ctx, Delta(thinking_blocks=[RedactedThinkingBlock(r.redacted_content)]))
        return None  # delta types added later
    if event == "contentBlockStart":
        ev = _decode_event(data)
        use = ev.start.tool_use if ev.start is not None else None
        calls = stream_calls(ctx.state)
        if use is None:
            calls.other(ev.content_block_index)
            return None
        at = calls.start(ev.content_block_index)
        start = ToolCallDelta(
            index=at, id=use.tool_use_id, type="function", function=FunctionDelta(name=use.name, arguments="")
        )
        return _chunk(ctx, Delta(tool_calls=[start]))
    if event == "contentBlockStop":  # a signed reasoning block's chunk of its own (providers/thinking.py)
        signed = thinking.ended(ctx, _decode_event(data).content_block_index)
        return None if signed is None else _chunk(ctx, Delta(thinking_blocks=signed))
    if event == "messageStop":
        return _chunk(ctx, Delta(), chat_finish(_decode_event(data).stop_reason) or "stop")
    return None  # event types added later


def usage_only(ctx: CallContext, usage: Usage) -> ChatChunk:
    """The `metadata` event's usage, as the stream's usage chunk."""
    return ChatChunk(ctx.id, ctx.created, ctx.model, [], usage=usage)


__all__ = [
    "CHAT_PARAMS",
    "TOP_K_MARK",
    "Reasoning",
    "ToolUse",
    "chat_answer",
    "chat_event",
    "refused",
    "to_converse",
    "usage_only",
]
