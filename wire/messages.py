"""Wire types of a chat conversation: OpenAI's messages, strict, and what every route reads of them.

Content parts and tool calls are checked against OpenAI's shapes here (tagged unions by `role` and `type`),
so a bad message is a 400 with its JSON path. `render` makes the conversation one text (a chat request's
`prompt`); `bound_conversation` holds it to the request caps before anything else reads it.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

from wire.errors import InvalidRequestError
from wire.schema import check_depth

# A message's `name` and a function's name: OpenAI's pattern and bound. `\Z`, not `$`, here and below:
# msgspec searches, and `$` also matches before a final newline.
FunctionName = Annotated[str, Meta(pattern=r"\A[A-Za-z0-9_.:-]{1,64}\Z")]


class ImageURL(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class TextPart(msgspec.Struct, forbid_unknown_fields=True, tag_field="type", tag="text"):
    text: str


class ImagePart(msgspec.Struct, forbid_unknown_fields=True, tag_field="type", tag="image_url"):
    image_url: ImageURL


class RefusalPart(msgspec.Struct, forbid_unknown_fields=True, tag_field="type", tag="refusal"):
    refusal: str


class FunctionCall(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    name: str
    arguments: str
    # What the openai SDK's `parse` and `stream` helpers add to a call they return, and send back with it when
    # the message is appended as it came: taken, and cleared by normalize_chat (no upstream sees it).
    parsed_arguments: Any = None


class ToolCall(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, tag_field="type", tag="function"):
    """A function call; its `type` is always written (first, as OpenAI's answers have it) and optional to
    send, as OpenAI's API takes it."""

    id: str
    function: FunctionCall
    index: int | None = None  # the openai SDK's stream helper's, as `parsed_arguments`


Texts = str | list[TextPart]
# lm-evaluation-harness's chat requests (its 0.4 releases) mark every message `"type": "text"`, which OpenAI
# and vLLM ignore: taken here, and cleared by normalize_chat so that no upstream (a strict one refuses it) sees it.
Mark = Literal["text"] | None


class SystemMessage(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, tag_field="role", tag="system"):
    content: Texts
    name: FunctionName | None = None
    type: Mark = None


class DeveloperMessage(
    msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, tag_field="role", tag="developer"
):
    content: Texts
    name: FunctionName | None = None
    type: Mark = None


class UserMessage(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, tag_field="role", tag="user"):
    content: str | list[TextPart | ImagePart]
    name: FunctionName | None = None
    type: Mark = None


class ThinkingBlock(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, tag_field="type", tag="thinking"):
    """One block of a model's thinking with the provider's signature of it (Anthropic's, and Claude's on
    Bedrock), which the provider checks when the block comes back in a later turn."""

    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(msgspec.Struct, forbid_unknown_fields=True, tag_field="type", tag="redacted_thinking"):
    """Thinking the provider returns only encrypted (`data`), to be sent back as it came."""

    data: str


ThinkingBlocks = list[ThinkingBlock | RedactedThinkingBlock]


class AssistantMessage(
    msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, tag_field="role", tag="assistant"
):
    content: str | list[TextPart | RefusalPart] | None = None
    tool_calls: Annotated[list[ToolCall], Meta(min_length=1)] | None = None
    refusal: str | None = None
    name: FunctionName | None = None
    type: Mark = None
    # What the gateway answered beside the content (`ChatMessage`), taken back as a client that appends the
    # answer's message object sends it: providers that want them in a later turn get them (a kind's
    # `chat_reasoning_field`, Anthropic's and Bedrock's thinking blocks), the others never see them.
    reasoning_content: str | None = None
    thinking_blocks: ThinkingBlocks | None = None
    # What the openai SDK's message objects carry and send back when appended as they came (`annotations`,
    # `parsed` from its `parse` helper; `audio` and `function_call` null): taken, and cleared by
    # normalize_chat. An audio reply or a legacy function call is not null: a 400.
    annotations: list[Any] | None = None
    parsed: Any = None
    audio: None = None
    function_call: None = None


class ToolMessage(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, tag_field="role", tag="tool"):
    content: Texts
    tool_call_id: str
    type: Mark = None


Message = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage
# Each message struct's role (its tag), read by `render` without a look at the struct's config.
_ROLES: Final[dict[type, str]] = {
    cls: cls.__struct_config__.tag  # type: ignore[misc]  # each message struct is tagged by its role
    for cls in (SystemMessage, DeveloperMessage, UserMessage, AssistantMessage, ToolMessage)
}


def bound_conversation(messages: list[Message], most: int, parts: int, depth: int) -> None:
    """A conversation held to the request caps before anything reads it, on every route that takes one: at
    most `most` messages (`caps.chat_messages`) holding at most `parts` content parts in all
    (`caps.chat_content_parts`); a 400 naming the field otherwise. What the openai SDK sends back of an
    answer it parsed (`parsed`, `annotations`, a call's `parsed_arguments`, `AssistantMessage`) is
    free-form JSON the client controls: held to `depth` (`caps.json_depth`) as other free-form fields are,
    then cleared, for no upstream."""
    if len(messages) > most:
        raise InvalidRequestError(
            f"The conversation has {len(messages)} messages; at most {most} are allowed",
            param="messages",
            code="invalid_value",
        )
    count = 0
    for i, m in enumerate(messages):
        if m.content.__class__ is list:
            count += len(m.content)
            if count > parts:
                raise InvalidRequestError(
                    f"'messages[{i}].content' brings the conversation's content parts to {count}; at most "
                    f"{parts} are allowed in all",
                    param="messages.content",
                    code="invalid_value",
                )
        if m.__class__ is AssistantMessage and (m.tool_calls or m.annotations is not None or m.parsed is not None):
            _clear_sdk_echo(m, i, depth)


def _clear_sdk_echo(m: AssistantMessage, i: int, depth: int) -> None:
    for name in ("parsed", "annotations"):
        value = getattr(m, name)
        if isinstance(value, dict | list):
            check_depth(value, depth, f"messages[{i}].{name}", f"messages.{name}")
    m.annotations = m.parsed = None
    for j, call in enumerate(m.tool_calls or ()):
        value = call.function.parsed_arguments
        if isinstance(value, dict | list):
            at = f"messages[{i}].tool_calls[{j}].function.parsed_arguments"
            check_depth(value, depth, at, "messages.tool_calls.function.parsed_arguments")
        call.index = call.function.parsed_arguments = None


def text_parts(content: object, sep: str) -> str | None:
    """A message's text: its string, or its text parts joined by `sep` (each server joins them its own way);
    None when it has no content."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return sep.join(p.text for p in content if isinstance(p, TextPart))
    return None


def _text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:  # type: ignore[attr-defined]
        if isinstance(part, TextPart):
            parts.append(part.text)
        elif isinstance(part, RefusalPart):
            parts.append(part.refusal)
        else:
            parts.append("[image]")
    return "".join(parts)


def render(messages: list[Message]) -> str:
    """The conversation as one text, `role: content` per line (tool calls as their name and arguments):
    the same conversation always renders the same, and a longer one starts with a shorter one's text."""
    lines = []
    for m in messages:
        # Every chat request renders its messages: a string's text (most messages') taken without a call.
        content = m.content
        text = content if isinstance(content, str) else _text(content)
        if m.__class__ is AssistantMessage:
            calls = m.tool_calls
            if calls:
                text += "".join(f"{c.function.name}({c.function.arguments})" for c in calls)
        lines.append(f"{_ROLES[m.__class__]}: {text}\n")
    return "".join(lines)


__all__ = [
    "AssistantMessage",
    "DeveloperMessage",
    "FunctionCall",
    "FunctionName",
    "ImagePart",
    "ImageURL",
    "Mark",
    "Message",
    "RedactedThinkingBlock",
    "RefusalPart",
    "SystemMessage",
    "TextPart",
    "Texts",
    "ThinkingBlock",
    "ThinkingBlocks",
    "ToolCall",
    "ToolMessage",
    "UserMessage",
    "bound_conversation",
    "render",
    "text_parts",
]
