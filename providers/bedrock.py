"""AWS Bedrock Runtime Converse API: `POST {base}/model/{modelId}/converse`, `/converse-stream` for streams.

Converse is one request shape for every model family on Bedrock, so one adapter serves them all. Auth is
SigV4 (providers.sigv4) or a Bedrock API key sent as Bearer. Sources, recordings, error and event-stream
shapes, per-family top_k and the path escaping: docs/provider-notes.md#bedrock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar, Final

import msgspec
from yarl import URL

from providers.base import (
    EMULATED,
    CallContext,
    Endpoint,
    Param,
    Table,
    UpstreamRequest,
    out_of_range,
    path_segment,
    request_headers,
    stop_list,
    table,
)
from providers.bedrock_chat import (
    CHAT_PARAMS,
    TOP_K_MARK,
    Reasoning,
    ToolUse,
    chat_answer,
    chat_event,
    refused,
    to_converse,
    usage_only,
)
from providers.chat_fields import NO_NAMES
from providers.chat_params import guides_checked
from providers.envelope import Unreadable
from providers.finish import finish_reason
from providers.openai_chat import OpenAIChat
from providers.retry_after import retry_after
from providers.sigv4 import sign
from wire.chat import ChatChunk, ChatCompletion, ChatRequest
from wire.errors import (
    GatewayError,
    ProviderUnavailableError,
    UnsupportedParamError,
    UpstreamStatusError,
    shown,
)
from wire.schema import Completion, CompletionRequest, PromptTokensDetails, Usage

SIGNING_NAME: Final = "bedrock"
DEFAULT_BASE_URL: Final = "https://bedrock-runtime.{region}.amazonaws.com"

# Without maxTokens a Bedrock model may write up to its own maximum, which differs per model; the rate
# limiter reserves this much per choice then (Anthropic's default, for the same reason). A configured
# `default_max_tokens` is sent as maxTokens instead.
DEFAULT_MAX_TOKENS: Final = 4096

# Where the gateway's top_k goes, by the model family named in the model id.
_TOP_K: Final[tuple[tuple[str, str], ...]] = (
    ("anthropic.", "top_k"),
    ("amazon.nova", "inferenceConfig.topK"),
)

# HTTP status of each error type (botocore service-2.json), for exceptions that arrive inside a 200 stream.
_STATUS: Final[dict[str, int]] = {
    "ValidationException": 400,
    "ServiceQuotaExceededException": 400,
    "AccessDeniedException": 403,
    "ResourceNotFoundException": 404,
    "ModelTimeoutException": 408,
    "ModelErrorException": 424,
    "ModelStreamErrorException": 424,
    "ThrottlingException": 429,
    "ModelNotReadyException": 429,
    "InternalServerException": 500,
    "ServiceUnavailableException": 503,
}
# "Retry your request" in the API reference, whatever the status says (424 is not retryable by itself).
_RETRY: Final = frozenset(
    {
        "ThrottlingException",
        "ModelNotReadyException",
        "ModelTimeoutException",
        "ModelStreamErrorException",
        "InternalServerException",
        "ServiceUnavailableException",
    }
)
_CONTEXT_WORDS: Final = ("too long", "exceed context limit", "context window")


def _now() -> datetime:
    return datetime.now(UTC)


BEDROCK_PARAMS: Table = table(
    max_tokens=Param(to="inferenceConfig.maxTokens"),
    temperature=Param(to="inferenceConfig.temperature"),
    top_p=Param(to="inferenceConfig.topP"),
    stop=Param(to="inferenceConfig.stopSequences", convert=stop_list),
    top_k=CHAT_PARAMS["top_k"],
    user=Param(to="requestMetadata.user"),
    n=EMULATED,
    best_of=EMULATED,
    echo=EMULATED,
    include_stop_str_in_output=EMULATED,
    guided_json=EMULATED,
    guided_regex=EMULATED,
    guided_choice=EMULATED,
    guided_grammar=EMULATED,
)


# --------------------------------------------------------------------------------------------------
# Upstream shapes (lenient: unknown fields ignored, everything optional)


class BContent(msgspec.Struct, rename="camel"):
    # reasoningContent, toolUse and other blocks have no `text`: not completion text.
    text: str | None = None
    tool_use: ToolUse | None = None  # chat's tool calls
    reasoning_content: Reasoning | None = None  # chat's reasoning_content


class BMessage(msgspec.Struct):
    content: list[BContent] = []


class BOutput(msgspec.Struct):
    message: BMessage | None = None


class BUsage(msgspec.Struct, rename="camel"):
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_write_input_tokens: int | None = None


class BResponse(msgspec.Struct, rename="camel"):
    output: BOutput | None = None
    stop_reason: str | None = None
    usage: BUsage | None = None
    # An error body inside a 200 (`{"message", "__type"}`): no output, a type.
    type: str | None = msgspec.field(default=None, name="__type")


class BDelta(msgspec.Struct):
    text: str | None = None


class BEvent(msgspec.Struct, rename="camel"):
    delta: BDelta | None = None
    stop_reason: str | None = None
    usage: BUsage | None = None


class BError(msgspec.Struct):
    message: str | None = None
    message_upper: str | None = msgspec.field(default=None, name="Message")
    type: str | None = msgspec.field(default=None, name="__type")


_decode_response = msgspec.json.Decoder(BResponse).decode
_decode_event = msgspec.json.Decoder(BEvent).decode
_decode_error = msgspec.json.Decoder(BError).decode


def usage_from(u: BUsage) -> Usage:
    """Cache reads and writes are prompt tokens too: Bedrock counts them beside inputTokens."""
    cached = u.cache_read_input_tokens or 0
    prompt = (u.input_tokens or 0) + cached + (u.cache_write_input_tokens or 0)
    completion = u.output_tokens or 0
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=u.total_tokens if u.total_tokens is not None else prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached)
        if u.cache_read_input_tokens is not None
        else None,
    )


def credentials(api_key: str, provider: str) -> tuple[str, str, str | None] | None:
    """(access key id, secret, session token) from `AKID:SECRET[:TOKEN]`; None for a Bedrock API key."""
    if ":" not in api_key:
        return None
    parts = api_key.split(":")
    if len(parts) > 3 or not parts[0] or not parts[1]:
        raise ProviderUnavailableError(
            f"Provider '{provider}' api_key must be ACCESS_KEY_ID:SECRET_ACCESS_KEY[:SESSION_TOKEN]"
            " or an Amazon Bedrock API key",
            param="model",
            code="provider_unavailable",
        )
    token = parts[2] if len(parts) == 3 and parts[2] else None
    return parts[0], parts[1], token


def error_type(headers: Mapping[str, str], body_type: str | None) -> str | None:
    """`ThrottlingException` from `x-amzn-ErrorType` (`Name:namespace-url`) or `__type` (`namespace#Name`)."""
    raw = headers.get("x-amzn-errortype") or headers.get("X-Amzn-ErrorType") or body_type
    if not raw:
        return None
    name = raw.split(":", 1)[0].rsplit("#", 1)[-1].strip()
    # Stream exception frames name the type in lowerCamelCase (`throttlingException`).
    return name[:1].upper() + name[1:] if name else None


def _model_path(model: str, provider: str) -> str:
    # Model ids hold `:` (`...-v1:0`) and ARNs `/` (inference profiles): `/` is escaped so an ARN stays one
    # segment, as the API documents; every other character yarl would decode again is kept as is, so the
    # path signed is byte for byte the path sent (gateway/upstream/h1.py sends a URL's path verbatim).
    return path_segment(model, provider, slash=True, safe=":@!$&'()*,;=")


class BedrockAdapter(OpenAIChat):
    kind = "bedrock"
    genai_provider = "aws.bedrock"
    auth = "SigV4 (`api_key: ACCESS_KEY_ID:SECRET[:SESSION_TOKEN]`, `region`) or `Authorization: Bearer` (API key)"
    default_base_url = DEFAULT_BASE_URL
    needs_region = True
    extra_params = "nested"  # inferenceConfig, additionalModelRequestFields...
    # Converse passes `additionalModelRequestFields` to the model as they are: Anthropic's and Meta's
    # output limits there would stand beside inferenceConfig's.
    guarded_paths = frozenset(
        {
            "messages",
            "inferenceConfig.maxTokens",
            "additionalModelRequestFields.max_tokens",
            "additionalModelRequestFields.max_gen_len",
        }
    )
    path: ClassVar[str] = "/model/{modelId}/converse (stream: /converse-stream)"
    params: Table = BEDROCK_PARAMS
    framing = "eventstream"
    prompt_forms = frozenset({"text"})
    max_logprobs = 0
    default_max_tokens = DEFAULT_MAX_TOKENS
    # Whether the stop string stays in the text depends on the model behind Converse: Amazon Nova was recorded
    # answering exactly "Paris" to stopSequences ["Paris"] (stopReason end_turn). The gateway cuts at the stop
    # string, which changes nothing for a model that already left it out (it would have stopped before it).
    stop_in_output = True

    # Chat (`system` blocks, `toolConfig`, `toolUse` / `toolResult` blocks): providers/bedrock_chat.py.
    chat_path: ClassVar[str] = path
    chat_names = NO_NAMES  # its messages have no `name`
    chat_results_paired = True  # Converse: each toolResult answers a toolUse of the turn before
    chat_open_calls_refused = True  # Converse: each toolUse is immediately followed by its toolResult
    chat_params = guides_checked(CHAT_PARAMS, BEDROCK_PARAMS)
    chat_framing = "eventstream"
    chat_guarded_paths = guarded_paths
    # Converse's structured output (`outputConfig.textFormat`) constrains to a JSON schema only; it has no
    # JSON mode without one.
    chat_formats: ClassVar[frozenset[str]] = frozenset({"text", "json_schema"})

    def __init__(self, clock: Callable[[], datetime] = _now) -> None:
        # The request time goes into the signature; tests pin it.
        self.clock = clock

    def check(self, req: CompletionRequest, provider: str) -> None:
        # logprobs is not in the table: map_params refuses it by name (or drops it under the drop policy),
        # which the base "at most 0 logprobs" check would pre-empt.
        super().check(req if req.logprobs is None else msgspec.structs.replace(req, logprobs=None), provider)
        # The gateway accepts OpenAI's 0-2; InferenceConfiguration.temperature is 0-1, and clamping would
        # change the sampling.
        if req.temperature is not None and req.temperature > 1:
            raise out_of_range(provider, "temperature", req.temperature, 0, 1)

    def url(self, req: CompletionRequest, endpoint: Endpoint, region: str) -> str:
        base = (endpoint.base_url or DEFAULT_BASE_URL).replace("{region}", region).rstrip("/")
        operation = "converse-stream" if req.stream else "converse"
        # Normalized through yarl once; the client sends that path verbatim, so what is signed goes on the wire.
        return str(URL(f"{base}/model/{_model_path(endpoint.model, endpoint.provider)}/{operation}"))

    def build_request(self, req: CompletionRequest, endpoint: Endpoint, params: dict[str, Any]) -> UpstreamRequest:
        body: dict[str, Any] = {"messages": [{"role": "user", "content": [{"text": req.prompt}]}]}
        return self._request(req, endpoint, params, body)

    def build_chat_request(self, req: ChatRequest, endpoint: Endpoint, params: dict[str, Any]) -> UpstreamRequest:
        refused(req, endpoint.provider)
        system, messages = to_converse(req.messages, endpoint.provider)
        body: dict[str, Any] = {"messages": messages}
        if system:
            body["system"] = system
        return self._request(req, endpoint, params, body)

    def _request(
        self, req: CompletionRequest, endpoint: Endpoint, params: dict[str, Any], body: dict[str, Any]
    ) -> UpstreamRequest:
        region = endpoint.region
        if not region:
            raise ProviderUnavailableError(
                f"Provider '{endpoint.provider}' is unavailable: it has no region configured",
                param="model",
                code="provider_unavailable",
            )
        top_k = params.pop(TOP_K_MARK, None)
        body.update(params)
        if top_k is not None:
            _place_top_k(body, top_k, endpoint)
        if req.max_tokens is None and endpoint.default_max_tokens is not None:
            body.setdefault("inferenceConfig", {})["maxTokens"] = endpoint.default_max_tokens
        self.add_extra(body, req)
        headers = request_headers(req, endpoint, accept=None)
        # Only the gateway's own credentials sign or authorize the call.
        for name in ("authorization", "x-amz-date", "x-amz-security-token"):
            headers.pop(name, None)
        url = self.url(req, endpoint, region)
        payload = msgspec.json.encode(body)
        key = endpoint.api_key or ""
        creds = credentials(key, endpoint.provider) if key else None
        if creds is not None:
            access_key, secret_key, token = creds
            headers = sign(
                method="POST",
                url=url,
                headers=headers,
                body=payload,
                access_key=access_key,
                secret_key=secret_key,
                region=region,
                service=SIGNING_NAME,
                now=self.clock(),
                session_token=token,
            )
        elif key:
            headers["authorization"] = f"Bearer {key}"
        return UpstreamRequest(method="POST", url=url, headers=headers, body=payload, stream=bool(req.stream))

    def _raise_in_200(self, body: bytes, body_type: str | None) -> None:
        """An error body inside a 200 (`{"message", "__type"}`), raised as its status."""
        etype = error_type({}, body_type) or "InternalServerException"
        raise self.map_error(_STATUS.get(etype, 500), {"x-amzn-errortype": etype}, body, self.kind)

    def _raise_exception_event(self, event: str, data: bytes) -> None:
        """A stream's `exception:` or `error:` frame, raised as the error it names."""
        kind, _, name = event.partition(":")
        etype = error_type({}, name) or "InternalServerException"
        body = data if kind == "exception" else msgspec.json.encode({"message": data.decode("utf-8", "replace")})
        raise self.map_error(_STATUS.get(etype, 500), {"x-amzn-errortype": etype}, body, self.kind)

    def parse_response(self, body: bytes, ctx: CallContext) -> Completion:
        up = _decode_response(body)
        if up.output is None and up.type is not None:
            self._raise_in_200(body, up.type)
        if up.output is None or up.output.message is None:
            raise Unreadable("an answer without an output message")
        text = "".join(c.text for c in up.output.message.content if c.text is not None)
        return ctx.single(
            text, finish_reason(up.stop_reason), usage=usage_from(up.usage) if up.usage is not None else None
        )

    def parse_event(self, event: str | None, data: bytes, ctx: CallContext) -> Completion | None:
        if event is not None and event.startswith(("exception:", "error:")):
            self._raise_exception_event(event, data)
        if event == "contentBlockDelta":
            ev = _decode_event(data)
            # reasoningContent and toolUse deltas carry no `text`, but are the model's work.
            if ev.delta is None or not ev.delta.text:
                ctx.working += 1
                return None
            return ctx.single(ev.delta.text, None)
        if event == "messageStop":
            # The usage follows in `metadata`: the last chunk carries both.
            ctx.state["stop"] = _decode_event(data).stop_reason
            return None
        if event == "metadata":
            ctx.ended = True  # the stream's last event, after messageStop
            ev = _decode_event(data)
            usage = usage_from(ev.usage) if ev.usage is not None else None
            return ctx.single("", finish_reason(ctx.state.get("stop")), usage=usage)
        # messageStart, contentBlockStart/Stop and event types added later.
        return None

    def parse_chat_response(self, body: bytes, ctx: CallContext) -> ChatCompletion:
        up = _decode_response(body)
        if up.output is None and up.type is not None:
            self._raise_in_200(body, up.type)
        if up.output is None or up.output.message is None:
            raise Unreadable("an answer without an output message")
        usage = usage_from(up.usage) if up.usage is not None else None
        return chat_answer(up.output.message.content, up.stop_reason, usage, ctx)

    def parse_chat_event(self, event: str | None, data: bytes, ctx: CallContext) -> ChatChunk | None:
        if event is not None and event.startswith(("exception:", "error:")):
            self._raise_exception_event(event, data)
        if event == "metadata":
            ctx.ended = True
            ev = _decode_event(data)
            return usage_only(ctx, usage_from(ev.usage)) if ev.usage is not None else None
        return chat_event(event, data, ctx)

    def map_error(self, status: int, headers: Mapping[str, str], body: bytes, provider: str) -> GatewayError:
        message, body_type = _error_fields(body)
        etype = error_type(headers, body_type)
        quota = etype == "ServiceQuotaExceededException"
        lowered = message.lower()
        return UpstreamStatusError(
            f"{provider} error ({status}): {message}",
            # Bedrock sends a quota as 400; the client is told 429 like any other exhausted quota.
            upstream_status=429 if quota else status,
            provider=provider,
            code=etype,
            retry_after=retry_after(headers),
            should_retry=True if etype in _RETRY else None,
            quota=quota,
            context_window=status == 400
            and etype in (None, "ValidationException")
            and any(w in lowered for w in _CONTEXT_WORDS),
        )


def _place_top_k(body: dict[str, Any], k: int, endpoint: Endpoint) -> None:
    model = endpoint.model.lower()
    for family, target in _TOP_K:
        if family in model:
            node = body.setdefault("additionalModelRequestFields", {})
            *parents, leaf = target.split(".")
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = k
            return
    raise UnsupportedParamError(
        "top_k",
        endpoint.provider,
        f"Parameter 'top_k' is not supported by provider '{endpoint.provider}' for model '{shown(endpoint.model)}'"
        " (Bedrock takes it for Anthropic Claude and Amazon Nova models only)",
    )


def _error_fields(body: bytes) -> tuple[str, str | None]:
    try:
        err = _decode_error(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return body.decode("utf-8", "replace").strip()[:500] or "no error body", None
    message = err.message or err.message_upper
    if message is None:
        message = body.decode("utf-8", "replace").strip()[:500] or "no error body"
    return message, err.type


__all__ = ["BEDROCK_PARAMS", "DEFAULT_BASE_URL", "BedrockAdapter", "credentials", "error_type", "usage_from"]
