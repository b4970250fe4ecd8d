"""llama.cpp server, native API: `POST {base}/completion`, SSE when streaming.

No recorded llama.cpp response exists: this follows the server's README, field by field. Sources, the
response and error shapes and what is unverified: docs/provider-notes.md#llamacpp.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, ClassVar

import msgspec
from msgspec import Meta

from providers.base import (
    EMULATED,
    UNBOUNDED_N,
    CallContext,
    Endpoint,
    Param,
    UpstreamRequest,
    bearer,
    request_headers,
    table,
)
from providers.chat_params import CHAT_GUARDED, chat_table, continuing
from providers.context import context_window
from providers.engine import LLAMACPP_GAUGES
from providers.envelope import Unreadable
from providers.finish import finish_reason
from providers.openai_chat import OpenAIChat
from providers.retry_after import retry_after, should_retry
from providers.selfhosted import TokenProb, response_schema, token_probs, usage
from providers.tokenizer import LLAMACPP_TOKENIZER
from wire.errors import GatewayError, InvalidRequestError, UpstreamStatusError, shown
from wire.schema import Choice, Completion, CompletionRequest, FinishReason, Logprobs


def _constrain(body: dict[str, Any], key: str, value: Any) -> None:
    # llama.cpp takes either a grammar or a JSON schema, once.
    if "grammar" in body or "json_schema" in body:
        raise InvalidRequestError(
            "only one structured-output constraint may be set for provider kind 'llamacpp'",
            param=key,
            code="invalid_value",
        )
    body[key] = value


def _guided_json(body: dict[str, Any], schema: dict[str, Any]) -> None:
    _constrain(body, "json_schema", schema)


def _guided_grammar(body: dict[str, Any], grammar: str) -> None:
    _constrain(body, "grammar", grammar)


def _literal(text: str) -> str:
    """`text` as a GBNF string literal: printable ASCII as it is, `"` and `\\` escaped, everything else by its
    code point (src/llama-grammar.cpp `parse_char`), so no choice can end the literal or break the grammar."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        else:
            out.append(f"\\U{code:08X}")
    out.append('"')
    return "".join(out)


def _guided_choice(body: dict[str, Any], choices: list[str]) -> None:
    # One of the choices exactly, decoded by the server's grammar rather than checked and asked again.
    _constrain(body, "grammar", "root ::= " + " | ".join(_literal(c) for c in choices))


def _response_format(body: dict[str, Any], value: dict[str, Any]) -> None:
    wants_json, schema = response_schema(value)
    if wants_json:
        # JSON mode promises an object; the README's `{}` would also allow a bare string or number.
        _constrain(body, "json_schema", schema if schema is not None else {"type": "object"})


def _n_probs(count: int) -> int:
    # n_probs 0 returns no probabilities at all, not even the sampled token's: ask for one alternative
    # (OpenAI allows up to logprobs + 1 entries per token).
    return max(count, 1)


def _logit_bias(value: dict[str, float]) -> list[list[float]]:
    out: list[list[float]] = []
    for key, bias in value.items():
        try:
            token = int(key)
        except ValueError:
            # The README's list form also takes strings, but OpenAI's keys are token ids.
            raise InvalidRequestError(
                f"'logit_bias' keys must be token ids, got {shown(key)!r}", param="logit_bias", code="invalid_value"
            ) from None
        out.append([token, bias])
    return out


class LlamaErrorBody(msgspec.Struct):
    code: int | None = None
    message: str | None = None
    type: str | None = None


class LlamaCompletion(msgspec.Struct):
    index: Annotated[int, Meta(ge=0)] = 0  # which of the `n_cmpl` completions of the prompt (0 without one)
    content: str = ""
    stop: bool = False
    stop_type: str | None = None
    stopped_eos: bool = False
    stopped_word: bool = False
    stopped_limit: bool = False
    tokens_evaluated: int = 0
    tokens_predicted: int = 0
    completion_probabilities: list[TokenProb] | None = None
    probs: list[TokenProb] | None = None
    error: LlamaErrorBody | str | None = None


class LlamaError(msgspec.Struct):
    error: LlamaErrorBody | str | None = None


_decode_completion = msgspec.json.Decoder(LlamaCompletion).decode
# `n_cmpl` above 1, buffered: the results in index order, each as one completion (tools/server/server-context.cpp).
_decode_completions = msgspec.json.Decoder(list[LlamaCompletion]).decode
_decode_error = msgspec.json.Decoder(LlamaError).decode


def _finish(up: LlamaCompletion) -> FinishReason | None:
    return finish_reason(_stop_type(up)) if up.stop else None


def _stop_type(up: LlamaCompletion) -> str:
    kind = up.stop_type
    if kind is None:
        kind = "limit" if up.stopped_limit else "word" if up.stopped_word else "eos" if up.stopped_eos else None
    # llama.cpp's own /v1/completions reports "length" for anything but eos and word (server code).
    return kind if kind in ("eos", "word") else "limit"


class LlamaCppAdapter(OpenAIChat):
    kind = "llamacpp"
    extra_params = "deep"
    # The server reads `max_tokens` and `max_completion_tokens` as `n_predict` when the latter is absent, and `n`
    # as `n_cmpl` (tools/server/server-schema.cpp), on both routes: the client's extra params may set none of them.
    guarded_paths = frozenset({"prompt", "n_predict", "max_tokens", "max_completion_tokens", "n_cmpl", "n"})
    chat_guarded_paths = CHAT_GUARDED | {"n_predict", "n_cmpl"}
    # Completions per prompt in one call: newer servers only (late 2025), bounded by `--parallel`; `max_n` sets it.
    # Not on chat: there the server's answer to `n` counts the first choice's tokens as the usage of all of them.
    opt_in_n = "n_cmpl"
    needs_base_url = True
    model_listing = ("/v1/models", True)  # base_url is the server root (/completion)
    serves_replicas = True
    engine_gauges = LLAMACPP_GAUGES
    tokenizer = LLAMACPP_TOKENIZER
    auth = "`Authorization: Bearer` when api_key is set"
    path: ClassVar[str] = "/completion"
    needs_api_key = False
    max_logprobs = 20
    # One completion per call; token ids are a prompt llama.cpp takes as they are.
    prompt_forms = frozenset({"text", "tokens"})
    params = table(
        max_tokens=Param("n_predict"),
        temperature=Param(),
        top_p=Param(),
        top_k=Param(),
        presence_penalty=Param(),
        frequency_penalty=Param(),
        seed=Param(),
        stop=Param(),
        logprobs=Param("n_probs", convert=_n_probs),
        logit_bias=Param(convert=_logit_bias),
        # The README's own samplers; its `repeat_penalty` is the same multiplier as vLLM's repetition_penalty.
        min_p=Param(),
        typical_p=Param(),
        repetition_penalty=Param("repeat_penalty"),
        repeat_last_n=Param(),
        ignore_eos=Param(),
        mirostat=Param(),
        mirostat_tau=Param(),
        mirostat_eta=Param(),
        guided_json=Param(apply=_guided_json),
        guided_grammar=Param(apply=_guided_grammar),
        response_format=Param(apply=_response_format),
        n=EMULATED,
        best_of=EMULATED,
        echo=EMULATED,
        include_stop_str_in_output=EMULATED,
        guided_regex=EMULATED,
        guided_choice=Param(apply=_guided_choice),
    )
    # llama-server's `/v1/chat/completions` reads the same sampling fields as `/completion`.
    chat_path: ClassVar[str] = "/v1/chat/completions"
    # llama.cpp common/chat.cpp `common_chat_msgs_parse_oaicompat` reads it into the chat template.
    chat_reasoning_field = "reasoning_content"
    # llama-server reads vLLM's pair (tools/server/server-common.cpp, `oaicompat_chat_params_parse`): the trailing
    # assistant message is continued, not closed, and it refuses the two both true. A build older than the
    # field continues that message all the same by its default assistant prefill.
    chat_continue = MappingProxyType({"continue_final_message": True, "add_generation_prompt": False})
    # Its buffered answer is the message it parsed, prefill and continuation (its stream sends the continuation).
    chat_continue_repeats = True
    chat_params = chat_table(  # llama-server's tools/server/README.md
        params,
        chat_template_kwargs=Param(),
        continue_final_message=continuing(chat_continue),
        add_generation_prompt=Param(),
    )

    def build_request(self, req: CompletionRequest, endpoint: Endpoint, body: dict[str, Any]) -> UpstreamRequest:
        # `model` picks the model on a llama-server running several (router mode); a single-model server
        # ignores it.
        out: dict[str, Any] = {"model": endpoint.model, "prompt": req.prompt, **body}
        if req.max_tokens is None and endpoint.default_max_tokens is not None:
            out["n_predict"] = endpoint.default_max_tokens
        out["stream"] = bool(req.stream)
        out["cache_prompt"] = True
        self.add_extra(out, req)
        return UpstreamRequest(
            method="POST",
            url=endpoint.base_url.rstrip("/") + self.path,
            headers=request_headers(
                req, endpoint, accept="text/event-stream" if req.stream else "application/json", auth=bearer(endpoint)
            ),
            body=msgspec.json.encode(out),
            stream=bool(req.stream),
        )

    def _choice(self, up: LlamaCompletion, ctx: CallContext) -> Choice:
        if up.index >= ctx.n:
            raise Unreadable(f"a result numbered {up.index} of {ctx.n}")  # a server answering what no one asked
        probs = up.completion_probabilities if up.completion_probabilities is not None else up.probs
        lp: Logprobs | None = token_probs(probs, ctx, up.index) if probs is not None else None
        return Choice(text=up.content, index=up.index, logprobs=lp, finish_reason=_finish(up))

    def _raise(self, up: LlamaCompletion, body: bytes) -> None:
        status = up.error.code if isinstance(up.error, LlamaErrorBody) and up.error.code else 500
        raise self.map_error(status, {}, body, self.kind)

    def parse_response(self, body: bytes, ctx: CallContext) -> Completion:
        if body[:1] == b"[":
            return self._completions(_decode_completions(body), body, ctx)
        up = _decode_completion(body)
        if up.error is not None:
            self._raise(up, body)
        # The non-stream answer is the final result: `stop` is true in it (server code), say it if not.
        up.stop = True
        return ctx.completion([self._choice(up, ctx)], usage(up.tokens_evaluated, up.tokens_predicted))

    def _completions(self, ups: list[LlamaCompletion], body: bytes, ctx: CallContext) -> Completion:
        """`n_cmpl` results of one prompt: one choice each; the prompt counted once (every result reports the
        prompt it was made from), the completions' tokens added."""
        if not ups:
            raise Unreadable("an empty list of results")  # the server answers a list of one or more
        choices: list[Choice] = []
        prompt = predicted = 0
        for up in ups:
            if up.error is not None:
                self._raise(up, body)
            up.stop = True
            choices.append(self._choice(up, ctx))
            prompt, predicted = max(prompt, up.tokens_evaluated), predicted + up.tokens_predicted
        return ctx.completion(choices, usage(prompt, predicted))

    def parse_event(self, event: str | None, data: bytes, ctx: CallContext) -> Completion | None:
        if data == b"[DONE]":
            return None
        up = _decode_completion(data)
        if up.error is not None:
            self._raise(up, data)
        if not up.stop:
            return ctx.completion([self._choice(up, ctx)])
        # The server ends the stream once every completion has sent its one `stop` event, and sends nothing after
        # the last (no `[DONE]` on this route): docs/provider-notes.md#llamacpp.
        if ctx.n == 1 and not up.index:
            ctx.ended = True
            return ctx.completion([self._choice(up, ctx)], usage(up.tokens_evaluated, up.tokens_predicted))
        # One of `n_cmpl` completions ended: its final event carries its own counts, and the stream's usage (the
        # last event's) must be all of them: the prompt once, every completion's tokens added so far.
        state = ctx.state
        predicted = state["predicted"] = state.get("predicted", 0) + up.tokens_predicted
        prompt = state["prompt"] = max(state.get("prompt", 0), up.tokens_evaluated)
        stopped: set[int] = state.setdefault("stopped", set())
        stopped.add(up.index)
        # Distinct indexes, so a repeated `stop` cannot end it early. The call holds all `n` only where `n_cmpl`
        # carries it (`max_n` set and not passed); else the request's `n` was fanned out, one completion a call.
        ctx.ended = len(stopped) == (ctx.n if ctx.n <= self.max_n < UNBOUNDED_N else 1)
        return ctx.completion([self._choice(up, ctx)], usage(prompt, predicted))

    def map_error(self, status: int, headers: Mapping[str, str], body: bytes, provider: str) -> GatewayError:
        message, error_type = _error_fields(body)
        return UpstreamStatusError(
            f"{provider} error ({status}): {message}",
            upstream_status=status,
            provider=provider,
            code=error_type,
            retry_after=retry_after(headers),
            should_retry=should_retry(headers),
            context_window=context_window(error_type, message),
        )


def _error_fields(body: bytes) -> tuple[str, str | None]:
    try:
        err = _decode_error(body).error
    except (msgspec.DecodeError, msgspec.ValidationError):
        return body.decode("utf-8", "replace").strip()[:500] or "no error body", None
    if isinstance(err, LlamaErrorBody):
        return err.message or "unknown error", err.type
    return err or "unknown error", None


__all__ = ["LlamaCppAdapter"]
