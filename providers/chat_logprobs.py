"""Chat logprobs in the completions shape, as some OpenAI-wire servers answer chat with them.

Together's chat route answers `logprobs` as its completions route does (`tokens`, `token_logprobs` and
`top_logprobs` as maps: together-python `types/chat_completions.py`, `LogprobsPart`, and a recorded answer
in tests/fixtures/SOURCES.md), and in a stream each chunk's sampled token's logprob as a bare number
(`ChatCompletionChoicesChunk.logprobs: float`). The client gets OpenAI's chat shape either way: a `content`
list of tokens with their UTF-8 bytes and top alternatives, as many alternatives as it asked for.
"""

from __future__ import annotations

import msgspec

from providers.offsets import aligned, key_bytes
from wire.chat import ChatLogprobs, TokenLogprob, TopLogprob


class UpLogprobs(msgspec.Struct):
    """A chat choice's `logprobs` as an upstream sends it: OpenAI's lists, or the completions shape."""

    content: list[UpToken] | None = None
    refusal: list[UpToken] | None = None
    tokens: list[str | None] | None = None
    token_logprobs: list[float | None] | None = None
    top_logprobs: list[dict[str, float] | None] | None = None


class UpTop(msgspec.Struct):
    token: str = ""
    logprob: float = 0.0
    bytes: list[int] | None = None


class UpToken(msgspec.Struct):
    token: str = ""
    logprob: float = 0.0
    bytes: list[int] | None = None
    top_logprobs: list[UpTop] | None = None


def _tokens(up: list[UpToken] | None) -> list[TokenLogprob] | None:
    if up is None:
        return None
    return [
        TokenLogprob(
            token=t.token,
            logprob=t.logprob,
            bytes=t.bytes,
            top_logprobs=[TopLogprob(token=a.token, logprob=a.logprob, bytes=a.bytes) for a in t.top_logprobs or ()],
        )
        for t in up
    ]


def _utf8(token: str) -> list[int]:
    return list(key_bytes(token))  # a token named by its bytes (`bytes:\\x..`) has those, not its name's


def _from_completion_shape(up: UpLogprobs, top: int) -> list[TokenLogprob]:
    tokens, values, tops = up.tokens or [], up.token_logprobs or [], up.top_logprobs or []
    aligned(tokens, up.token_logprobs, up.top_logprobs)  # a position each, as on completions
    out = []
    for i, token in enumerate(tokens):
        value = values[i] if i < len(values) else None
        if token is None or value is None:
            continue  # a position the server gave no logprob for: OpenAI's shape has no null logprob
        alternatives = tops[i] if i < len(tops) else None
        ranked = sorted((alternatives or {}).items(), key=lambda kv: -kv[1])[:top]
        out.append(
            TokenLogprob(
                token=token,
                logprob=value,
                bytes=_utf8(token),
                top_logprobs=[TopLogprob(token=t, logprob=v, bytes=_utf8(t)) for t, v in ranked],
            )
        )
    return out


def chat_logprobs(up: UpLogprobs | float | None, text: str | None, top: int) -> ChatLogprobs | None:
    """A choice's (or a stream chunk's) logprobs in OpenAI's chat shape; `text` is what the choice or chunk
    says (the token a bare number belongs to), `top` the alternatives the client asked for per token."""
    if up is None:
        return None
    if isinstance(up, float):
        token = text or ""
        return ChatLogprobs(content=[TokenLogprob(token=token, logprob=up, bytes=_utf8(token), top_logprobs=[])])
    if up.content is None and up.tokens is not None:
        return ChatLogprobs(content=_from_completion_shape(up, top))
    return ChatLogprobs(content=_tokens(up.content), refusal=_tokens(up.refusal))


__all__ = ["UpLogprobs", "chat_logprobs"]
