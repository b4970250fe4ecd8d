"""The OpenAI-compatible family: one adapter base that OpenAI, Azure, Fireworks, Together, vLLM,
DeepSeek, PAIS and SGP extend with a table and a few class attributes.

Upstream bodies are decoded into lenient structs (unknown fields ignored, everything optional) because
these servers disagree in small ways: Together's `text.completion` and `eos`, TGI's empty ids and
empty-string finish reasons, vLLM's extra `stop_reason`, Together's float `logprobs` in stream chunks.
The normalization to the one Completion shape happens here, once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from providers.base import Adapter, CallContext, Endpoint, Param, Table, UpstreamRequest, request_headers, table
from providers.context import context_window
from providers.envelope import Unreadable, envelope_status
from providers.finish import BROKE_OFF, broke_off, finish_reason, unfinished
from providers.offsets import aligned, key_bytes, prompt_for_choice, running_offsets
from providers.quota import openai_counters, single_counter
from providers.retry_after import retry_after, should_retry
from providers.selfhosted import TokenProb, token_probs
from wire.errors import GatewayError, UpstreamError, UpstreamStatusError
from wire.schema import (
    Choice,
    Completion,
    CompletionRequest,
    CompletionTokensDetails,
    Logprobs,
    PromptTokensDetails,
    Usage,
)

# 429 codes that mean "no more until someone pays or a period ends", not "slow down".
QUOTA_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached", "spend_limit_reached"})


class UpLogprobs(msgspec.Struct):
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] | None = None
    text_offset: list[int] | None = None
    # llama-server's /v1/completions answers in the chat shape, `{"content": [{id, token, bytes, logprob,
    # top_logprobs}]}`, never with the fields above (tools/server/server-task.cpp, `to_json_oaicompat`).
    content: list[TokenProb] | None = None


class UpStopped(msgspec.Struct):
    """What stopped a choice, under each engine's name (both always send theirs): vLLM's `stop_reason`, SGLang's
    `matched_stop`. Completion and chat choices carry it alike."""

    stop_reason: int | str | None = None
    matched_stop: int | str | None = None

    def stopped_by(self) -> int | str | None:
        return self.stop_reason if self.stop_reason is not None else self.matched_stop


class UpChoice(UpStopped):
    text: str = ""
    index: int = 0
    logprobs: UpLogprobs | float | None = None
    finish_reason: str | None = None
    # vLLM, when the request asked for `prompt_logprobs`.
    prompt_logprobs: list[dict[str, Any] | None] | None = None
    # vLLM's and SGLang's token-native fields (`return_token_ids`), and what stopped the choice.
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


class UpUsage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int | None = None
    completion_tokens_details: CompletionTokensDetails | None = None
    prompt_tokens_details: PromptTokensDetails | None = None
    # DeepSeek's context cache: the prompt tokens it read from cache, within `prompt_tokens`.
    prompt_cache_hit_tokens: int | None = None


class UpErrorBody(msgspec.Struct):
    message: str | None = None
    type: str | None = None
    param: str | None = None
    code: str | int | None = None


class UpEnvelope(msgspec.Struct):
    """What an answer carries when it is an error after all.

    Some servers report a failure as a `200` carrying only an error object (or mid-stream, as an event):
    `{"error": {...}}`, `{"error": "text", "error_type": ...}`, older vLLM's `{"object": "error", ...}`.
    Any: an odd type in a field only read when the answer is an error must not invalidate an answer."""

    error: UpErrorBody | str | None = None
    error_type: Any = None
    object: Any = None
    type: Any = None
    code: Any = None

    def failed(self) -> bool:
        return self.error is not None or self.object == "error"

    def status(self) -> int:
        """The HTTP status the error's words mean."""
        e = self.error
        if isinstance(e, UpErrorBody):
            return envelope_status(e.code, e.type, self.code)
        return envelope_status(self.code, self.error_type, self.type)


class UpCompletion(UpEnvelope):
    # None: the field is missing, which no answer may be (a usage-only stream chunk sends `[]`).
    choices: list[UpChoice] | None = None
    created: int = 0
    system_fingerprint: str | None = None
    usage: UpUsage | None = None


class UpError(msgspec.Struct):
    # {"error": {...}} (OpenAI, vLLM >= 0.6), {"object": "error", "message": ...} (older vLLM),
    # {"error": "text"} (TGI and others), {"detail": ...} (FastAPI servers such as PAIS and SGP).
    error: UpErrorBody | str | None = None
    message: str | None = None
    detail: Any = None
    code: str | int | None = None


_decode_completion = msgspec.json.Decoder(UpCompletion).decode
_decode_error = msgspec.json.Decoder(UpError).decode


# OpenAI's /v1/completions parameters (openai-python completion_create_params.py).
OPENAI_PARAMS: Table = table(
    max_tokens=Param(),
    temperature=Param(),
    top_p=Param(),
    n=Param(),
    best_of=Param(),
    stop=Param(),
    logprobs=Param(),
    echo=Param(),
    suffix=Param(),
    seed=Param(),
    logit_bias=Param(),
    frequency_penalty=Param(),
    presence_penalty=Param(),
    user=Param(),
)


def json_object_schema(response_format: dict[str, Any]) -> dict[str, Any] | None:
    """The schema of Fireworks' `{"type": "json_object", "schema": S}`, which the engines' own
    `response_format` has no place for (each writes it as its own structured output); else None."""
    schema = response_format.get("schema")
    return schema if response_format.get("type") == "json_object" and isinstance(schema, dict) else None


def usage_from(up: UpUsage) -> Usage:
    total = up.total_tokens if up.total_tokens is not None else up.prompt_tokens + up.completion_tokens
    return Usage(
        prompt_tokens=up.prompt_tokens,
        completion_tokens=up.completion_tokens,
        total_tokens=total,
        completion_tokens_details=up.completion_tokens_details,
        prompt_tokens_details=up.prompt_tokens_details
        if up.prompt_cache_hit_tokens is None or up.prompt_tokens_details is not None
        else PromptTokensDetails(cached_tokens=up.prompt_cache_hit_tokens),
    )


class OpenAICompatible(Adapter):
    path: ClassVar[str] = "/completions"
    params: Table = OPENAI_PARAMS
    # OpenAI's "up to 4 sequences" (also Fireworks' and SGP's seeds; kept where a server documents none):
    # the first 4 are sent, the gateway enforces the rest. Servers without a limit (vLLM) say None.
    max_stop: ClassVar[int | None] = 4
    # Ask for the usage chunk on every stream: the gateway needs it (and strips it if the client did not).
    stream_usage: ClassVar[bool] = True
    # Whether the upstream's `text_offset` counts into prompt + text as OpenAI's does; if not (vLLM counts
    # from the start of the choice's own text), the gateway moves them by the prompt's length (`_absolute`).
    openai_offsets: ClassVar[bool] = True
    quota_headers = (openai_counters, single_counter)
    # OpenAI's names; `max_completion_tokens` is the newer API's name for the same limit.
    guarded_paths = frozenset({"prompt", "max_tokens", "max_completion_tokens", "n", "best_of"})

    def url(self, endpoint: Endpoint) -> str:
        return endpoint.base_url.rstrip("/") + self.path

    def body(self, req: CompletionRequest, endpoint: Endpoint, params: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": endpoint.model, "prompt": req.prompt}
        body.update(params)
        if req.stream:
            body["stream"] = True
            if self.stream_usage:
                body["stream_options"] = {"include_usage": True}
        return body

    def build_request(self, req: CompletionRequest, endpoint: Endpoint, params: dict[str, Any]) -> UpstreamRequest:
        body = self.body(req, endpoint, params)
        self.add_extra(body, req)
        return UpstreamRequest(
            method="POST",
            url=self.url(endpoint),
            headers=request_headers(req, endpoint, auth=self.auth_headers(endpoint)),
            body=msgspec.json.encode(body),
            stream=bool(req.stream),
        )

    def _logprobs(self, up: UpLogprobs | float | None, text: str, index: int, ctx: CallContext) -> Logprobs | None:
        if up is None:
            return None
        if isinstance(up, float):
            # A stream chunk carrying only the sampled token's logprob (Together).
            up = UpLogprobs(tokens=[text], token_logprobs=[up])
        if up.content is not None and not up.tokens:
            if ctx.echo:
                # llama-server does not echo: its logprobs are the completion's alone, which lm-eval would
                # read as the prompt's. Refused rather than answered wrong.
                raise UpstreamError(
                    "The upstream answered logprobs in llama-server's chat shape (`logprobs.content`), which "
                    "cannot carry the echoed prompt's logprobs",
                    code="unsupported_logprobs_shape",
                )
            return token_probs(up.content, ctx, index)
        if ctx.logprobs and not up.tokens and text:
            # Logprobs that were asked for and came in no shape the gateway knows: never an empty list.
            raise Unreadable("logprobs without tokens for a non-empty text")
        aligned(up.tokens, up.token_logprobs, up.top_logprobs)
        offsets = up.text_offset
        if offsets is None or len(offsets) != len(up.tokens):
            # None sent (Together): counted here, from the tokens' bytes.
            start = 0 if ctx.echo else len(prompt_for_choice(ctx.prompts, index, ctx.n))
            offsets = running_offsets(ctx.offsets, ctx.state, index, start, [key_bytes(t) for t in up.tokens])
        elif not self.openai_offsets and not ctx.echo and offsets:
            offsets = self._absolute(offsets, index, ctx)
        return Logprobs(
            tokens=up.tokens,
            token_logprobs=up.token_logprobs,
            top_logprobs=up.top_logprobs,
            text_offset=offsets,
        )

    @staticmethod
    def _absolute(offsets: list[int], index: int, ctx: CallContext) -> list[int]:
        """The server's offsets, moved to count into prompt + text as OpenAI's do.

        vLLM counts a non-echo completion from the start of its own text (its first offset is 0); a server
        that counts as OpenAI does (llama-cpp-python, behind a `vllm` provider) starts at the prompt's
        length. Which one it is shows in a choice's first offset; the server's own counting is kept.
        """
        name = f"shift:{index}"
        shift = ctx.state.get(name)
        if shift is None:
            shift = ctx.state[name] = len(prompt_for_choice(ctx.prompts, index, ctx.n)) if offsets[0] == 0 else 0
        return [o + shift for o in offsets] if shift else offsets

    def _completion(self, up: UpCompletion, ctx: CallContext) -> Completion:
        if up.created:
            # Keep the upstream's time, and make every later chunk (the usage chunk too) carry the same.
            ctx.created = up.created
        # Runs for every stream event: a loop, not a comprehension (a call of its own on Python 3.11), and no
        # call for what most events lack (logprobs, a finish reason).
        choices: list[Choice] = []
        for c in up.choices or ():
            lp, raw = c.logprobs, c.finish_reason
            if raw in BROKE_OFF:
                raise broke_off(self.kind, raw)
            choices.append(
                Choice(
                    text=c.text,
                    index=c.index,
                    logprobs=None if lp is None else self._logprobs(lp, c.text, c.index, ctx),
                    finish_reason=finish_reason(raw) if raw else None,
                    prompt_logprobs=c.prompt_logprobs,
                    token_ids=c.token_ids,
                    prompt_token_ids=c.prompt_token_ids,
                    stop_reason=c.stopped_by() if ctx.stop_reason else None,
                )
            )
        usage = usage_from(up.usage) if up.usage is not None else None
        return ctx.completion(choices, usage, up.system_fingerprint or None)

    def parse_response(self, body: bytes, ctx: CallContext) -> Completion:
        # DeepSeek pads a waiting non-stream response with blank lines; JSON whitespace covers it.
        up = _decode_completion(body)
        if up.error is not None or up.object == "error":
            raise self._envelope(up, body)
        if not up.choices:
            raise Unreadable("a completion without choices")
        for c in up.choices:
            if not c.finish_reason:  # a stream's unfinished choice, in a buffered answer
                raise unfinished(self.kind, c.index)
        return self._completion(up, ctx)

    def parse_event(self, event: str | None, data: bytes, ctx: CallContext) -> Completion | None:
        if data == b"[DONE]":
            return None
        up = _decode_completion(data)
        if up.error is not None or up.object == "error":
            raise self._envelope(up, data)
        if up.choices is None and up.usage is None:
            raise Unreadable("a stream event without choices")
        return self._completion(up, ctx)

    def _envelope(self, up: UpEnvelope, body: bytes) -> GatewayError:
        """An error inside a 200 (answer or stream event), handled as the status its words mean."""
        # The adapter does not know the provider's configured name: the message says "upstream".
        return self.map_error(up.status(), {}, body, "upstream")

    def map_error(self, status: int, headers: Mapping[str, str], body: bytes, provider: str) -> GatewayError:
        message, code, param = _error_fields(body)
        return UpstreamStatusError(
            f"{provider} error ({status}): {message}",
            upstream_status=status,
            provider=provider,
            code=code,
            param=param,
            retry_after=retry_after(headers),
            should_retry=should_retry(headers),
            quota=status == 429 and code in QUOTA_CODES,
            # OpenAI sends the code; vLLM, llama-server and other servers only say it in words.
            context_window=status < 500 and context_window(code, message),
        )


def _error_fields(body: bytes) -> tuple[str, str | None, str | None]:
    try:
        err = _decode_error(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        text = body.decode("utf-8", "replace").strip()
        return (text[:500] or "no error body"), None, None
    code = err.code
    if isinstance(err.error, UpErrorBody):
        e = err.error
        code = e.code if e.code is not None else e.type
        return e.message or "unknown error", (str(code) if code is not None else None), e.param
    if isinstance(err.error, str):
        return err.error, (str(code) if code is not None else None), None
    if err.message:
        return err.message, (str(code) if code is not None else None), None
    if err.detail is not None:
        return str(err.detail)[:500], None, None
    return "unknown error", None, None


__all__ = ["OPENAI_PARAMS", "OpenAICompatible", "UpCompletion", "UpEnvelope", "UpStopped", "usage_from"]
