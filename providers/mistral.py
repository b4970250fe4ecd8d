"""Mistral: chat `POST {base}/v1/chat/completions`, and FIM `POST {base}/v1/fim/completions` when `suffix` is set.

Guided JSON asks for `response_format: json_schema` with `strict: true`, which makes the schema binding.
Sources, recordings, the unverified FIM answer shape and error bodies: docs/provider-notes.md#mistral.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Final

import msgspec

from providers.base import (
    EMULATED,
    CallContext,
    Endpoint,
    Param,
    Table,
    UpstreamRequest,
    bearer,
    request_headers,
    table,
)
from providers.chat_fields import NO_NAMES
from providers.chat_params import chat_table
from providers.envelope import Unreadable, envelope_status
from providers.finish import BROKE_OFF, broke_off, finish_reason, unfinished
from providers.openai_chat import OpenAIChat
from providers.quota import mistral_windows
from providers.retry_after import retry_after, should_retry
from wire.errors import GatewayError, InvalidRequestError, UnsupportedParamError, UpstreamStatusError, shown
from wire.schema import Choice, Completion, CompletionRequest, PromptTokensDetails, Usage

CHAT_PATH: Final = "/v1/chat/completions"
FIM_PATH: Final = "/v1/fim/completions"

# Fields the chat endpoint takes and FIMCompletionRequest does not.
FIM_REFUSED: Final = ("n", "presence_penalty", "frequency_penalty", "response_format", "guided_json")

# The rate-limit buckets Mistral reports on every response (recorded headers) and how long each one's
# window is: with no Retry-After, an exhausted bucket refills within its window at the latest.
WINDOWS: Final[dict[str, float | None]] = {"req-10-second": 10.0, "tokens-minute": 60.0, "tokens-month": None}


class RateLimit(msgspec.Struct, frozen=True):
    limit: int | None
    remaining: int | None


def rate_limits(headers: Mapping[str, str]) -> dict[str, RateLimit]:
    """The `x-ratelimit-{limit,remaining}-<bucket>` pairs present in lower-cased response headers."""
    out: dict[str, RateLimit] = {}
    for bucket in WINDOWS:
        limit = _int(headers.get(f"x-ratelimit-limit-{bucket}"))
        remaining = _int(headers.get(f"x-ratelimit-remaining-{bucket}"))
        if limit is not None or remaining is not None:
            out[bucket] = RateLimit(limit=limit, remaining=remaining)
    return out


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        return None


# --------------------------------------------------------------------------------------------------
# Upstream shapes (lenient)


class MChunk(msgspec.Struct):
    type: str | None = None
    text: str | None = None


class MMessage(msgspec.Struct):
    # A string, or content chunks (reasoning models interleave `thinking` chunks with `text` ones).
    content: str | list[MChunk] | None = None


class MChoice(msgspec.Struct):
    index: int = 0
    message: MMessage | None = None
    delta: MMessage | None = None
    finish_reason: str | None = None


class MUsage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int | None = None
    # OpenAI-style cache accounting; parsed when present, not seen in a recording.
    prompt_tokens_details: PromptTokensDetails | None = None


class MCompletion(msgspec.Struct):
    created: int = 0
    # None: no `choices` at all, which no answer lacks.
    choices: list[MChoice] | None = None
    usage: MUsage | None = None
    # An error envelope inside a 200: `{"object": "error", "message", "type", "code"}`.
    # Any: an odd type in a field only read when the answer is an error must not invalidate an answer.
    object: Any = None
    type: Any = None
    code: Any = None
    # `"p"` (stream padding) and everything else are ignored by the lenient decode.


class MError(msgspec.Struct):
    message: Any = None
    type: str | None = None
    param: str | None = None
    code: str | int | None = None
    detail: Any = None


_decode = msgspec.json.Decoder(MCompletion).decode
_decode_error = msgspec.json.Decoder(MError).decode


# --------------------------------------------------------------------------------------------------
# Request translation


def _schema_format(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": True}}


def _response_format(body: dict[str, Any], value: dict[str, Any]) -> None:
    kind = value.get("type")
    if kind == "json_object":
        # Fireworks' form carries the schema inline: {"type": "json_object", "schema": {...}}.
        schema = value.get("schema")
        body["response_format"] = {"type": "json_object"} if schema is None else _schema_format(schema)
    elif kind in ("text", "json_schema"):
        # Mistral's own shapes (the OpenAI ones): passed as given.
        body["response_format"] = value
    else:
        raise InvalidRequestError(
            f"'response_format' type {shown(repr(kind))} is not supported by Mistral (text, json_object, json_schema)",
            param="response_format",
            code="unsupported_parameter",
        )


def _guided_json(body: dict[str, Any], schema: dict[str, Any]) -> None:
    body["response_format"] = _schema_format(schema)


MISTRAL_PARAMS: Table = table(
    max_tokens=Param(),
    temperature=Param(),
    top_p=Param(),
    stop=Param(),
    seed=Param(to="random_seed"),
    presence_penalty=Param(),
    frequency_penalty=Param(),
    n=Param(),
    # Its presence switches the call to FIM (`build_request`).
    suffix=Param(),
    response_format=Param(apply=_response_format),
    guided_json=Param(apply=_guided_json),
    guided_regex=EMULATED,
    guided_choice=EMULATED,
    guided_grammar=EMULATED,
    echo=EMULATED,
    best_of=EMULATED,
    include_stop_str_in_output=EMULATED,
)


def _content(m: MMessage | None) -> str:
    if m is None or m.content is None:
        return ""
    if isinstance(m.content, str):
        return m.content
    return "".join(c.text for c in m.content if c.type in (None, "text") and c.text is not None)


def _usage(up: MUsage) -> Usage:
    total = up.total_tokens if up.total_tokens is not None else up.prompt_tokens + up.completion_tokens
    return Usage(
        prompt_tokens=up.prompt_tokens,
        completion_tokens=up.completion_tokens,
        total_tokens=total,
        prompt_tokens_details=up.prompt_tokens_details,
    )


class MistralAdapter(OpenAIChat):
    kind = "mistral"
    genai_provider = "mistral_ai"
    default_base_url = "https://api.mistral.ai"
    model_listing = ("/v1/models", False)
    quota_headers = (mistral_windows,)
    path: ClassVar[str] = f"{CHAT_PATH} (with suffix: {FIM_PATH})"
    params: Table = MISTRAL_PARAMS
    chat_path: ClassVar[str] = CHAT_PATH
    # Mistral sends usage on its last chunk and documents no `stream_options`.
    chat_stream_usage: ClassVar[bool] = False
    chat_params = chat_table(MISTRAL_PARAMS, seed=Param(to="random_seed"))
    # Its system, user and assistant messages have no `name` (client-python `models/usermessage.py`,
    # `assistantmessage.py`; a tool message's names the function), and it answers 422 "Extra inputs are
    # not permitted" to any field its schema lacks, `refusal` among them.
    chat_names = NO_NAMES
    chat_results_paired = True  # "Unexpected tool call id ... in tool results"
    # "Expected last role User or Tool (or Assistant with prefix True) for serving but got assistant"
    chat_open_calls_refused = True
    # Its reasoning models read their earlier thinking as a `thinking` chunk of the assistant turn's content
    # (the SDK's multi-turn reasoning example: dropping it degrades the answers).
    chat_reasoning_chunk: ClassVar[bool] = True
    # Mistral's `error` finish reason (client-python `ChatCompletionChoice`): the generation broke off, on the
    # chat route as on completions.
    broke_off_words: ClassVar[frozenset[str]] = BROKE_OFF | {"error"}
    # Chat (`messages`) or FIM (`prompt`), as the request has a suffix or not.
    guarded_paths = frozenset({"messages", "prompt", "max_tokens", "n"})
    # One user turn (or one FIM prompt) per call: the gateway fans out prompt lists.
    prompt_forms = frozenset({"text"})

    def build_request(self, req: CompletionRequest, endpoint: Endpoint, params: dict[str, Any]) -> UpstreamRequest:
        fim = req.suffix is not None
        body: dict[str, Any] = {"model": endpoint.model}
        if fim:
            for name in FIM_REFUSED:
                value = getattr(req, name)
                # n=1 is FIM's only behaviour anyway; anything else cannot be honoured there.
                if value is not None and not (name == "n" and value == 1):
                    raise UnsupportedParamError(
                        name,
                        endpoint.provider,
                        f"Parameter '{name}' is not supported by provider '{endpoint.provider}' "
                        "together with 'suffix' (Mistral FIM completions)",
                    )
            params = {k: v for k, v in params.items() if k != "n"}
            body["prompt"] = req.prompt
        else:
            body["messages"] = [{"role": "user", "content": req.prompt}]
        body.update(params)
        if req.stream:
            # Mistral always puts usage on the finish chunk and documents no stream_options.
            body["stream"] = True
        self.add_extra(body, req)
        headers = request_headers(
            req, endpoint, accept="text/event-stream" if req.stream else "application/json", auth=bearer(endpoint)
        )
        return UpstreamRequest(
            method="POST",
            url=endpoint.base_url.rstrip("/") + (FIM_PATH if fim else CHAT_PATH),
            headers=headers,
            body=msgspec.json.encode(body),
            stream=bool(req.stream),
        )

    def _choice(self, c: MChoice, text: str) -> Choice:
        if c.finish_reason in self.broke_off_words:
            # The generation broke off upstream: its partial text must not reach the client as finished.
            raise broke_off(self.kind, c.finish_reason)
        return Choice(text=text, index=c.index, logprobs=None, finish_reason=finish_reason(c.finish_reason))

    def _created(self, up: MCompletion, ctx: CallContext) -> int:
        if up.created:
            # Keep the upstream's time, and make every later chunk carry the same.
            ctx.created = up.created
        return ctx.created

    def parse_response(self, body: bytes, ctx: CallContext) -> Completion:
        up = _decode(body)
        if up.object == "error":
            raise self.map_error(envelope_status(up.code, up.type), {}, body, self.kind)
        if not up.choices:
            raise Unreadable("a completion without choices")
        for c in up.choices:
            if not c.finish_reason:  # as providers/openai_compat.py: a choice whose generation did not end
                raise unfinished(self.kind, c.index)
        return Completion(
            id=ctx.id,
            created=self._created(up, ctx),
            model=ctx.model,
            choices=[self._choice(c, _content(c.message)) for c in up.choices],
            usage=_usage(up.usage) if up.usage is not None else None,
        )

    def parse_event(self, event: str | None, data: bytes, ctx: CallContext) -> Completion | None:
        if data == b"[DONE]":
            return None
        up = _decode(data)
        if up.object == "error":
            raise self.map_error(envelope_status(up.code, up.type), {}, data, self.kind)
        choices = [self._choice(c, _content(c.delta if c.delta is not None else c.message)) for c in up.choices or ()]
        # The opening chunk only announces the assistant role: nothing to relay.
        choices = [c for c in choices if c.text or c.finish_reason is not None]
        if not choices and up.usage is None:
            return None
        return Completion(
            id=ctx.id,
            created=self._created(up, ctx),
            model=ctx.model,
            choices=choices,
            usage=_usage(up.usage) if up.usage is not None else None,
        )

    def map_error(self, status: int, headers: Mapping[str, str], body: bytes, provider: str) -> GatewayError:
        message, code = _error_fields(body)
        delay = retry_after(headers)
        limits = rate_limits(headers)
        month = limits.get("tokens-month")
        # The monthly budget does not come back by waiting: a quota, never retried.
        quota = status == 429 and month is not None and month.remaining is not None and month.remaining <= 0
        if status == 429 and delay is None and not quota:
            # No Retry-After: the longest window among the exhausted buckets bounds the wait.
            windows = [
                w
                for bucket, w in WINDOWS.items()
                if w is not None and (rl := limits.get(bucket)) is not None and rl.remaining == 0
            ]
            delay = max(windows) if windows else None
        low = message.lower()
        return UpstreamStatusError(
            f"{provider} error ({status}): {message}",
            upstream_status=status,
            provider=provider,
            code=code,
            retry_after=delay,
            should_retry=should_retry(headers),
            quota=quota,
            # Wording not recorded for Mistral: the vLLM/OpenAI phrasing and "too large for model".
            context_window=status == 400 and ("context length" in low or "too large for model" in low),
        )


def _error_fields(body: bytes) -> tuple[str, str | None]:
    try:
        err = _decode_error(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return (body.decode("utf-8", "replace").strip()[:500] or "no error body"), None
    code = err.code if err.code is not None else err.type
    message = err.message if err.message is not None else err.detail
    if message is None:
        text = "unknown error"
    elif isinstance(message, str):
        text = message
    else:
        # 422 validation errors carry a structure here ({"detail": [...]}): show it compactly.
        text = msgspec.json.encode(message).decode()[:500]
    return text, (str(code) if code is not None else None)


__all__ = ["MISTRAL_PARAMS", "MistralAdapter", "RateLimit", "rate_limits"]
