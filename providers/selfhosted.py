"""What the self-hosted native adapters (TGI `/generate`, Ollama `/api/generate`, llama.cpp `/completion`)
share: reading `response_format` and building logprobs with computed text offsets (merging
`inference_extra_params` is providers/base.py `merge_extra`, declared per adapter as `extra_params`).

None of these servers echoes the prompt (the gateway provides `echo`), so a generated token's offset is
always counted from the end of its prompt: that is where it sits in the prompt + completion text the
client sees, whether or not the gateway prepends the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from providers.base import CallContext
from providers.offsets import prompt_for_choice, text_offsets
from wire.errors import InvalidRequestError
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
            f"'response_format.type' must be 'text', 'json_object' or 'json_schema', got {kind!r}",
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
) -> Logprobs:
    """OpenAI-shape logprobs for the next tokens of choice `index`, continuing its running text offset."""
    start = ctx.offsets.get(index)
    if start is None:
        start = len(prompt_for_choice(ctx.prompts, index, ctx.n))
    ctx.offsets[index] = start + sum(len(t) for t in tokens)
    return Logprobs(
        tokens=tokens,
        token_logprobs=token_logprobs,
        top_logprobs=list(top_logprobs) if top_logprobs is not None else None,
        text_offset=text_offsets(tokens, start),
    )


def top_dict(pairs: Sequence[tuple[str, float | None]]) -> dict[str, float]:
    """Alternatives as OpenAI's {token: logprob}; the first (most likely) wins when two decode alike."""
    out: dict[str, float] = {}
    for token, logprob in pairs:
        if logprob is not None and token not in out:
            out[token] = logprob
    return out


def usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    # None of the three reports cached prompt tokens or reasoning tokens on these endpoints.
    return Usage(
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens
    )


__all__ = ["logprobs", "response_schema", "top_dict", "usage"]
