"""Cohere v2 Chat `POST {base}/v2/chat` as a completions upstream (Bearer auth).

Usage is `usage.billed_units` (what the client sent and got), `usage.tokens` only as a fallback. Sources,
the unverified stream shape, error bodies and why logprobs are refused: docs/provider-notes.md#cohere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Final

import msgspec

from providers.base import (
    EMULATED,
    EMULATED_EXTRAS,
    CallContext,
    Endpoint,
    Param,
    UpstreamRequest,
    bearer,
    out_of_range,
    request_headers,
    stop_list,
    table,
)
from providers.chat_fields import NO_NAMES
from providers.chat_params import ToolsParam, guides_checked
from providers.cohere_chat import chat_answer, chat_end, chat_event, response_format, to_messages, tool_choice, tools
from providers.finish import finish_reason
from providers.openai_chat import OpenAIChat
from providers.retry_after import retry_after, should_retry
from wire.chat import ChatChunk, ChatCompletion, ChatRequest
from wire.errors import GatewayError, UnsupportedParamError, UpstreamStatusError
from wire.schema import Completion, CompletionRequest, FinishReason, PromptTokensDetails, Usage

# Finish reasons that mean the generation failed, as the status the failure would have had as a response:
# a failed generation may come back on another attempt; a timed-out one is a timeout.
_FAILED: Final[dict[str, int]] = {"ERROR": 500, "TIMEOUT": 504}


def _k(value: int) -> int:
    # The gateway's -1 means "consider every token"; Cohere says that with k=0 ("k-sampling is disabled").
    return 0 if value < 0 else value


class CContent(msgspec.Struct):
    type: str = ""
    text: str = ""
    thinking: str = ""  # a `thinking` item's (chat's reasoning_content)


class CFunction(msgspec.Struct):
    name: str = ""
    arguments: str = ""


class CToolCall(msgspec.Struct):
    id: str | None = None
    function: CFunction | None = None


class CMessage(msgspec.Struct):
    content: list[CContent] = []
    tool_calls: list[CToolCall] | None = None  # chat's (providers/cohere_chat.py)


class CTokens(msgspec.Struct):
    # Integers on the wire; the SDK types them as floats.
    input_tokens: float | None = None
    output_tokens: float | None = None


class CUsage(msgspec.Struct):
    billed_units: CTokens | None = None
    tokens: CTokens | None = None
    cached_tokens: float | None = None


class CResponse(msgspec.Struct):
    # Required, as Cohere's API definition has it for the v2 chat response: a body without one is not Cohere's
    # answer (a base URL that reaches another server), rather than an empty answer to serve, cache and bill.
    finish_reason: str
    message: CMessage | None = None
    usage: CUsage | None = None


class CDeltaMessage(msgspec.Struct):
    # `{text}` or `{thinking}` in content-delta. Other events put other things under `delta.message`
    # (role, tool calls, citations), and the SDK allows extra fields everywhere: stay shape-agnostic.
    content: Any = None
    tool_calls: Any = None


class CDelta(msgspec.Struct):
    message: CDeltaMessage | None = None
    finish_reason: str | None = None
    usage: CUsage | None = None
    error: str | None = None


class CEvent(msgspec.Struct):
    type: str = ""
    index: int | None = None
    delta: CDelta | None = None


class CError(msgspec.Struct):
    message: str | None = None


_decode_response = msgspec.json.Decoder(CResponse).decode
_decode_event = msgspec.json.Decoder(CEvent).decode
_decode_error = msgspec.json.Decoder(CError).decode


def usage_from(u: CUsage) -> Usage | None:
    billed, seen = u.billed_units, u.tokens

    def pick(field: str) -> int | None:
        for source in (billed, seen):
            value = getattr(source, field) if source is not None else None
            if value is not None:
                return int(value)
        return None

    prompt, completion = pick("input_tokens"), pick("output_tokens")
    if prompt is None and completion is None:
        return None
    prompt, completion = prompt or 0, completion or 0
    cached = PromptTokensDetails(cached_tokens=int(u.cached_tokens)) if u.cached_tokens is not None else None
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=cached,
    )


# Cohere's documented ranges where they are narrower than the gateway's (OpenAI's) own.
_RANGES: Final[tuple[tuple[str, float, float], ...]] = (
    ("frequency_penalty", 0.0, 1.0),
    ("presence_penalty", 0.0, 1.0),
    ("top_p", 0.01, 0.99),
    ("top_k", -1, 500),
)


# Cohere's sampling fields, the same on both routes.
SAMPLING: Final = table(
    max_tokens=Param(),
    temperature=Param(),
    top_p=Param(to="p"),
    top_k=Param(to="k", convert=_k),
    seed=Param(),
    frequency_penalty=Param(),
    presence_penalty=Param(),
    stop=Param(to="stop_sequences", convert=stop_list),
)


class CohereAdapter(OpenAIChat):
    kind = "cohere"
    path: ClassVar[str] = "/v2/chat"
    default_base_url = "https://api.cohere.com"
    prompt_forms = frozenset({"text"})
    max_stop = 5
    max_logprobs = 0
    guarded_paths = frozenset({"messages", "max_tokens"})
    params = table({**EMULATED_EXTRAS, **SAMPLING})
    # Chat (v2 messages, tools, `response_format`): providers/cohere_chat.py.
    chat_path: ClassVar[str] = "/v2/chat"
    chat_names = NO_NAMES  # its messages have no `name`
    chat_params = guides_checked(
        table(
            SAMPLING,
            n=EMULATED,  # /v2/chat answers one message: one call per choice (gateway/emulation/chat.py)
            tools=ToolsParam(apply=tools, strict="all"),  # `strict_tools`, one flag for the request
            tool_choice=Param(apply=tool_choice),
            response_format=Param(apply=response_format),
        ),
        params,
    )

    def check(self, req: CompletionRequest, provider: str) -> None:
        super().check(req, provider)
        self._ranges(req, provider)

    def _ranges(self, req: CompletionRequest, provider: str) -> None:
        # Refused rather than clamped: a clamped value would silently change the sampling asked for.
        for field, low, high in _RANGES:
            value = getattr(req, field)
            if value is not None and not low <= value <= high:
                raise out_of_range(provider, field, value, low, high)

    def build_request(self, req: CompletionRequest, endpoint: Endpoint, params: dict[str, Any]) -> UpstreamRequest:
        if not isinstance(req.prompt, str):
            raise UnsupportedParamError("prompt", endpoint.provider)
        return self._request(req, endpoint, params, [{"role": "user", "content": req.prompt}])

    def build_chat_request(self, req: ChatRequest, endpoint: Endpoint, params: dict[str, Any]) -> UpstreamRequest:
        self._ranges(req, endpoint.provider)
        return self._request(req, endpoint, params, to_messages(req.messages))

    def _request(
        self, req: CompletionRequest, endpoint: Endpoint, params: dict[str, Any], messages: list[dict[str, Any]]
    ) -> UpstreamRequest:
        body: dict[str, Any] = {"model": endpoint.model, "messages": messages}
        body.update(params)
        if req.stream:
            body["stream"] = True
        self.add_extra(body, req)
        headers = request_headers(
            req, endpoint, accept="text/event-stream" if req.stream else "application/json", auth=bearer(endpoint)
        )
        return UpstreamRequest(
            method="POST",
            url=endpoint.base_url.rstrip("/") + self.path,
            headers=headers,
            body=msgspec.json.encode(body),
            stream=bool(req.stream),
        )

    def _finish(self, raw: str | None, error: str | None) -> FinishReason | None:
        failed = _FAILED.get(raw or "")
        if failed is not None:
            detail = error or f"the generation ended with finish_reason {raw}"
            raise UpstreamStatusError(
                f"{self.kind} error ({failed}): {detail}", upstream_status=failed, provider=self.kind, code=raw
            )
        return finish_reason(raw)

    def parse_response(self, body: bytes, ctx: CallContext) -> Completion:
        resp = _decode_response(body)
        finish = self._finish(resp.finish_reason, None)
        content = resp.message.content if resp.message is not None else []
        # Reasoning models add `thinking` items; only text is the completion.
        text = "".join(item.text for item in content if item.type == "text")
        return ctx.single(text, finish, usage=usage_from(resp.usage) if resp.usage is not None else None)

    def parse_event(self, event: str | None, data: bytes, ctx: CallContext) -> Completion | None:
        if data == b"[DONE]":
            # Not documented for Cohere; the SDK skips it, so a proxy in between may add it.
            return None
        ev = _decode_event(data)
        kind = ev.type or event
        d = ev.delta
        if kind == "content-delta":
            content = d.message.content if d is not None and d.message is not None else None
            text = content.get("text") if isinstance(content, dict) else None
            # A reasoning model's `thinking` deltas have no text, but are its work.
            if not isinstance(text, str) or not text:
                ctx.working += 1
                return None
            return ctx.single(text, None)
        if kind == "message-end":
            ctx.ended = True  # "the final event" (docs.cohere.com/v2/docs/streaming)
            if d is None:
                return None
            finish = self._finish(d.finish_reason, d.error)
            usage = usage_from(d.usage) if d.usage is not None else None
            return ctx.single("", finish, usage=usage)
        # message-start, content-start/-end, tool-*, citation-*, debug.
        return None

    def parse_chat_response(self, body: bytes, ctx: CallContext) -> ChatCompletion:
        resp = _decode_response(body)
        self._finish(resp.finish_reason, None)  # a failed generation raised as its status
        usage = usage_from(resp.usage) if resp.usage is not None else None
        return chat_answer(resp.message, resp.finish_reason, usage, ctx)

    def parse_chat_event(self, event: str | None, data: bytes, ctx: CallContext) -> ChatChunk | None:
        if data == b"[DONE]":
            return None
        ev = _decode_event(data)
        kind = ev.type or event
        d = ev.delta
        if kind == "message-end":
            ctx.ended = True
            if d is None:
                return None
            self._finish(d.finish_reason, d.error)
            return chat_end(d.finish_reason, usage_from(d.usage) if d.usage is not None else None, ctx)
        message = d.message if d is not None else None
        fields = {"content": message.content, "tool_calls": message.tool_calls} if message is not None else None
        return chat_event(kind, ev.index, fields, ctx)

    def map_error(self, status: int, headers: Mapping[str, str], body: bytes, provider: str) -> GatewayError:
        message = _error_message(body)
        lowered = message.lower()
        return UpstreamStatusError(
            f"{provider} error ({status}): {message}",
            upstream_status=status,
            provider=provider,
            retry_after=retry_after(headers),
            should_retry=should_retry(headers),
            # 402: payment needed. A trial key's monthly call limit is a 429 that waiting minutes cannot lift.
            quota=status == 402 or (status == 429 and "month" in lowered),
            context_window=status == 400
            and ("tokens in the prompt cannot exceed" in lowered or "size limit exceeded" in lowered),
        )


def _error_message(body: bytes) -> str:
    try:
        err = _decode_error(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        err = CError()
    if err.message:
        return err.message
    text = body.decode("utf-8", "replace").strip()
    return text[:500] or "no error body"


__all__ = ["CohereAdapter", "usage_from"]
