"""Wire types of the chat route: OpenAI's chat request, strict, and the `chat.completion` answer and chunk.

`ChatRequest` is a `CompletionRequest` with `messages` in place of `prompt`, so a chat request travels the
same request path as a completion (keys, routing, limits, budgets, cache, ledger) and adapters read the
same canonical fields. What a chat client may not send (the completion-only fields) is renamed out of the
JSON names, so the decoder refuses it as an unknown field with the same 400 as any other. `prompt` is the
conversation rendered as text (`render`, set by `gateway.path.request.normalize_chat`): what prefix
routing and prompt logging read, and token estimates with `unrendered` (what is sent beside it).

Message content and tools are checked against OpenAI's shapes here (tagged unions by `role` and `type`),
so a bad value is a 400 with its JSON path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

from wire.errors import InvalidRequestError
from wire.schema import CompletionRequest, PromptItem, StopList, Usage, check_depth, refused

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


class ChatRequest(CompletionRequest, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """OpenAI's chat request (openai-python `completion_create_params.py` of `chat`), plus the vendor
    sampling fields the completion routes take. `logprobs` is a boolean here, `top_logprobs` its count."""

    messages: Annotated[list[Message], Meta(min_length=1)]
    # The rendered conversation (`render`), under a name no JSON client sends: set by normalize_chat.
    prompt: str | list[PromptItem] = msgspec.field(default="", name=" rendered")
    # Whether an assistant message carries thinking to send back (set by normalize_chat): the common request
    # has none, and its messages then go upstream as they are, without a look at each.
    thinking_back: bool = msgspec.field(default=False, name=" thinking_back")
    # The index of the first tool message whose `tool_call_id` answers no call of the nearest assistant message
    # before it with tool calls (set by normalize_chat); refused on the routes whose servers refuse it.
    unanswered: int | None = msgspec.field(default=None, name=" unanswered")
    # The index of the first assistant message with tool calls that a later message follows before a tool message
    # answered each call, and of the first tool message answering a call its turn already answered (both set by
    # normalize_chat); refused where `unanswered` is.
    unreplied: int | None = msgspec.field(default=None, name=" unreplied")
    repeated: int | None = msgspec.field(default=None, name=" repeated")
    # Completion-only fields: not OpenAI chat's, so refused by name as unknown fields.
    best_of: int | None = msgspec.field(default=None, name=" best_of")
    echo: bool | None = msgspec.field(default=None, name=" echo")
    suffix: str | None = msgspec.field(default=None, name=" suffix")
    max_new_tokens: int | None = msgspec.field(default=None, name=" max_new_tokens")
    stop_sequences: StopList | None = msgspec.field(default=None, name=" stop_sequences")
    return_token_log_probs: bool | None = msgspec.field(default=None, name=" return_token_log_probs")
    images: list[str] | None = msgspec.field(default=None, name=" images")
    context_length_exceeded_behavior: Literal["truncate", "error"] | None = msgspec.field(
        default=None, name=" context_length_exceeded_behavior"
    )
    # Assistant prefill, under vLLM's and SGLang's names: the answer continues the trailing assistant message
    # instead of answering after it. Continuing implies `add_generation_prompt: false` (normalize_chat).
    continue_final_message: bool | None = msgspec.field(default=None, name="continue_final_message")
    add_generation_prompt: bool | None = msgspec.field(default=None, name="add_generation_prompt")
    # vLLM's `echo` on chat: each choice's content led by the last message's, when the answer's role is that
    # message's (gateway/path/echo.py). The gateway's own on every route: never sent upstream.
    echo_last: bool | None = msgspec.field(default=None, name="echo")


# What `tools`, `tool_choice` and `response_format` (free-form on the union request) must look like on chat:
# checked by `msgspec.convert` in normalize_chat, so a bad value names its path.
class FunctionDef(msgspec.Struct, forbid_unknown_fields=True):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(msgspec.Struct, forbid_unknown_fields=True):
    name: FunctionName


class NamedToolChoice(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    function: NamedFunction


class JSONSchema(msgspec.Struct, forbid_unknown_fields=True):
    name: Annotated[str, Meta(pattern=r"\A[A-Za-z0-9_-]{1,64}\Z")]
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(msgspec.Struct, forbid_unknown_fields=True, tag_field="type", tag="text"):
    pass


class JSONObjectFormat(msgspec.Struct, forbid_unknown_fields=True, tag_field="type", tag="json_object"):
    pass


class JSONSchemaFormat(msgspec.Struct, forbid_unknown_fields=True, tag_field="type", tag="json_schema"):
    json_schema: JSONSchema


ResponseFormat = TextFormat | JSONObjectFormat | JSONSchemaFormat
CHAT_SHAPES: Final = (
    ("tools", list[Tool]),
    ("tool_choice", Literal["none", "auto", "required"] | NamedToolChoice),
    ("response_format", ResponseFormat),
)


def bound_conversation(messages: list[Message], most: int, parts: int, depth: int) -> None:
    """A conversation held to the request caps before anything reads it, on every route that takes one: at
    most `most` messages (`caps.chat_messages`) holding at most `parts` content parts in all
    (`caps.chat_content_parts`); a 400 naming the field otherwise. What the openai SDK sends back of an
    answer it parsed (`parsed`, `annotations`, a call's `parsed_arguments`, wire.chat.AssistantMessage) is
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


# --- the answer ---------------------------------------------------------------------------------------

ChatFinishReason = Literal["stop", "length", "tool_calls", "content_filter"]


class TopLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(msgspec.Struct, omit_defaults=True):
    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None = None


class ChatMessage(msgspec.Struct, omit_defaults=True):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCall] | None = None
    refusal: str | None = None
    # A reasoning model's thinking, apart from its answer, under the name DeepSeek's API and vLLM give it.
    reasoning_content: str | None = None
    # The same thinking as the provider's signed blocks, where it signs them (the names LiteLLM gives them).
    thinking_blocks: ThinkingBlocks | None = None


class ChatChoice(msgspec.Struct, omit_defaults=True):
    index: int
    message: ChatMessage
    finish_reason: ChatFinishReason | None
    logprobs: ChatLogprobs | None  # always written: OpenAI's answers carry `"logprobs": null`
    # vLLM's token-native answer (`return_token_ids`): the ids the choice generated, as the engine sent them;
    # absent unless asked for.
    token_ids: list[int] | None = None
    # The stop string or token id that ended the choice (vLLM's `stop_reason`, SGLang's `matched_stop`), when
    # the request set `include_stop_reason`.
    stop_reason: int | str | None = None

    @property
    def text(self) -> str:
        """What prompt logging records of the choice (a completion choice's `text`)."""
        return self.message.content or ""


class ChatCompletion(msgspec.Struct, omit_defaults=True, tag_field="object", tag="chat.completion"):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    system_fingerprint: str | None = None
    usage: Usage | None = None
    # The prompt's ids as the engine's chat template made them (`return_token_ids`), once for every choice.
    prompt_token_ids: list[int] | None = None
    # vLLM's answer to `prompt_logprobs` on chat (per prompt token of the rendered template: null for the
    # first, else {token_id: {logprob, rank, decoded_token}}), relayed as vLLM sends it; buffered answers only.
    prompt_logprobs: list[dict[str, Any] | None] | None = None


class FunctionDelta(msgspec.Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(msgspec.Struct, omit_defaults=True):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta | None = None


class Delta(msgspec.Struct, omit_defaults=True):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None
    refusal: str | None = None
    reasoning_content: str | None = None
    # Each signed block whole, in the chunk that completes it (its text came before as `reasoning_content`).
    thinking_blocks: ThinkingBlocks | None = None


class ChunkChoice(msgspec.Struct, omit_defaults=True):
    index: int
    delta: Delta
    finish_reason: ChatFinishReason | None
    logprobs: ChatLogprobs | None
    token_ids: list[int] | None = None  # the chunk's own ids (`return_token_ids`)
    stop_reason: int | str | None = None  # on the chunk that finishes the choice (`include_stop_reason`)

    @property
    def text(self) -> str:
        return self.delta.content or ""


class ChatChunk(msgspec.Struct, omit_defaults=True, tag_field="object", tag="chat.completion.chunk"):
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    system_fingerprint: str | None = None
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None  # on a stream's first chunk (`return_token_ids`)


def answer_chunks(answer: ChatCompletion) -> Iterator[ChatChunk]:
    """A whole chat answer as the stream a client reassembles into it exactly: per choice the role (with an
    empty content unless the answer has none, as OpenAI's first chunk), its content with its logprobs, its
    refusal, each tool call whole with its `index`, its finish; then the usage, when it has one."""
    ident, created, model, fp = answer.id, answer.created, answer.model, answer.system_fingerprint

    def chunk(choice: ChunkChoice) -> ChatChunk:
        return ChatChunk(id=ident, created=created, model=model, choices=[choice], system_fingerprint=fp)

    prompt_ids = answer.prompt_token_ids  # on the first chunk, as vLLM streams them
    for ch in answer.choices:
        i, msg = ch.index, ch.message
        opening = Delta(role="assistant", content="" if msg.content is not None else None)
        first = chunk(ChunkChoice(i, opening, None, None))
        if prompt_ids is not None:
            first.prompt_token_ids, prompt_ids = prompt_ids, None
        yield first
        if msg.reasoning_content:  # the thinking streams before the answer
            yield chunk(ChunkChoice(i, Delta(reasoning_content=msg.reasoning_content), None, None))
        if msg.thinking_blocks:
            yield chunk(ChunkChoice(i, Delta(thinking_blocks=msg.thinking_blocks), None, None))
        if msg.content:
            yield chunk(ChunkChoice(i, Delta(content=msg.content), None, ch.logprobs, ch.token_ids))
        if msg.refusal:
            yield chunk(ChunkChoice(i, Delta(refusal=msg.refusal), None, None))
        for k, call in enumerate(msg.tool_calls or ()):
            fn = FunctionDelta(name=call.function.name, arguments=call.function.arguments)
            yield chunk(ChunkChoice(i, Delta(tool_calls=[ToolCallDelta(k, call.id, "function", fn)]), None, None))
        # Ids of an answer without content (tool calls alone) go with its finish.
        ids = None if msg.content else ch.token_ids
        yield chunk(ChunkChoice(i, Delta(), ch.finish_reason, None, ids, ch.stop_reason))
    if answer.usage is not None:
        yield ChatChunk(id=ident, created=created, model=model, choices=[], usage=answer.usage)


decode_chat = msgspec.json.Decoder(ChatRequest).decode


def decode_chat_request(raw: bytes) -> ChatRequest:
    """`decode_chat` with `decode_request`'s refusals: a body it fails on in a way other than a DecodeError or
    ValidationError becomes a DecodeError too (wire.schema `refused`), so every undecodable body is a 400."""
    try:
        return decode_chat(raw)
    except (UnicodeDecodeError, RecursionError, msgspec.DecodeError) as exc:
        raise refused(exc, raw) from None


__all__ = [
    "CHAT_SHAPES",
    "ChatChoice",
    "ChatChunk",
    "ChatCompletion",
    "ChatFinishReason",
    "ChatLogprobs",
    "ChatMessage",
    "ChatRequest",
    "ChunkChoice",
    "Delta",
    "FunctionDelta",
    "Message",
    "RedactedThinkingBlock",
    "ThinkingBlock",
    "ThinkingBlocks",
    "TokenLogprob",
    "ToolCall",
    "ToolCallDelta",
    "TopLogprob",
    "answer_chunks",
    "bound_conversation",
    "decode_chat",
    "decode_chat_request",
    "render",
    "text_parts",
]
