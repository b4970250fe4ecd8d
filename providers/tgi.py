"""Hugging Face Text Generation Inference, native API: `POST {base}/generate` and `{base}/generate_stream`.

TGI keeps a matched stop sequence in its text, so `stop_in_output` has the gateway enforce stops. Sources,
validation bounds, recordings, logprobs and prompt-token semantics: docs/provider-notes.md#tgi.
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
    UpstreamRequest,
    bearer,
    request_headers,
    table,
)
from providers.chat_fields import NO_NAMES
from providers.chat_params import chat_table
from providers.envelope import Unreadable
from providers.finish import finish_reason
from providers.openai_chat import OpenAIChat
from providers.retry_after import retry_after, should_retry
from providers.selfhosted import logprobs, response_schema, top_dict, usage
from providers.tokenizer import TGI_TOKENIZER
from wire.errors import GatewayError, InvalidRequestError, UnsupportedParamError, UpstreamStatusError
from wire.schema import Completion, CompletionRequest, Logprobs

# `error_type` of an error event inside a 200 stream, back to the status the same error has as a response.
_ERROR_STATUS: Final[dict[str, int]] = {
    "validation": 422,
    "generation": 424,
    "overloaded": 429,
    "incomplete_generation": 500,
}

# validation.rs InputLength and MaxTotalTokens: the prompt (plus the asked-for tokens) does not fit.
_TOO_LONG = re.compile(r"`inputs` (must have less than|tokens \+ `max_new_tokens` must be <=)")

# Regex metacharacters; everything else stands for itself in Python, Rust and outlines regexes.
_REGEX_ESCAPE = {ord(c): "\\" + c for c in "\\.^$|?*+()[]{}"}  # a translation table: no regex runs on the choices


def _set_grammar(params: dict[str, Any], grammar: dict[str, Any]) -> None:
    if "grammar" in params:
        # normalize() rejects two guided_* fields; a schema in both guided_json and response_format is the
        # one pair left, and TGI takes one grammar.
        raise InvalidRequestError(
            "only one structured-output constraint may be set for provider kind 'tgi'",
            param="response_format",
            code="invalid_value",
        )
    params["grammar"] = grammar


def _guided_json(body: dict[str, Any], schema: dict[str, Any]) -> None:
    _set_grammar(body.setdefault("parameters", {}), {"type": "json", "value": schema})


def _guided_regex(body: dict[str, Any], pattern: str) -> None:
    _set_grammar(body.setdefault("parameters", {}), {"type": "regex", "value": pattern})


def _choice_pattern(choices: list[str]) -> str:
    # An alternation of literals matches exactly the choices: TGI's regex guide only lets the model end
    # in an accepting state, which is how vLLM implements guided_choice too.
    return "(" + "|".join(c.translate(_REGEX_ESCAPE) for c in choices) + ")"


def _guided_choice(body: dict[str, Any], choices: list[str]) -> None:
    _guided_regex(body, _choice_pattern(choices))


def _chat_grammar(body: dict[str, Any], kind: str, value: Any) -> None:
    """The Messages API's grammar: its `response_format`, one per request."""
    if "response_format" in body:
        raise InvalidRequestError(
            "only one structured-output constraint may be set for provider kind 'tgi'",
            param="response_format",
            code="invalid_value",
        )
    body["response_format"] = {"type": kind, "value": value}


def _chat_response_format(body: dict[str, Any], value: dict[str, Any]) -> None:
    # `chat_formats` let through only `text` (nothing to send) and `json_schema`.
    _, schema = response_schema(value)
    if value.get("type") != "json_schema":
        return
    if schema is None:
        raise InvalidRequestError(
            "'response_format.json_schema.schema' is required for provider kind 'tgi': its JSON grammar is a schema",
            param="response_format",
            code="invalid_value",
        )
    _chat_grammar(body, "json", schema)


def _response_format(body: dict[str, Any], value: dict[str, Any]) -> None:
    _, schema = response_schema(value)
    # Schemaless JSON mode is refused in check(); "text" asks for nothing.
    if schema is not None:
        _guided_json(body, schema)


def _top_n_tokens(count: int) -> int:
    # Alternatives are how the parser knows logprobs were asked for (TGI sends token logprobs always).
    return max(count, 1)


def _truncate(tokens: int) -> int:
    # vLLM's truncate_prompt_tokens and TGI's truncate both keep the prompt's last N tokens; vLLM's -1 (the
    # model's own limit) has no TGI value, and TGI would refuse the -1 with a 422 that names its own field.
    if tokens < 0:
        raise InvalidRequestError(
            "'truncate_prompt_tokens' must be a token count for provider kind 'tgi' (-1 is vLLM's)",
            param="truncate_prompt_tokens",
            code="invalid_value",
        )
    return tokens


def _sampling(params: dict[str, Any]) -> None:
    """OpenAI's sampling knobs in TGI's terms.

    TGI refuses temperature 0, top_p outside (0, 1) and top_k <= 0, and samples only with `do_sample`.
    Like TGI's own /v1/completions, sample unless temperature is 0. top_p 0 keeps only the most likely
    token, which is greedy too; top_p 1 and top_k <= 0 filter nothing, which is TGI's default. When greedy,
    top_p, top_k and typical_p go: TGI would otherwise sample with them, and none can change the argmax.
    """
    greedy = params.get("temperature") == 0 or params.get("top_p") == 0
    if greedy:
        for key in ("temperature", "top_p", "top_k", "typical_p"):
            params.pop(key, None)
    else:
        # TGI takes top_p and typical_p only inside (0, 1); 1 filters nothing.
        for key in ("top_p", "typical_p"):
            if params.get(key, 0) >= 1:
                del params[key]
        if params.get("top_k", 1) <= 0:
            del params["top_k"]
    params["do_sample"] = not greedy


class TGIToken(msgspec.Struct):
    id: int = 0
    text: str = ""
    logprob: float | None = None
    special: bool = False


class TGIDetails(msgspec.Struct):
    finish_reason: str | None = None
    generated_tokens: int = 0
    prefill: list[TGIToken] = []
    tokens: list[TGIToken] = []
    top_tokens: list[list[TGIToken]] | None = None
    # Stream details only (newer TGI; absent from the recorded stream).
    input_length: int | None = None


class TGIGenerated(msgspec.Struct):
    # None: no `generated_text` at all, which no answer lacks (`{"error", "error_type"}` in a 200 is one).
    generated_text: str | None = None
    details: TGIDetails | None = None
    error: str | None = None
    error_type: str | None = None


class TGIStreamEvent(msgspec.Struct):
    token: TGIToken | None = None
    top_tokens: list[TGIToken] | None = None
    generated_text: str | None = None
    details: TGIDetails | None = None
    error: str | None = None
    error_type: str | None = None


class TGIError(msgspec.Struct):
    error: str | None = None
    error_type: str | None = None


_decode_generated = msgspec.json.Decoder(list[TGIGenerated] | TGIGenerated).decode
_decode_event = msgspec.json.Decoder(TGIStreamEvent).decode
_decode_error = msgspec.json.Decoder(TGIError).decode


def _text(token: TGIToken | None) -> str:
    return "" if token is None or token.special else token.text


class TGIAdapter(OpenAIChat):
    kind = "tgi"
    extra_params = "deep"  # parameters
    guarded_paths = frozenset({"inputs", "parameters.max_new_tokens", "parameters.best_of"})
    needs_base_url = True
    model_listing = ("/v1/models", True)  # the server root (/generate); lists its one model_id
    serves_replicas = True
    tokenizer = TGI_TOKENIZER
    auth = "`Authorization: Bearer` when api_key is set"
    path: ClassVar[str] = "/generate, /generate_stream"
    max_logprobs = 5
    max_stop = 4
    needs_api_key = False
    prompt_forms = frozenset({"text"})
    # The matched stop sequence stays at the end of the text (see the module docstring).
    stop_in_output: ClassVar[bool] = True
    params = table(
        max_tokens=Param("parameters.max_new_tokens"),
        temperature=Param("parameters.temperature"),
        top_p=Param("parameters.top_p"),
        top_k=Param("parameters.top_k"),
        frequency_penalty=Param("parameters.frequency_penalty"),
        seed=Param("parameters.seed"),
        stop=Param("parameters.stop"),
        logprobs=Param("parameters.top_n_tokens", convert=_top_n_tokens),
        # TGI's own GenerateParameters (docs/openapi.json); `truncate` under vLLM's name for the same thing.
        repetition_penalty=Param("parameters.repetition_penalty"),
        typical_p=Param("parameters.typical_p"),
        truncate_prompt_tokens=Param("parameters.truncate", convert=_truncate),
        watermark=Param("parameters.watermark"),
        guided_json=Param(apply=_guided_json),
        guided_regex=Param(apply=_guided_regex),
        guided_choice=Param(apply=_guided_choice),
        response_format=Param(apply=_response_format),
        n=EMULATED,
        best_of=EMULATED,
        echo=EMULATED,
        include_stop_str_in_output=EMULATED,
        guided_grammar=EMULATED,
    )
    # The Messages API (`/v1/chat/completions`): OpenAI's fields, without `n` or `logit_bias`; its
    # `parameters` fields are not read there. Its `response_format` is TGI's grammar (`{"type": "json" |
    # "regex", "value"}`, router `GrammarType`): a JSON schema and the guided fields are sent as one.
    chat_path: ClassVar[str] = "/v1/chat/completions"
    chat_formats: ClassVar[frozenset[str]] = frozenset({"text", "json_schema"})
    # Its `Message` takes a `name` but renders the chat template from `TextMessage`, which has none (router
    # src/lib.rs): the model never sees it. Its content chunks are `text` and `image_url` only.
    chat_names = NO_NAMES
    chat_params = chat_table(
        params,
        native=False,
        drop=("n", "logit_bias", "user", "parallel_tool_calls"),
        response_format=Param(apply=_chat_response_format),
        guided_json=Param(apply=lambda body, schema: _chat_grammar(body, "json", schema)),
        guided_regex=Param(apply=lambda body, pattern: _chat_grammar(body, "regex", pattern)),
        guided_choice=Param(apply=lambda body, choices: _chat_grammar(body, "regex", _choice_pattern(choices))),
    )

    def check(self, req: CompletionRequest, provider: str) -> None:
        super().check(req, provider)
        if req.response_format is not None:
            wants_json, schema = response_schema(req.response_format)
            if wants_json and schema is None:
                raise UnsupportedParamError(
                    "response_format",
                    provider,
                    f"Provider '{provider}' needs a JSON schema in 'response_format': "
                    "TGI's JSON grammar cannot express schemaless JSON mode",
                )

    def build_request(self, req: CompletionRequest, endpoint: Endpoint, body: dict[str, Any]) -> UpstreamRequest:
        params: dict[str, Any] = body.get("parameters", {})
        if req.max_tokens is None and endpoint.default_max_tokens is not None:
            params["max_new_tokens"] = endpoint.default_max_tokens
        _sampling(params)
        # Details carry the finish reason and token counts; the prefill counts the prompt but is refused
        # on a stream. TGI deployments differ on return_full_text's default, so say it.
        params["details"] = True
        params["return_full_text"] = False
        if not req.stream:
            params["decoder_input_details"] = True
        out: dict[str, Any] = {"inputs": req.prompt, "parameters": params}
        self.add_extra(out, req)
        base = endpoint.base_url.rstrip("/")
        return UpstreamRequest(
            method="POST",
            url=base + ("/generate_stream" if req.stream else "/generate"),
            headers=request_headers(
                req, endpoint, accept="text/event-stream" if req.stream else "application/json", auth=bearer(endpoint)
            ),
            body=msgspec.json.encode(out),
            stream=bool(req.stream),
        )

    def parse_response(self, body: bytes, ctx: CallContext) -> Completion:
        decoded = _decode_generated(body)
        if isinstance(decoded, list):
            if len(decoded) != 1:
                raise msgspec.ValidationError(f"expected one generation, got {len(decoded)}")
            decoded = decoded[0]
        if decoded.error is not None:
            raise self.map_error(_ERROR_STATUS.get(decoded.error_type or "", 500), {}, body, self.kind)
        if decoded.generated_text is None:
            raise Unreadable("an answer without generated_text")
        details = decoded.details
        lp: Logprobs | None = None
        if details is not None and details.top_tokens:
            kept = [
                (t, details.top_tokens[i] if i < len(details.top_tokens) else []) for i, t in enumerate(details.tokens)
            ]
            kept = [(t, top) for t, top in kept if not t.special]
            lp = logprobs(
                [t.text for t, _ in kept],
                [t.logprob for t, _ in kept],
                [top_dict([(a.text, a.logprob) for a in top]) for _, top in kept],
                ctx,
            )
        return ctx.single(
            decoded.generated_text,
            finish_reason(details.finish_reason) if details else None,
            lp,
            usage(len(details.prefill), details.generated_tokens) if details else None,
        )

    def parse_event(self, event: str | None, data: bytes, ctx: CallContext) -> Completion | None:
        up = _decode_event(data)
        if up.error is not None:
            raise self.map_error(_ERROR_STATUS.get(up.error_type or "", 500), {}, data, self.kind)
        token = up.token
        text = _text(token)
        lp: Logprobs | None = None
        if up.top_tokens:
            shown = token is not None and not token.special
            lp = logprobs(
                [text] if shown else [],
                [token.logprob] if shown and token is not None else [],
                [top_dict([(a.text, a.logprob) for a in up.top_tokens])] if shown else [],
                ctx,
            )
        # The last event is the one with the full text; details (we always ask) carry why and how much.
        final = ctx.ended = up.generated_text is not None
        details = up.details
        return ctx.single(
            text,
            finish_reason(details.finish_reason) if final and details else None,
            lp,
            usage(details.input_length or 0, details.generated_tokens) if final and details else None,
        )

    def map_error(self, status: int, headers: Mapping[str, str], body: bytes, provider: str) -> GatewayError:
        message, error_type = _error_fields(body)
        return UpstreamStatusError(
            f"{provider} error ({status}): {message}",
            upstream_status=status,
            provider=provider,
            code=error_type,
            retry_after=retry_after(headers),
            should_retry=should_retry(headers),
            context_window=bool(_TOO_LONG.search(message)),
        )


def _error_fields(body: bytes) -> tuple[str, str | None]:
    try:
        err = _decode_error(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        # A proxy in front of TGI (an HF endpoint, a load balancer) may answer in plain text or HTML.
        return body.decode("utf-8", "replace").strip()[:500] or "no error body", None
    return err.error or "unknown error", err.error_type


__all__ = ["TGIAdapter"]
