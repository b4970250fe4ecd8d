"""Ollama native API: `POST {base}/api/generate`, NDJSON when streaming.

Calls are `raw: true` (a pure continuation, no chat template) except with a suffix, which needs the
model's template. Sources, recordings and response/error shapes: docs/provider-notes.md#ollama.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import msgspec

from providers.base import (
    EMULATED,
    CallContext,
    Endpoint,
    Param,
    UpstreamRequest,
    bearer,
    request_headers,
    table,
)
from providers.chat_fields import NO_NAMES
from providers.chat_params import chat_table
from providers.finish import finish_reason
from providers.offsets import key_bytes, token_key
from providers.openai_chat import OpenAIChat
from providers.retry_after import retry_after, should_retry
from providers.selfhosted import logprobs, raw_bytes, response_schema, top_dict, usage
from wire.errors import GatewayError, InvalidRequestError, UpstreamStatusError
from wire.schema import Completion, CompletionRequest, Logprobs


def _set_format(body: dict[str, Any], value: str | dict[str, Any]) -> None:
    if "format" in body:
        raise InvalidRequestError(
            "only one structured-output constraint may be set for provider kind 'ollama'",
            param="response_format",
            code="invalid_value",
        )
    body["format"] = value


def _guided_json(body: dict[str, Any], schema: dict[str, Any]) -> None:
    _set_format(body, schema)


def _response_format(body: dict[str, Any], value: dict[str, Any]) -> None:
    wants_json, schema = response_schema(value)
    if wants_json:
        _set_format(body, schema if schema is not None else "json")


def _logprobs(body: dict[str, Any], count: int) -> None:
    body["logprobs"] = True
    body["top_logprobs"] = count


class OllamaTop(msgspec.Struct):
    """api/types.go `TokenLogprob`: a token that is part of a character has a `token` JSON cannot hold (Go writes
    it as U+FFFD), and all of its bytes in `bytes`."""

    token: str = ""
    logprob: float | None = None
    raw: list[int] | None = msgspec.field(default=None, name="bytes")

    def key(self) -> str:
        return token_key(self.token, raw_bytes(self.raw))


class OllamaLogprob(OllamaTop):
    top_logprobs: list[OllamaTop] | None = None


class OllamaChunk(msgspec.Struct):
    response: str = ""
    done: bool = False
    done_reason: str | None = None
    prompt_eval_count: int = 0
    eval_count: int = 0
    logprobs: list[OllamaLogprob] | None = None
    # A failure after the stream started arrives as a line carrying only this.
    error: str | None = None


class OllamaOpenAIError(msgspec.Struct):
    message: str | None = None


class OllamaError(msgspec.Struct):
    # The native API's errors are `{"error": "..."}`; its OpenAI route's (where chat goes) are OpenAI's
    # envelope, `{"error": {"message", "type", ...}}` (ollama/ollama openai/openai.go, NewError).
    error: str | OllamaOpenAIError | None = None


_decode_chunk = msgspec.json.Decoder(OllamaChunk).decode
_decode_error = msgspec.json.Decoder(OllamaError).decode


class OllamaAdapter(OpenAIChat):
    kind = "ollama"
    extra_params = "deep"  # options
    guarded_paths = frozenset({"prompt", "options.num_predict"})
    model_listing = ("/api/tags", True)
    serves_replicas = True
    auth = "`Authorization: Bearer` when api_key is set"
    path: ClassVar[str] = "/api/generate"
    framing: ClassVar[Literal["sse", "ndjson"]] = "ndjson"
    default_base_url = "http://127.0.0.1:11434"
    needs_api_key = False
    max_logprobs = 20
    prompt_forms = frozenset({"text"})
    params = table(
        max_tokens=Param("options.num_predict"),
        temperature=Param("options.temperature"),
        top_p=Param("options.top_p"),
        top_k=Param("options.top_k"),
        presence_penalty=Param("options.presence_penalty"),
        frequency_penalty=Param("options.frequency_penalty"),
        seed=Param("options.seed"),
        stop=Param("options.stop"),
        # api/types.go Options; its `repeat_penalty` is the same multiplier as vLLM's repetition_penalty.
        min_p=Param("options.min_p"),
        typical_p=Param("options.typical_p"),
        repetition_penalty=Param("options.repeat_penalty"),
        repeat_last_n=Param("options.repeat_last_n"),
        num_ctx=Param("options.num_ctx"),
        logprobs=Param(apply=_logprobs),
        suffix=Param(),
        guided_json=Param(apply=_guided_json),
        response_format=Param(apply=_response_format),
        n=EMULATED,
        best_of=EMULATED,
        echo=EMULATED,
        include_stop_str_in_output=EMULATED,
        guided_regex=EMULATED,
        guided_choice=EMULATED,
        guided_grammar=EMULATED,
    )
    # Its OpenAI-compatible chat route (docs/openai.md of ollama/ollama): no `n`, `logit_bias`, `logprobs`
    # or `tool_choice`; `options` is not read there.
    chat_path: ClassVar[str] = "/v1/chat/completions"
    # Its OpenAI route answers a model's thinking as `reasoning` and reads an assistant message's `reasoning`
    # back into the turn's thinking (openai/openai.go's Message).
    chat_reasoning_field = "reasoning"
    # Its OpenAI route reads a message's `name` only on a tool message, as the tool's name; on another role it
    # is dropped unread (openai/openai.go, FromChatRequest). A `refusal` part is "invalid message format".
    chat_names = NO_NAMES
    chat_params = chat_table(
        params, native=False, drop=("n", "logit_bias", "logprobs", "user", "tool_choice", "parallel_tool_calls")
    )

    def build_request(self, req: CompletionRequest, endpoint: Endpoint, body: dict[str, Any]) -> UpstreamRequest:
        out: dict[str, Any] = {
            "model": endpoint.model,
            "prompt": req.prompt,
            "raw": not req.suffix,
            "stream": bool(req.stream),
            **body,
        }
        if req.max_tokens is None and endpoint.default_max_tokens is not None:
            out.setdefault("options", {})["num_predict"] = endpoint.default_max_tokens
        self.add_extra(out, req)
        return UpstreamRequest(
            method="POST",
            url=endpoint.base_url.rstrip("/") + self.path,
            headers=request_headers(
                req,
                endpoint,
                accept="application/x-ndjson" if req.stream else "application/json",
                auth=bearer(endpoint),
            ),
            body=msgspec.json.encode(out),
            stream=bool(req.stream),
        )

    def _completion(self, up: OllamaChunk, ctx: CallContext) -> Completion:
        lp: Logprobs | None = None
        if up.logprobs is not None:
            entries = up.logprobs
            # Alternatives come only with top_logprobs > 0; logprobs: 0 is the sampled tokens alone.
            tops = (
                [top_dict([(t.key(), t.logprob) for t in e.top_logprobs or []]) for e in entries]
                if any(e.top_logprobs for e in entries)
                else None
            )
            # Named, and offsets counted, by their bytes where sent (a character split over tokens counts once).
            names = [e.key() for e in entries]
            raws = [raw_bytes(e.raw) or key_bytes(name) for e, name in zip(entries, names, strict=True)]
            lp = logprobs(names, [e.logprob for e in entries], tops, ctx, raws=raws)
        return ctx.single(
            up.response,
            # Ollama before done_reason (2024) only ever stopped by itself or at num_predict.
            finish_reason(up.done_reason or "stop") if up.done else None,
            lp,
            usage(up.prompt_eval_count, up.eval_count) if up.done else None,
        )

    def parse_response(self, body: bytes, ctx: CallContext) -> Completion:
        up = _decode_chunk(body)
        if up.error is not None:
            raise self.map_error(500, {}, body, self.kind)
        return self._completion(up, ctx)

    def parse_event(self, event: str | None, data: bytes, ctx: CallContext) -> Completion | None:
        up = _decode_chunk(data)
        if up.error is not None:
            raise self.map_error(500, {}, data, self.kind)
        if up.done:
            ctx.ended = True  # the last line, with the finish reason and the counts: nothing follows it
        return self._completion(up, ctx)

    def map_error(self, status: int, headers: Mapping[str, str], body: bytes, provider: str) -> GatewayError:
        try:
            error = _decode_error(body).error
            message = (error.message if isinstance(error, OllamaOpenAIError) else error) or "unknown error"
        except (msgspec.DecodeError, msgspec.ValidationError):
            message = body.decode("utf-8", "replace").strip()[:500] or "no error body"
        return UpstreamStatusError(
            f"{provider} error ({status}): {message}",
            upstream_status=status,
            provider=provider,
            # /api/generate answers 404 only for a model it does not have ("model 'x' not found").
            code="model_not_found" if status == 404 else None,
            retry_after=retry_after(headers),
            should_retry=should_retry(headers),
        )


__all__ = ["OllamaAdapter"]
