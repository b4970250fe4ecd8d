"""Anthropic Messages API `POST {base}/v1/messages` as a completions upstream (`x-api-key` auth).

The prompt becomes one user turn; what Anthropic lacks is refused or provided by the gateway (the table
in docs/providers.md). Sources, recordings, stop reasons, error and rate-limit shapes:
docs/provider-notes.md#anthropic.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Final

import msgspec

from providers.anthropic_chat import (
    CHAT_PARAMS,
    SAMPLING,
    block_ended,
    chat_answer,
    chat_chunk,
    chat_delta,
    refuse_two_efforts,
    to_messages,
)
from providers.base import (
    EMULATED_EXTRAS,
    CallContext,
    Endpoint,
    UpstreamRequest,
    out_of_range,
    request_headers,
    table,
)
from providers.chat_fields import NO_NAMES
from providers.chat_params import continuing, guides_checked
from providers.envelope import Unreadable
from providers.finish import finish_reason
from providers.openai_chat import OpenAIChat, chat_finish
from providers.quota import anthropic_counters, anthropic_resets
from providers.retry_after import retry_after, should_retry
from wire.chat import ChatChunk, ChatCompletion, ChatRequest, Delta
from wire.errors import GatewayError, UnsupportedParamError, UpstreamStatusError
from wire.schema import Completion, CompletionRequest, PromptTokensDetails, Usage

DEFAULT_VERSION: Final = "2023-06-01"

# Anthropic requires a limit on every request. 4096 is the largest output every Claude model still
# served accepts (the Claude 3 models cap output at 4096), so the default never earns a 400 on any model;
# it is far above what a chat answer needs (OpenAI's 16 would cut nearly every answer short), and output
# is billed by the tokens actually generated, so a high ceiling costs nothing. It also stays well below
# the sizes for which Anthropic asks for streaming. Override per provider with `default_max_tokens`.
DEFAULT_MAX_TOKENS: Final = 4096

# Anthropic's `error.type` for an error that arrives inside a 200 stream, back to the HTTP status it
# has when it is the response itself (docs.claude.com/en/api/errors).
_ERROR_STATUS: Final[dict[str, int]] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}


class AErrorBody(msgspec.Struct):
    type: str | None = None
    message: str | None = None
    details: dict[str, Any] | None = None


class AContent(msgspec.Struct):
    type: str = ""
    text: str = ""
    thinking: str = ""  # a `thinking` block's text
    signature: str = ""  # a `thinking` block's signature (chat's `thinking_blocks`)
    data: str = ""  # a `redacted_thinking` block's encrypted thinking
    # tool_use blocks
    id: str = ""
    name: str = ""
    input: Any = None


class AUsage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class AMessage(msgspec.Struct):
    # None: no `content` at all, which no answer lacks (an error envelope in a 200 is `type: error`).
    content: list[AContent] | None = None
    stop_reason: str | None = None
    usage: AUsage | None = None
    type: str | None = None
    error: AErrorBody | None = None


class ADelta(msgspec.Struct):
    # content_block_delta: {type: text_delta, text}, {type: thinking_delta, thinking}, {type: signature_delta,
    # signature} or {type: input_json_delta, partial_json}; message_delta: {stop_reason, ...}.
    type: str | None = None
    text: str | None = None
    thinking: str | None = None
    signature: str | None = None
    stop_reason: str | None = None
    partial_json: str | None = None


class AEvent(msgspec.Struct):
    type: str = ""
    index: int | None = None
    content_block: AContent | None = None
    message: AMessage | None = None
    delta: ADelta | None = None
    usage: AUsage | None = None
    error: AErrorBody | None = None


class AError(msgspec.Struct):
    error: AErrorBody | None = None


_decode_message = msgspec.json.Decoder(AMessage).decode
_decode_event = msgspec.json.Decoder(AEvent).decode
_decode_error = msgspec.json.Decoder(AError).decode


def usage_from(u: AUsage) -> Usage:
    """Cache reads and cache writes are prompt tokens too: Anthropic reports them beside input_tokens."""
    cached = u.cache_read_input_tokens or 0
    prompt = (u.input_tokens or 0) + cached + (u.cache_creation_input_tokens or 0)
    completion = u.output_tokens or 0
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached)
        if u.cache_read_input_tokens is not None
        else None,
    )


def _merge(old: AUsage | None, new: AUsage) -> AUsage:
    """`message_delta` usage is cumulative but may omit what `message_start` already said."""
    if old is None:
        return new
    return AUsage(
        input_tokens=new.input_tokens if new.input_tokens is not None else old.input_tokens,
        output_tokens=new.output_tokens if new.output_tokens is not None else old.output_tokens,
        cache_creation_input_tokens=new.cache_creation_input_tokens
        if new.cache_creation_input_tokens is not None
        else old.cache_creation_input_tokens,
        cache_read_input_tokens=new.cache_read_input_tokens
        if new.cache_read_input_tokens is not None
        else old.cache_read_input_tokens,
    )


def reset_hint(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds until the exhausted `anthropic-ratelimit-*` limit resets (RFC 3339 `-reset` headers).

    A 429 does not say which limit it hit; one whose `-remaining` is 0 did. When none says 0, the latest
    reset is the safe wait: every limit has replenished by then.
    """
    resets = anthropic_resets(headers)
    every = [at for at, _ in resets if at is not None]
    chosen = [at for at, exhausted in resets if exhausted and at is not None] or every
    if not chosen:
        return None
    return max(max(chosen) - (time.time() if now is None else now), 0.0)


class AnthropicAdapter(OpenAIChat):
    kind = "anthropic"
    auth = "`x-api-key` + `anthropic-version`"
    default_max_tokens = DEFAULT_MAX_TOKENS
    path: ClassVar[str] = "/v1/messages"
    default_base_url = "https://api.anthropic.com"
    credential_headers = frozenset({"x-api-key"})
    quota_headers = (anthropic_counters,)
    prompt_forms = frozenset({"text"})
    max_logprobs = 0
    guarded_paths = frozenset({"messages", "max_tokens"})
    # `output_config` and `tool_choice` hold what the gateway mapped (`effort`, `disable_parallel_tool_use`):
    # a client's `{"output_config": {"format": ...}}` adds its key beside them instead of dropping them.
    extra_params = "nested"
    params = table({**EMULATED_EXTRAS, **SAMPLING})
    # Chat (`system`, tools as `tool_use` / `tool_result` blocks): providers/anthropic_chat.py.
    chat_path: ClassVar[str] = "/v1/messages"
    chat_names = NO_NAMES  # its messages have no `name`
    chat_results_paired = True  # "unexpected `tool_use_id` found in `tool_result` blocks"
    # Calls as the last message: "`tool_use` ids were found without `tool_result` blocks immediately after".
    chat_open_calls_refused = True
    # A trailing assistant message is a prefill Anthropic continues, refused when it ends in white space.
    chat_continue = MappingProxyType({})
    chat_continue_strips = True
    chat_params = guides_checked({**CHAT_PARAMS, "continue_final_message": continuing(chat_continue)}, params)

    def continues(self, req: ChatRequest) -> bool:
        # Anthropic takes no prefill while the model thinks (extended thinking's "feature compatibility").
        asked = (req.inference_extra_params or {}).get("thinking")
        return not (isinstance(asked, dict) and asked.get("type", "disabled") != "disabled")

    def check(self, req: CompletionRequest, provider: str) -> None:
        super().check(req, provider)
        # The gateway accepts OpenAI's 0-2; Anthropic's range is 0-1, and clamping would change the sampling.
        if req.temperature is not None and req.temperature > 1:
            raise out_of_range(provider, "temperature", req.temperature, 0, 1)

    def auth_headers(self, endpoint: Endpoint) -> dict[str, str]:
        return {"x-api-key": endpoint.api_key} if endpoint.api_key else {}

    def build_request(self, req: CompletionRequest, endpoint: Endpoint, params: dict[str, Any]) -> UpstreamRequest:
        if not isinstance(req.prompt, str):
            raise UnsupportedParamError("prompt", endpoint.provider)
        return self._request(req, endpoint, params, [{"role": "user", "content": req.prompt}], None)

    def build_chat_request(self, req: ChatRequest, endpoint: Endpoint, params: dict[str, Any]) -> UpstreamRequest:
        if req.temperature is not None and req.temperature > 1:
            raise out_of_range(endpoint.provider, "temperature", req.temperature, 0, 1)
        system, messages = to_messages(req.messages)
        return self._request(req, endpoint, params, messages, system)

    def _request(
        self,
        req: CompletionRequest,
        endpoint: Endpoint,
        params: dict[str, Any],
        messages: list[dict[str, Any]],
        system: str | None,
    ) -> UpstreamRequest:
        body: dict[str, Any] = {
            "model": endpoint.model,
            "messages": messages,
            "max_tokens": endpoint.default_max_tokens or DEFAULT_MAX_TOKENS,
        }
        if system:
            body["system"] = system
        body.update(params)
        if req.stream:
            body["stream"] = True
        if req.reasoning_effort is not None and req.inference_extra_params:
            refuse_two_efforts(req.inference_extra_params)
        self.add_extra(body, req)
        # Configured headers (e.g. `anthropic-beta`) and then the client's own; the credential goes last.
        headers = request_headers(
            req,
            endpoint,
            accept="text/event-stream" if req.stream else "application/json",
            extra={"anthropic-version": endpoint.api_version or DEFAULT_VERSION},
            auth=self.auth_headers(endpoint),
        )
        return UpstreamRequest(
            method="POST",
            url=endpoint.base_url.rstrip("/") + self.path,
            headers=headers,
            body=msgspec.json.encode(body),
            stream=bool(req.stream),
        )

    def _message(self, body: bytes) -> tuple[list[AContent], Usage | None, str | None]:
        """An answer's content blocks, usage and stop reason (an error in a 200 raised as its status)."""
        msg = _decode_message(body)
        if msg.type == "error" or msg.error is not None:
            kind_of = msg.error.type if msg.error is not None else None
            raise self.map_error(_ERROR_STATUS.get(kind_of or "", 500), {}, body, self.kind)
        if msg.content is None:
            raise Unreadable("a message without content")
        return msg.content, usage_from(msg.usage) if msg.usage is not None else None, msg.stop_reason

    def _bookkeeping(self, kind: str | None, ev: AEvent, data: bytes, ctx: CallContext) -> str | None:
        """The events both routes read alike: the usage of `message_start` and `message_delta` kept, an
        `error` raised, `message_stop` the stream's end; the stop reason of the last `message_delta`, else None."""
        if kind == "message_stop":
            ctx.ended = True  # carries nothing; nothing of the answer follows it
        elif kind == "message_start":
            if ev.message is not None and ev.message.usage is not None:
                ctx.state["usage"] = ev.message.usage
        elif kind == "message_delta":
            if ev.usage is not None:
                ctx.state["usage"] = _merge(ctx.state.get("usage"), ev.usage)
            if ev.delta is not None and ev.delta.stop_reason:
                return ev.delta.stop_reason
        elif kind == "error":
            kind_of = ev.error.type if ev.error is not None else None
            raise self.map_error(_ERROR_STATUS.get(kind_of or "", 500), {}, data, self.kind)
        return None

    def _usage(self, ctx: CallContext) -> Usage | None:
        usage: AUsage | None = ctx.state.get("usage")
        return usage_from(usage) if usage is not None else None

    def parse_response(self, body: bytes, ctx: CallContext) -> Completion:
        blocks, usage, stop = self._message(body)
        text = "".join(block.text for block in blocks if block.type == "text")
        return ctx.single(text, finish_reason(stop), usage=usage)

    def parse_event(self, event: str | None, data: bytes, ctx: CallContext) -> Completion | None:
        ev = _decode_event(data)
        kind = ev.type or event
        if kind == "content_block_delta":
            d = ev.delta
            # thinking_delta, signature_delta and input_json_delta are not completion text, but the model's work.
            if d is None or d.type != "text_delta" or not d.text:
                ctx.working += 1
                return None
            return ctx.single(d.text, None)
        stop = self._bookkeeping(kind, ev, data, ctx)
        # The last chunk: message_stop that follows carries nothing. Pings, block starts and stops,
        # message_stop and event types added later carry nothing either.
        return ctx.single("", finish_reason(stop), usage=self._usage(ctx)) if stop else None

    def parse_chat_response(self, body: bytes, ctx: CallContext) -> ChatCompletion:
        blocks, usage, stop = self._message(body)
        return chat_answer(blocks, chat_finish(stop), usage, ctx)

    def parse_chat_event(self, event: str | None, data: bytes, ctx: CallContext) -> ChatChunk | None:
        ev = _decode_event(data)
        kind = ev.type or event
        if kind == "content_block_delta" or kind == "content_block_start":
            return chat_delta(ev.index, ev.content_block, ev.delta, ctx)
        if kind == "content_block_stop":
            return block_ended(ev.index, ctx)
        stop = self._bookkeeping(kind, ev, data, ctx)
        if kind == "message_start":
            return chat_chunk(ctx, Delta(role="assistant", content=""))
        return chat_chunk(ctx, Delta(), chat_finish(stop), self._usage(ctx)) if stop else None

    def map_error(self, status: int, headers: Mapping[str, str], body: bytes, provider: str) -> GatewayError:
        message, kind, details = _error_fields(body)
        error_code = details.get("error_code") if details else None
        code = str(error_code) if error_code else kind
        hint = retry_after(headers)
        if hint is None and status == 429:
            hint = reset_hint(headers)
        lowered = message.lower()
        return UpstreamStatusError(
            f"{provider} error ({status}): {message}",
            upstream_status=status,
            provider=provider,
            code=code,
            retry_after=hint,
            should_retry=should_retry(headers),
            # A spend limit lasts until the month (or a payment) changes; retrying cannot help.
            quota=(status == 429 and error_code == "enforced_spend_limit_reached")
            or status == 402
            or kind == "billing_error",
            # "prompt is too long: 205000 tokens > 200000 maximum"; "input length and `max_tokens`
            # exceed context limit: ..." (both invalid_request_error 400s).
            context_window=status == 400 and ("prompt is too long" in lowered or "exceed context limit" in lowered),
        )


def _error_fields(body: bytes) -> tuple[str, str | None, dict[str, Any] | None]:
    try:
        err = _decode_error(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        text = body.decode("utf-8", "replace").strip()
        return (text[:500] or "no error body"), None, None
    if err.error is None:
        text = body.decode("utf-8", "replace").strip()
        return (text[:500] or "no error body"), None, None
    e = err.error
    return e.message or "unknown error", e.type, e.details


__all__ = ["DEFAULT_MAX_TOKENS", "AnthropicAdapter", "reset_hint", "usage_from"]
