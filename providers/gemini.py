"""Google Gemini (Generative Language API): `POST {base}/v1beta/models/{model}:generateContent`, and
`:streamGenerateContent?alt=sse` for streams.

The key travels in the `x-goog-api-key` header, never in the `?key=` query (URLs end up in logs). Sources,
structured-output mapping, recordings, finish reasons and error shapes: docs/provider-notes.md#gemini.
"""

from __future__ import annotations

import re
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
    path_segment,
    request_headers,
    table,
)
from providers.chat_fields import NO_NAMES
from providers.chat_params import ToolsParam, guides_checked
from providers.envelope import Unreadable, envelope_status
from providers.finish import finish_reason
from providers.gemini_chat import chat_answer, chat_chunk, to_contents, tool_choice, tools
from providers.gemini_thinking import accepted, add_thinking
from providers.offsets import aligned, prompt_for_choice, text_offsets
from providers.openai_chat import OpenAIChat
from providers.retry_after import retry_after
from wire.chat import ChatChunk, ChatCompletion, ChatRequest
from wire.errors import GatewayError, InvalidRequestError, UpstreamStatusError, shown
from wire.schema import (
    Choice,
    Completion,
    CompletionRequest,
    CompletionTokensDetails,
    Logprobs,
    PromptTokensDetails,
    Usage,
)

DEFAULT_API_VERSION: Final = "v1beta"

# google.protobuf.Duration in JSON: decimal seconds with an "s" suffix.
_DURATION: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s*$")
# Some 429s carry the delay only in words ("... Please retry in 45.578569677s.", continuedev/continue#9570).
_RETRY_IN_WORDS: Final = re.compile(r"retry in (\d+(?:\.\d+)?)s", re.IGNORECASE)


# --------------------------------------------------------------------------------------------------
# Upstream shapes (lenient: unknown fields ignored, everything optional)


class GFunctionCall(msgspec.Struct):
    name: str = ""
    args: Any = None
    id: str | None = None


class GPart(msgspec.Struct, rename="camel"):
    text: str | None = None
    # Thought summaries (includeThoughts) are parts flagged `thought: true`: not completion text.
    thought: bool = False
    # Chat's (providers/gemini_chat.py): a call of a declared function, and the signature Gemini 3 wants back.
    function_call: GFunctionCall | None = None
    thought_signature: str | None = None


class GContent(msgspec.Struct):
    parts: list[GPart] = []


class GLogprob(msgspec.Struct, rename="camel"):
    token: str = ""
    # proto3 JSON omits zero-valued fields, so a certain token (log probability 0) may come without it.
    log_probability: float = 0.0


class GTopCandidates(msgspec.Struct):
    candidates: list[GLogprob] = []


class GLogprobsResult(msgspec.Struct, rename="camel"):
    chosen_candidates: list[GLogprob] = []
    top_candidates: list[GTopCandidates] = []


class GCandidate(msgspec.Struct, rename="camel"):
    content: GContent | None = None
    finish_reason: str | None = None
    index: int | None = None
    logprobs_result: GLogprobsResult | None = None


class GUsage(msgspec.Struct, rename="camel"):
    prompt_token_count: int | None = None
    candidates_token_count: int | None = None
    thoughts_token_count: int | None = None
    cached_content_token_count: int | None = None
    total_token_count: int | None = None


class GPromptFeedback(msgspec.Struct, rename="camel"):
    block_reason: str | None = None


class GViolation(msgspec.Struct, rename="camel"):
    quota_id: str | None = None
    quota_metric: str | None = None


class GDetail(msgspec.Struct, rename="camel"):
    type: str | None = msgspec.field(default=None, name="@type")
    retry_delay: str | None = None
    violations: list[GViolation] = []


class GErrorBody(msgspec.Struct):
    code: int | None = None
    message: str | None = None
    status: str | None = None
    details: list[GDetail] = []


class GError(msgspec.Struct):
    error: GErrorBody | None = None


class GResponse(msgspec.Struct, rename="camel"):
    candidates: list[GCandidate] = []
    usage_metadata: GUsage | None = None
    prompt_feedback: GPromptFeedback | None = None
    # A failure after the stream started arrives as an event carrying only the error envelope.
    error: GErrorBody | None = None


_decode_response = msgspec.json.Decoder(GResponse).decode
# The non-SSE streaming endpoint (and some proxies) wrap the envelope in a one-element array.
_decode_error = msgspec.json.Decoder(GError | list[GError]).decode


# --------------------------------------------------------------------------------------------------
# Request translation


def _set_mime(config: dict[str, Any], mime: str, field: str) -> None:
    current = config.get("responseMimeType")
    if current is not None and current != mime:
        raise InvalidRequestError(
            f"'{field}' asks Gemini for {mime} output, which conflicts with {current} requested by another field",
            param=field,
            code="invalid_value",
        )
    config["responseMimeType"] = mime


def _json_schema(config: dict[str, Any], schema: Any, field: str) -> None:
    _set_mime(config, "application/json", field)
    config["responseJsonSchema"] = schema


def _response_format(body: dict[str, Any], value: dict[str, Any]) -> None:
    kind = value.get("type")
    if kind == "text":
        return
    config = body.setdefault("generationConfig", {})
    if kind == "json_object":
        # Fireworks' form carries the schema inline: {"type": "json_object", "schema": {...}}.
        schema = value.get("schema")
        if schema is None:
            _set_mime(config, "application/json", "response_format")
        else:
            _json_schema(config, schema, "response_format")
        return
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if schema is None:
            raise InvalidRequestError(
                "'response_format' of type json_schema needs json_schema.schema",
                param="response_format",
                code="invalid_value",
            )
        _json_schema(config, schema, "response_format")
        return
    raise InvalidRequestError(
        f"'response_format' type {shown(repr(kind))} is not supported by Gemini (text, json_object, json_schema)",
        param="response_format",
        code="unsupported_parameter",
    )


def _guided_json(body: dict[str, Any], schema: dict[str, Any]) -> None:
    _json_schema(body.setdefault("generationConfig", {}), schema, "guided_json")


def _guided_choice(body: dict[str, Any], choices: list[str]) -> None:
    config = body.setdefault("generationConfig", {})
    _set_mime(config, "text/x.enum", "guided_choice")
    config["responseSchema"] = {"type": "STRING", "enum": choices}


def _logprobs(body: dict[str, Any], k: int) -> None:
    config = body.setdefault("generationConfig", {})
    config["responseLogprobs"] = True
    # `logprobs` counts alternatives per step; with 0 only the sampled tokens' log probabilities are wanted.
    if k > 0:
        config["logprobs"] = k


def _top_k(body: dict[str, Any], k: int) -> None:
    # llm-engine's -1 (and 0) mean "no top-k cut": Gemini expresses that by leaving topK unset.
    if k > 0:
        body.setdefault("generationConfig", {})["topK"] = k


GEMINI_PARAMS: Table = table(
    max_tokens=Param(to="generationConfig.maxOutputTokens"),
    temperature=Param(to="generationConfig.temperature"),
    top_p=Param(to="generationConfig.topP"),
    top_k=Param(apply=_top_k),
    stop=Param(to="generationConfig.stopSequences"),
    n=Param(to="generationConfig.candidateCount"),
    presence_penalty=Param(to="generationConfig.presencePenalty"),
    frequency_penalty=Param(to="generationConfig.frequencyPenalty"),
    seed=Param(to="generationConfig.seed"),
    logprobs=Param(apply=_logprobs),
    response_format=Param(apply=_response_format),
    guided_json=Param(apply=_guided_json),
    guided_choice=Param(apply=_guided_choice),
    # Level or budget by the endpoint's model, which the table does not see: `_request` writes it.
    reasoning_effort=Param(apply=accepted),
    guided_regex=EMULATED,
    guided_grammar=EMULATED,
    echo=EMULATED,
    best_of=EMULATED,
    include_stop_str_in_output=EMULATED,
)
# What chat sends (providers/gemini_chat.py): the sampling fields as on completions, and the tools.
GEMINI_CHAT_PARAMS: Table = table(
    {name: rule for name, rule in GEMINI_PARAMS.items() if not rule.emulated},
    tools=ToolsParam(apply=tools, strict="none"),  # a FunctionDeclaration has no `strict`
    tool_choice=Param(apply=tool_choice),
)


# --------------------------------------------------------------------------------------------------
# Response normalization


def _usage(up: GUsage | None) -> Usage | None:
    if up is None or (up.prompt_token_count is None and up.total_token_count is None):
        return None
    prompt = up.prompt_token_count or 0
    thoughts = up.thoughts_token_count
    # candidatesTokenCount excludes the thinking tokens that totalTokenCount (and the bill) include.
    completion = (up.candidates_token_count or 0) + (thoughts or 0)
    total = up.total_token_count if up.total_token_count is not None else prompt + completion
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=total,
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=thoughts) if thoughts is not None else None,
        prompt_tokens_details=(
            PromptTokensDetails(cached_tokens=up.cached_content_token_count)
            if up.cached_content_token_count is not None
            else None
        ),
    )


def _text(c: GCandidate) -> str:
    if c.content is None:
        return ""
    return "".join(p.text for p in c.content.parts if p.text is not None and not p.thought)


def _parse_duration(value: str | None) -> float | None:
    if not value:
        return None
    m = _DURATION.match(value)
    return float(m.group(1)) if m else None


def _is_exhausted_quota(err: GErrorBody) -> bool:
    """A 429 that waiting a minute cannot fix.

    Rule: any QuotaFailure violation whose quotaId is a per-day quota (`...PerDay...`, e.g.
    `GenerateRequestsPerDayPerProjectPerModel-FreeTier`) resets only at the end of the day
    (UKGovernmentBEIS/inspect_ai#5526, dcdpr/jp#1061); a message reporting `limit: 0` means the key has no
    quota for the model at all (inspect_ai#3215). Per-minute quotas stay retryable after RetryInfo's delay.
    """
    for detail in err.details:
        for v in detail.violations:
            if v.quota_id and "perday" in v.quota_id.lower():
                return True
    return "limit: 0," in (err.message or "")


class GeminiAdapter(OpenAIChat):
    kind = "gemini"
    genai_provider = "gcp.gemini"
    auth = "`x-goog-api-key`"
    default_base_url = "https://generativelanguage.googleapis.com"
    credential_headers = frozenset({"x-goog-api-key"})
    extra_params = "nested"  # generationConfig, safetySettings...
    guarded_paths = frozenset({"contents", "generationConfig.maxOutputTokens", "generationConfig.candidateCount"})
    path: ClassVar[str] = "/v1beta/models/{model}:generateContent (stream: :streamGenerateContent?alt=sse)"
    params: Table = GEMINI_PARAMS
    max_stop = 5
    max_logprobs = 20
    # One `contents` turn per call: the gateway fans out prompt lists.
    prompt_forms = frozenset({"text"})
    chat_path: ClassVar[str] = "/v1beta/models/{model}:generateContent"
    chat_names = NO_NAMES  # its messages have no `name`
    chat_results_paired = True  # results are paired with the turn's calls by name (gemini_chat.py)
    chat_open_calls_refused = True  # "Requests ending with a model turn are not supported."
    chat_params = guides_checked(GEMINI_CHAT_PARAMS, GEMINI_PARAMS)
    # Chat's body carries the limit and the count where completions' does: its extras are guarded the same.
    chat_guarded_paths = guarded_paths

    def url(self, req: CompletionRequest, endpoint: Endpoint) -> str:
        # Config may name the model as the API's resource name ("models/gemini-2.0-flash"). The id is one
        # path segment (`models/{model}`) followed by the method: a `/`, `..`, `:` or `?` from the client
        # must not reach another path or method on Google's host with the gateway's key.
        model = path_segment(endpoint.model.removeprefix("models/"), endpoint.provider)
        version = endpoint.api_version or DEFAULT_API_VERSION
        base = f"{endpoint.base_url.rstrip('/')}/{version}/models/{model}"
        return base + (":streamGenerateContent?alt=sse" if req.stream else ":generateContent")

    def auth_headers(self, endpoint: Endpoint) -> dict[str, str]:
        return {"x-goog-api-key": endpoint.api_key} if endpoint.api_key else {}

    def build_request(self, req: CompletionRequest, endpoint: Endpoint, params: dict[str, Any]) -> UpstreamRequest:
        return self._request(req, endpoint, params, {"contents": [{"role": "user", "parts": [{"text": req.prompt}]}]})

    def build_chat_request(self, req: ChatRequest, endpoint: Endpoint, params: dict[str, Any]) -> UpstreamRequest:
        system, contents = to_contents(req.messages, endpoint.provider)
        body: dict[str, Any] = {"contents": contents}
        if system is not None:
            body["systemInstruction"] = system
        return self._request(req, endpoint, params, body)

    def _request(
        self, req: CompletionRequest, endpoint: Endpoint, params: dict[str, Any], body: dict[str, Any]
    ) -> UpstreamRequest:
        body.update(params)
        self.add_extra(body, req)
        if req.reasoning_effort is not None:
            add_thinking(body, req.reasoning_effort, endpoint)
        headers = request_headers(
            req,
            endpoint,
            accept="text/event-stream" if req.stream else "application/json",
            auth=self.auth_headers(endpoint),
        )
        return UpstreamRequest(
            method="POST",
            url=self.url(req, endpoint),
            headers=headers,
            body=msgspec.json.encode(body),
            stream=bool(req.stream),
        )

    def _logprobs(self, lr: GLogprobsResult | None, index: int, ctx: CallContext) -> Logprobs | None:
        if lr is None:
            return None
        tokens = [c.token for c in lr.chosen_candidates]
        # Gemini has no echo (the gateway emulates it), so generated text always starts after the prompt.
        start = ctx.offsets.get(index)
        if start is None:
            start = len(prompt_for_choice(ctx.prompts, index, ctx.n))
        offsets = text_offsets(tokens, start)
        if tokens:
            ctx.offsets[index] = offsets[-1] + len(tokens[-1])
        top: list[dict[str, float] | None] | None = None
        if lr.top_candidates:
            aligned(tokens, lr.top_candidates)
            top = [{c.token: c.log_probability for c in step.candidates} for step in lr.top_candidates]
        return Logprobs(
            tokens=tokens,
            token_logprobs=[c.log_probability for c in lr.chosen_candidates],
            top_logprobs=top,
            text_offset=offsets,
        )

    def _choices(self, up: GResponse, ctx: CallContext) -> list[Choice]:
        choices: list[Choice] = []
        for position, c in enumerate(up.candidates):
            index = c.index if c.index is not None else position
            choices.append(
                Choice(
                    text=_text(c),
                    index=index,
                    logprobs=self._logprobs(c.logprobs_result, index, ctx),
                    finish_reason=finish_reason(c.finish_reason),
                )
            )
        return choices

    def _blocked(self, ctx: CallContext) -> list[Choice]:
        # A blocked prompt yields no candidates at all: every requested choice ends filtered, with no text.
        return [Choice(text="", index=i, logprobs=None, finish_reason="content_filter") for i in range(ctx.n)]

    def parse_response(self, body: bytes, ctx: CallContext) -> Completion:
        up = _decode_response(body)
        if up.error is not None:
            raise self.map_error(envelope_status(up.error.code, up.error.status), {}, body, self.kind)
        if up.candidates:
            choices = self._choices(up, ctx)
        elif up.prompt_feedback is not None and up.prompt_feedback.block_reason:
            choices = self._blocked(ctx)
        else:
            raise Unreadable("an answer without candidates")
        return ctx.completion(choices, _usage(up.usage_metadata))

    def parse_event(self, event: str | None, data: bytes, ctx: CallContext) -> Completion | None:
        up = _decode_response(data)
        if up.error is not None:
            raise self.map_error(envelope_status(up.error.code, up.error.status), {}, data, self.kind)
        if up.candidates:
            choices = self._choices(up, ctx)
            # Every event repeats a running usageMetadata; only the one that ends the stream is final.
            final = any(c.finish_reason is not None for c in choices)
        elif up.prompt_feedback is not None and up.prompt_feedback.block_reason:
            choices, final = self._blocked(ctx), True
        else:
            return None
        return ctx.completion(choices, _usage(up.usage_metadata) if final else None)

    def parse_chat_response(self, body: bytes, ctx: CallContext) -> ChatCompletion:
        up = _decode_response(body)
        if up.error is not None:
            raise self.map_error(envelope_status(up.error.code, up.error.status), {}, body, self.kind)
        if not up.candidates and not (up.prompt_feedback is not None and up.prompt_feedback.block_reason):
            raise Unreadable("an answer without candidates")
        return chat_answer(up.candidates, _usage(up.usage_metadata), ctx)

    def parse_chat_event(self, event: str | None, data: bytes, ctx: CallContext) -> ChatChunk | None:
        up = _decode_response(data)
        if up.error is not None:
            raise self.map_error(envelope_status(up.error.code, up.error.status), {}, data, self.kind)
        if not up.candidates and not (up.prompt_feedback is not None and up.prompt_feedback.block_reason):
            return None
        return chat_chunk(up.candidates, _usage(up.usage_metadata), ctx)

    def map_error(self, status: int, headers: Mapping[str, str], body: bytes, provider: str) -> GatewayError:
        err = _error_body(body)
        message = (err.message if err and err.message else None) or _plain(body)
        delay = retry_after(headers)
        quota = context_window = False
        if err is not None:
            if delay is None:
                for detail in err.details:
                    if detail.type and detail.type.endswith("google.rpc.RetryInfo"):
                        delay = _parse_duration(detail.retry_delay)
                        break
            if delay is None and err.message:
                m = _RETRY_IN_WORDS.search(err.message)
                delay = float(m.group(1)) if m else None
            quota = status == 429 and _is_exhausted_quota(err)
            low = message.lower()
            context_window = status == 400 and "input token count" in low and "exceeds" in low
        return UpstreamStatusError(
            f"{provider} error ({status}): {message}",
            upstream_status=status,
            provider=provider,
            code=err.status if err is not None else None,
            retry_after=delay,
            quota=quota,
            context_window=context_window,
        )


def _error_body(body: bytes) -> GErrorBody | None:
    try:
        decoded: GError | list[GError] = _decode_error(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if isinstance(decoded, list):
        decoded = decoded[0] if decoded else GError()
    return decoded.error


def _plain(body: bytes) -> str:
    return body.decode("utf-8", "replace").strip()[:500] or "no error body"


__all__ = ["GEMINI_PARAMS", "GeminiAdapter"]
