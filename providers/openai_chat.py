"""OpenAI's chat wire (`POST .../chat/completions`), for every kind whose server speaks it.

A kind takes chat by inheriting `OpenAIChat` and declaring `chat_params` (providers/chat_params.py); a field
without an entry is refused naming the provider, as on completions. Answers are decoded into lenient structs
and written in the one `chat.completion` shape; stream events become `chat.completion.chunk`s one for one.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Annotated, Any, ClassVar, Final, Literal

import msgspec
from msgspec import Meta

from providers import thinking
from providers.base import (
    Adapter,
    CallContext,
    Capabilities,
    Endpoint,
    UpstreamRequest,
    request_headers,
)
from providers.call_cap import MAX_CALLS, room_for_call
from providers.call_ids import made_call_id
from providers.chat_fields import NAMED_ROLES, carried
from providers.chat_logprobs import UpLogprobs, chat_logprobs
from providers.chat_params import CHAT_GUARDED
from providers.envelope import Unreadable
from providers.finish import BROKE_OFF, broke_off, finish_reason, unfinished
from providers.openai_compat import UpEnvelope, UpStopped, UpUsage, usage_from
from providers.tool_results import check_results
from wire.chat import (
    ChatChoice,
    ChatChunk,
    ChatCompletion,
    ChatFinishReason,
    ChatMessage,
    ChatRequest,
    ChunkChoice,
    Delta,
    FunctionDelta,
    ToolCallDelta,
)
from wire.errors import InvalidRequestError, UnsupportedParamError, shown
from wire.messages import FunctionCall, Message, ToolCall
from wire.schema import Completion, Usage


class _UpFunction(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _UpToolCall(msgspec.Struct):
    index: int | None = None
    id: str | None = None
    type: str | None = None
    function: _UpFunction | None = None


class _UpPart(msgspec.Struct):
    """A content chunk: Mistral's reasoning models answer `text` chunks and `thinking` ones holding text chunks."""

    type: str | None = None
    text: str | None = None
    thinking: list[_UpPart] | None = None


def _parts(parts: list[_UpPart], delta: bool) -> tuple[str | None, str | None]:
    """Content chunks as (content, reasoning): a delta of thinking alone has no content, a message has ""."""
    text = "".join(p.text for p in parts if p.type == "text" and p.text)
    thought = "".join(t.text for p in parts if p.thinking for t in p.thinking if t.text)
    return (text or None) if delta else text, thought or None


class _UpMessage(msgspec.Struct):
    role: str | None = None
    content: str | list[_UpPart] | None = None
    refusal: str | None = None
    # Bounded as it is decoded: past the cap the list is refused before it is built (providers/call_cap.py).
    tool_calls: Annotated[list[_UpToolCall], Meta(max_length=MAX_CALLS)] | None = None
    # A reasoning model's thinking: DeepSeek's and vLLM's `reasoning_content`; newer vLLM also (or only) `reasoning`.
    reasoning_content: str | None = None
    reasoning: str | None = None


class _UpChoice(UpStopped):
    index: int = 0
    message: _UpMessage | None = None
    delta: _UpMessage | None = None
    finish_reason: str | None = None
    logprobs: UpLogprobs | float | None = None  # a bare number: a stream chunk's token (chat_logprobs.py)
    token_ids: list[int] | None = None  # vLLM's `return_token_ids` (a stream chunk's own delta)
    prompt_token_ids: list[int] | None = None  # SGLang's `return_token_ids` writes the prompt's ids per choice


class _UpChat(UpEnvelope):
    choices: list[_UpChoice] | None = None
    created: int = 0
    system_fingerprint: str | None = None
    usage: UpUsage | None = None
    prompt_token_ids: list[int] | None = None  # vLLM's `return_token_ids`: the answer's, a stream's first chunk's
    prompt_logprobs: list[dict[str, Any] | None] | None = None  # vLLM's, buffered answers only


_decode_chat = msgspec.json.Decoder(_UpChat).decode


def chat_finish(word: str | None) -> ChatFinishReason | None:
    """A chat finish reason: the tool-call words stay `tool_calls`, the rest fold as on completions."""
    if not word:
        return None
    if word in ("tool_calls", "function_call", "tool_use"):
        return "tool_calls"
    return finish_reason(word)


# The finish words each answer ends with, as `chat_finish` reads them: looked up without a call.
_FINISHED: Final[dict[str, ChatFinishReason | None]] = {
    word: chat_finish(word) for word in ("stop", "length", "tool_calls", "content_filter")
}


def _calls(up: list[_UpToolCall], ctx: CallContext, choice: int) -> list[ToolCall]:
    return [
        ToolCall(
            id=c.id or made_call_id(ctx, choice, k),
            function=FunctionCall(
                name=(c.function.name or "") if c.function else "",
                arguments=(c.function.arguments or "") if c.function else "",
            ),
        )
        for k, c in enumerate(up)
    ]


def _call_deltas(up: list[_UpToolCall], ctx: CallContext, choice: int) -> list[ToolCallDelta]:
    """A chunk's call pieces; a call's first piece carries an id (`made_call_id` where the server sent none or an
    empty one), the pieces after it an id only where the server repeats a non-empty one."""
    started: set[tuple[int, int]] = ctx.state.setdefault("call_started", set())
    out = []
    for i, c in enumerate(up):
        k = c.index if c.index is not None else i
        call_id = c.id or None
        if (choice, k) not in started:
            room_for_call(started)
            started.add((choice, k))
            call_id = call_id or made_call_id(ctx, choice, k)
        out.append(
            ToolCallDelta(
                index=k,
                id=call_id,
                type="function" if c.type is not None or call_id is not None else None,
                function=FunctionDelta(name=c.function.name, arguments=c.function.arguments) if c.function else None,
            )
        )
    return out


class OpenAIChat(Adapter):
    """The chat route of a kind whose server speaks OpenAI's chat wire (module docstring)."""

    chat_route: ClassVar[bool] = True
    # After the base URL: the hosted APIs' base URLs end in `/v1`; self-hosted servers' are their root.
    chat_path: ClassVar[str] = "/chat/completions"
    # Ask every stream for its usage chunk (stripped by the relay when the client did not ask).
    chat_stream_usage: ClassVar[bool] = True
    chat_framing: ClassVar[Literal["sse", "ndjson", "eventstream"]] = "sse"
    # What `inference_extra_params` may not write on the chat route (a kind whose chat body is its native
    # one guards its native paths).
    chat_guarded_paths: ClassVar[frozenset[str]] = CHAT_GUARDED
    # The `response_format` types its chat route takes, natively or through its table's translation into
    # the engine's guided decoding; another is a 400 naming the field and the provider.
    chat_formats: ClassVar[frozenset[str]] = frozenset({"text", "json_object", "json_schema"})
    # Body fields that make the chat route continue a trailing assistant message rather than answer it (a
    # broken stream resumed, docs/resilience.md); None: the route cannot, and such a stream ends in an error.
    chat_continue: ClassVar[Mapping[str, Any] | None] = None
    # The route refuses a continued message that ends in white space: it is sent without it, and the
    # continuation's own leading white space that repeats it is not relayed.
    chat_continue_strips: ClassVar[bool] = False
    # The route's buffered answer to a continued message begins with that message: the gateway takes it off,
    # so that the content is the continuation alone, as every other route's (and the route's own stream) is.
    chat_continue_repeats: ClassVar[bool] = False

    # The roles whose messages carry OpenAI's `name` (who said it) on the route, as its server's schema has
    # them (providers/chat_fields.py). A name on another role is refused by name (`messages.name`) before any
    # call, or left out under `unsupported_params: drop`.
    chat_names: ClassVar[frozenset[str]] = NAMED_ROLES
    # Whether the route reads an assistant message's `refusal` (the field and its content parts): OpenAI's
    # own. Elsewhere the refusal goes as the turn's text.
    chat_refusal: ClassVar[bool] = False
    # The route's server refuses a tool message whose `tool_call_id` answers no call of the nearest assistant
    # message before it with tool calls, a call of that turn left without a tool message before the next
    # assistant message, and two tool messages answering one call: the gateway refuses each first, naming the
    # message (providers/tool_results.py). False: the conversation goes as it is, and the server decides.
    chat_results_paired: ClassVar[bool] = False
    # The route's server also refuses a conversation that ends on the assistant message making the calls (no
    # result can follow yet): refused first as a call left without a tool message. False: it goes as it is.
    chat_open_calls_refused: ClassVar[bool] = False

    # The field an assistant message's `reasoning_content` goes back under, for servers that read the model's
    # earlier thinking (DeepSeek wants it for turns that called tools); None: left out, as strict servers
    # refuse an unknown message field. `thinking_blocks` (Anthropic's signatures) reach no such server.
    chat_reasoning_field: ClassVar[str | None] = None
    # The route reads that thinking as a `thinking` content chunk at the head of the turn (Mistral's shape)
    # instead of a message field.
    chat_reasoning_chunk: ClassVar[bool] = False
    # Where the chat table takes `return_token_ids`: whether the route's streams carry the ids too. False: a
    # streamed request for them is a 400 naming the field (the route would refuse it, or send none).
    chat_token_ids_streamed: ClassVar[bool] = True
    # The finish reasons that say the server gave the generation up (providers/finish.py `BROKE_OFF`), a kind's
    # own word for it included: such a choice fails the attempt instead of reaching the client as finished.
    broke_off_words: ClassVar[frozenset[str]] = BROKE_OFF

    def chat_url(self, endpoint: Endpoint) -> str:
        return endpoint.base_url.rstrip("/") + self.chat_path

    def continues(self, req: ChatRequest) -> bool:
        """Whether this route can continue `req`'s trailing assistant message (a broken stream resumed)."""
        return self.chat_continue is not None

    def build_chat_request(self, req: ChatRequest, endpoint: Endpoint, params: dict[str, Any]) -> UpstreamRequest:
        messages: list[Any] = req.messages
        if self.chat_names is not NAMED_ROLES or not self.chat_refusal:
            messages = carried(messages, self.chat_names, self.chat_refusal)
        body: dict[str, Any] = {
            "model": endpoint.model,
            "messages": self._sent_messages(messages) if req.thinking_back else messages,
        }
        body.update(params)
        if req.stream:
            body["stream"] = True
            if self.chat_stream_usage:
                body["stream_options"] = {"include_usage": True}
        self.add_extra(body, req, self.chat_guarded_paths, "top")
        return UpstreamRequest(
            method="POST",
            url=self.chat_url(endpoint),
            headers=request_headers(req, endpoint, auth=self.auth_headers(endpoint)),
            body=msgspec.json.encode(body),
            stream=bool(req.stream),
        )

    def _sent_messages(self, messages: list[Message]) -> list[Any]:
        """The conversation with the model's earlier thinking as this route reads it, or left out."""
        if self.chat_reasoning_chunk:
            return thinking.chunked_messages(messages)
        return thinking.sent_messages(messages, self.chat_reasoning_field)

    def parse_chat_response(self, body: bytes, ctx: CallContext) -> ChatCompletion:
        up = _decode_chat(body)
        if up.error is not None or up.object == "error":  # `failed`, inline: every answer asks
            raise self.map_error(up.status(), {}, body, "upstream")
        if not up.choices:
            raise Unreadable("a chat completion without choices")
        if up.created:
            ctx.created = up.created
        # No call for what most answers lack (tool calls, logprobs) or say in a word (their finish reason).
        choices = []
        for c in up.choices:
            word = c.finish_reason
            if word in self.broke_off_words:
                raise broke_off(self.kind, word)
            if not word:  # a stream's unfinished choice, in a buffered answer
                raise unfinished(self.kind, c.index)
            m = c.message or _UpMessage()
            content: Any = m.content  # a string, or (tested without a call) a list of chunks
            reasoning = m.reasoning_content if m.reasoning_content is not None else m.reasoning
            if content.__class__ is list:
                content, thought = _parts(content, delta=False)
                reasoning = reasoning if reasoning is not None else thought
            calls = m.tool_calls
            # Positional (role, content, tool_calls, refusal, reasoning_content): keywords cost more.
            message = ChatMessage(
                "assistant", content, _calls(calls, ctx, c.index) if calls else None, m.refusal, reasoning
            )
            lp = None if c.logprobs is None else chat_logprobs(c.logprobs, content, ctx.top_logprobs)
            why = c.stopped_by() if ctx.stop_reason else None
            finish = _FINISHED[word] if word in _FINISHED else chat_finish(word)
            choices.append(ChatChoice(c.index, message, finish, lp, c.token_ids, why))
        usage = usage_from(up.usage) if up.usage is not None else None
        fingerprint = up.system_fingerprint or None
        prompt_ids = up.prompt_token_ids
        if prompt_ids is None and up.choices:
            prompt_ids = up.choices[0].prompt_token_ids  # one conversation: every choice's are the same
        return ChatCompletion(
            ctx.id, ctx.created, ctx.model, choices, fingerprint, usage, prompt_ids, up.prompt_logprobs
        )

    def parse_chat_event(self, event: str | None, data: bytes, ctx: CallContext) -> ChatChunk | None:
        if data == b"[DONE]":
            return None
        up = _decode_chat(data)
        if up.error is not None or up.object == "error":  # `failed`, inline: every event asks
            raise self.map_error(up.status(), {}, data, "upstream")
        if up.choices is None and up.usage is None:
            raise Unreadable("a chat stream event without choices")
        if up.created:
            ctx.created = up.created
        # Runs for every stream event: no call for what most events lack (tool calls, a finish reason, logprobs).
        choices = []
        for c in up.choices or ():
            d = c.delta or _UpMessage()
            calls, word, lp = d.tool_calls, c.finish_reason, c.logprobs
            if word in self.broke_off_words:
                raise broke_off(self.kind, word)
            content: Any = d.content  # runs for every stream event: the list test is an attribute, not a call
            reasoning = d.reasoning_content if d.reasoning_content is not None else d.reasoning
            if content.__class__ is list:
                content, thought = _parts(content, delta=True)
                reasoning = reasoning if reasoning is not None else thought
            delta = Delta(
                "assistant" if d.role else None,
                content,
                _call_deltas(calls, ctx, c.index) if calls else None,
                d.refusal,
                reasoning,
            )
            choices.append(
                ChunkChoice(  # positional: built for every event, where keywords cost more
                    c.index,
                    delta,
                    (_FINISHED[word] if word in _FINISHED else chat_finish(word)) if word else None,
                    None if lp is None else chat_logprobs(lp, content, ctx.top_logprobs),
                    c.token_ids,
                    c.stopped_by() if word and ctx.stop_reason else None,  # said by the finishing chunk
                )
            )
        return ChatChunk(
            ctx.id,
            ctx.created,
            ctx.model,
            choices,
            up.system_fingerprint or None,
            usage_from(up.usage) if up.usage is not None else None,
            up.prompt_token_ids,
        )


def from_completion(answer: Completion) -> ChatCompletion:
    """An in-process provider's completion (the `fake`) as a chat answer: each choice's text is the
    assistant's message."""
    return ChatCompletion(
        id=answer.id,
        created=answer.created,
        model=answer.model,
        choices=[
            ChatChoice(
                index=c.index,
                message=ChatMessage(role="assistant", content=c.text),
                finish_reason=c.finish_reason,
                logprobs=None,
            )
            for c in answer.choices
        ],
        system_fingerprint=answer.system_fingerprint,
        usage=answer.usage,
    )


async def chunks_from(chunks: AsyncGenerator[Completion, None]) -> AsyncGenerator[ChatChunk, None]:
    """An in-process provider's completion stream as chat chunks: the role first, then content deltas."""
    started: set[int] = set()
    try:
        async for c in chunks:
            out = []
            for ch in c.choices:
                role = None
                if ch.index not in started:
                    started.add(ch.index)
                    role = "assistant"
                delta = Delta(role=role, content=ch.text)  # type: ignore[arg-type]
                out.append(ChunkChoice(index=ch.index, delta=delta, finish_reason=ch.finish_reason, logprobs=None))
            yield ChatChunk(
                id=c.id,
                created=c.created,
                model=c.model,
                choices=out,
                system_fingerprint=c.system_fingerprint,
                usage=c.usage,
            )
    finally:
        await chunks.aclose()


def usage_chunk(ctx: CallContext, usage: Usage) -> Completion | ChatChunk:
    """A stream's last chunk, carrying only its usage, in the request's shape."""
    if ctx.chat:
        return ChatChunk(id=ctx.id, created=ctx.created, model=ctx.model, choices=[], usage=usage)
    return ctx.completion([], usage)


def check_chat(adapter: Capabilities, req: ChatRequest, provider: str) -> None:
    """Refuse what the provider cannot honour on chat, before any I/O: more logprobs than it returns, a
    `response_format` type its chat route takes neither natively nor as its guided decoding, a tool message
    its server would refuse as answering no call. (More stop sequences than it takes are cut by the gateway.)"""
    if req.logprobs is not None and req.logprobs > adapter.max_logprobs:
        raise UnsupportedParamError(
            "top_logprobs",
            provider,
            f"Provider '{provider}' returns at most {adapter.max_logprobs} top_logprobs, got {req.logprobs}",
        )
    if req.continue_final_message and isinstance(adapter, OpenAIChat) and not adapter.continues(req):
        raise UnsupportedParamError(
            "continue_final_message",
            provider,
            f"Provider '{provider}' cannot continue an assistant message with what this request asks for",
        )
    if (
        req.stream
        and req.return_token_ids
        and isinstance(adapter, OpenAIChat)
        and not adapter.chat_token_ids_streamed
        and "return_token_ids" in (adapter.chat_params or ())
    ):
        raise UnsupportedParamError(
            "return_token_ids",
            provider,
            f"Provider '{provider}' returns token ids on chat only in an answer that is not streamed",
        )
    count = req.prompt_logprobs  # streamed, refused by normalize_chat whatever the route
    if count is not None and count > adapter.max_logprobs and "prompt_logprobs" in (adapter.chat_params or ()):
        raise UnsupportedParamError(
            "prompt_logprobs",
            provider,
            f"Provider '{provider}' returns at most {adapter.max_logprobs} prompt_logprobs, got {count}",
        )
    # The marks first: the common request has none, and makes no call here.
    if (
        (
            req.unanswered is not None
            or req.unreplied is not None
            or req.repeated is not None
            or req.open_calls is not None
        )
        and isinstance(adapter, OpenAIChat)
        and adapter.chat_results_paired
    ):
        check_results(req, provider, adapter.chat_open_calls_refused)
    rf = req.response_format
    if rf is not None and isinstance(adapter, OpenAIChat) and rf.get("type") not in adapter.chat_formats:
        raise UnsupportedParamError(
            "response_format",
            provider,
            f"Provider '{provider}' takes no 'response_format' of type {shown(str(rf.get('type')))!r} on chat, and "
            "has no guided decoding the gateway could send it as",
        )


def unsupported_endpoint(provider: str, kind: str) -> InvalidRequestError:
    """The 400 for a chat request routed to a kind whose chat API the gateway does not speak yet."""
    return InvalidRequestError(
        f"Provider '{provider}' (kind '{kind}') does not serve /v1/chat/completions through the gateway; "
        "send it to /v1/completions, or route the model to a provider that serves chat",
        param="messages",
        code="unsupported_endpoint",
    )


__all__ = [
    "OpenAIChat",
    "chat_finish",
    "check_chat",
    "chunks_from",
    "from_completion",
    "unsupported_endpoint",
    "usage_chunk",
]
