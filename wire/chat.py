"""Wire types of the chat route: OpenAI's chat request, strict, and the `chat.completion` answer and chunk.

`ChatRequest` is a `CompletionRequest` with `messages` in place of `prompt`, so a chat request travels the
same request path as a completion (keys, routing, limits, budgets, cache, ledger) and adapters read the
same canonical fields. What a chat client may not send (the completion-only fields) is renamed out of the
JSON names, so the decoder refuses it as an unknown field with the same 400 as any other. `prompt` is the
conversation rendered as text (`render`, set by `gateway.path.chat_request.normalize_chat`): what prefix
routing and prompt logging read, and token estimates with `unrendered` (what is sent beside it).

The messages' own structs are wire/messages.py's. Tools, `tool_choice` and `response_format` are checked
against OpenAI's shapes here (`CHAT_SHAPES`), so a bad value is a 400 with its JSON path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

from wire.messages import FunctionName, Message, ThinkingBlocks, ToolCall
from wire.schema import CompletionRequest, PromptItem, StopList, Usage, refused


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
    # The index of the last message when it is an assistant message with tool calls, which no tool message can
    # answer yet (set by normalize_chat); refused where the route's server refuses it (`chat_open_calls_refused`).
    open_calls: int | None = msgspec.field(default=None, name=" open_calls")
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
    "TokenLogprob",
    "ToolCallDelta",
    "TopLogprob",
    "answer_chunks",
    "decode_chat",
    "decode_chat_request",
]
