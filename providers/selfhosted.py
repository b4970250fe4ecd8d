"""What the self-hosted native adapters (TGI `/generate`, Ollama `/api/generate`, llama.cpp `/completion`)
share: reading `response_format` and building logprobs with computed text offsets (merging
`inference_extra_params` is providers/guarded.py `merge_extra`, declared per adapter as `extra_params`).

None of these servers echoes the prompt (the gateway provides `echo`), so a generated token's offset is
always counted from the end of its prompt: that is where it sits in the prompt + completion text the
client sees, whether or not the gateway prepends the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from providers.base import CallContext
from providers.offsets import aligned, key_bytes, prompt_for_choice, running_offsets, token_key
from wire.errors import InvalidRequestError, shown
from wire.schema import Logprobs, Usage


def response_schema(value: dict[str, Any]) -> tuple[bool, dict[str, Any] | None]:
    """(whether the output must be JSON, its schema if one was given) for a `response_format`.

    Accepted: `{"type": "text"}`, `{"type": "json_object"}`, Fireworks' `{"type": "json_object", "schema": S}`
    and OpenAI's `{"type": "json_schema", "json_schema": {"schema": S}}`.
    """
    kind = value.get("type")
    if kind == "text":
        return False, None
    if kind == "json_object":
        schema = value.get("schema")
    elif kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
    else:
        raise InvalidRequestError(
            f"'response_format.type' must be 'text', 'json_object' or 'json_schema', got {shown(repr(kind))}",
            param="response_format",
            code="invalid_value",
        )
    if schema is not None and not isinstance(schema, dict):
        raise InvalidRequestError(
            "'response_format' schema must be a JSON object", param="response_format", code="invalid_value"
        )
    return True, schema


def logprobs(
    tokens: list[str],
    token_logprobs: list[float | None],
    top_logprobs: Sequence[dict[str, float] | None] | None,
    ctx: CallContext,
    index: int = 0,
    raws: Sequence[bytes] | None = None,
) -> Logprobs:
    """OpenAI-shape logprobs for the next tokens of choice `index`, continuing its running text offset.

    Offsets count characters of the tokens' bytes (`raws`, else each token's name read back as bytes).
    """
    aligned(tokens, token_logprobs, top_logprobs)
    start = len(prompt_for_choice(ctx.prompts, index, ctx.n))
    if raws is None:
        raws = [key_bytes(t) for t in tokens]
    return Logprobs(
        tokens=tokens,
        token_logprobs=token_logprobs,
        top_logprobs=list(top_logprobs) if top_logprobs is not None else None,
        text_offset=running_offsets(ctx.offsets, ctx.state, index, start, raws),
    )


def top_dict(pairs: Sequence[tuple[str, float | None]]) -> dict[str, float]:
    """Alternatives as OpenAI's {token: logprob}; the first (most likely) wins when two are the same string."""
    out: dict[str, float] = {}
    for token, logprob in pairs:
        if logprob is not None and token not in out:
            out[token] = logprob
    return out


class TopProb(msgspec.Struct):
    """One alternative in llama-server's logprobs (`/completion`'s `completion_probabilities[].top_logprobs`,
    `/v1/completions`' `logprobs.content[].top_logprobs`): `token` is cut to whole UTF-8, `bytes` is all of it."""

    id: int = -1
    token: str = ""
    logprob: float | None = None
    raw: list[int] | None = msgspec.field(default=None, name="bytes")


class TokenProb(msgspec.Struct):
    id: int = -1
    token: str = ""
    logprob: float | None = None
    raw: list[int] | None = msgspec.field(default=None, name="bytes")
    top_logprobs: list[TopProb] = []


def raw_bytes(values: list[int] | None) -> bytes | None:
    """A token's `bytes` as sent (a list of byte values), or None when it has none."""
    return bytes(b & 0xFF for b in values) if values is not None else None


def token_probs(probs: Sequence[TokenProb], ctx: CallContext, index: int = 0) -> Logprobs:
    """llama-server's per-token logprobs as OpenAI's legacy shape.

    Every alternative is kept: a token that is part of a character is named by its bytes (`bytes:\\xe2\\x80`),
    and two different tokens with the same name (the same text under two ids) keep the first name for the
    more likely one and `token_id:<id>` (vLLM's form) for the other. The sampled token has the name its
    alternative has, so `tokens[i]` is a key of `top_logprobs[i]` whenever the server listed it.
    """
    tokens: list[str] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    raws: list[bytes] = []
    for p in probs:
        top: dict[str, float] = {}
        names: dict[int, str] = {}
        for t in p.top_logprobs:
            if t.logprob is None:
                continue
            key = token_key(t.token, raw_bytes(t.raw))
            if key in top:
                key = f"token_id:{t.id}"
            top[key] = t.logprob
            names[t.id] = key
        raw = raw_bytes(p.raw)
        name = names.get(p.id) or token_key(p.token, raw)
        tokens.append(name)
        values.append(p.logprob)
        tops.append(top)
        raws.append(raw if raw is not None else key_bytes(name))
    return logprobs(tokens, values, tops, ctx, index, raws)


def usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    # None of the three reports cached prompt tokens or reasoning tokens on these endpoints.
    return Usage(
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens
    )


__all__ = ["TokenProb", "TopProb", "logprobs", "raw_bytes", "response_schema", "token_probs", "top_dict", "usage"]
