"""An upstream's answer, checked before anyone reads it: one the adapter cannot read, one that ignored `n`,
choices numbered otherwise than asked for, and usage counts out of all reason, each a failed attempt or a
clamped count rather than a crash, a choice for no prompt or a poisoned budget."""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar, cast

import msgspec

from gateway.upstream.plan import Route
from providers.base import CallContext, prompt_form
from providers.envelope import Unreadable
from wire.errors import GatewayError, UpstreamError, shown
from wire.schema import CompletionRequest, CompletionTokensDetails, PromptTokensDetails, Usage

log = logging.getLogger("gateway")

# What an upstream answer that cannot be read raises while it is parsed: the answer is broken, not the
# gateway (other exceptions are adapter bugs, logged with their traceback, but also a failed attempt).
UNREADABLE = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, Unreadable)
# The most tokens one answer may report: larger (or negative) counts from a broken upstream are clamped
# so they cannot poison rate limits, budgets and usage rows.
MAX_REPORTED_TOKENS = 100_000_000
_INDEX = operator.attrgetter("index")


_A = TypeVar("_A")


def parsed(route: Route, parse: Callable[[bytes, CallContext], _A], body: bytes, ctx: CallContext) -> _A:
    """An upstream answer read by the adapter's `parse`; one it cannot read is a failed attempt."""
    try:
        return parse(body, ctx)
    except GatewayError:
        raise
    except Exception as exc:
        raise unreadable(route, "response body", exc) from None


def unreadable(route: Route, what: str, exc: Exception) -> UpstreamError:
    """An upstream answer the adapter could not read: a failed attempt (502), retried or failed over."""
    if not isinstance(exc, UNREADABLE):
        log.error("parsing %s's %s failed", route.provider, what, exc_info=exc)
    return failed_attempt(route, f"sent an invalid {what}", "invalid_upstream_response", "invalid_response")


def failed_attempt(route: Route, what: str, code: str, cause: str) -> UpstreamError:
    """An attempt on `route` that failed before anything reached the client: retried or failed over."""
    return UpstreamError(
        f"Upstream '{shown(route.key)}' {what}",
        code=code,
        retryable=True,
        cause=cause,
        target=route.key,
        provider=route.provider,
    )


def choices_asked(req: CompletionRequest) -> int:
    """Choices an upstream call must answer: n per prompt it was sent."""
    prompts = len(req.prompt) if prompt_form(req.prompt) in ("texts", "token_lists") else 1
    return (req.n or 1) * prompts


def ignored_n(route: Route, asked: int, got: int) -> UpstreamError:
    """An upstream that answers one choice where `n` asked for several: the answer is not the one asked for.

    Not retried on that target (it will do the same), but another one may honour `n`; the target is not
    unhealthy for it.
    """
    return UpstreamError(
        f"Upstream '{shown(route.key)}' answered {got} choice(s) where the request asked for {asked}: it does not "
        "honour 'n' (send one request per choice, or use a target that takes 'n')",
        param="n",
        code="upstream_ignored_n",
        retryable=False,
        elsewhere=True,
        cools=False,
        cause="invalid_response",
        target=route.key,
        provider=route.provider,
    )


class _Numbered(Protocol):
    index: int


def answered(route: Route, choices: Sequence[_Numbered], asked: int, n: int | None, ignores_n: set[str]) -> None:
    """`choices` (of an answer to a call that asked for `asked` of them, `n` per prompt) as many as asked for and
    numbered 0 onwards (`in_order`); an upstream that answered fewer than an `n` above 1 asked for is remembered in
    `ignores_n` and refused (`ignored_n`). Completions and chat alike."""
    if n is not None and n > 1 and len(choices) < asked:
        ignores_n.add(route.key)
        raise ignored_n(route, asked, len(choices))
    in_order(route, choices, asked)


def in_order(route: Route, choices: Sequence[_Numbered], asked: int) -> None:
    """`choices` numbered 0 to `asked` - 1, each once, and put in that order where the upstream listed them in
    another; else a failed attempt (502, tried elsewhere). A choice numbered out of range or twice would reach the
    client as the answer to no prompt, or to two, and more choices than asked for are more than admission reserved."""
    if len(choices) == asked and all(c.index == i for i, c in enumerate(choices)):
        return
    if sorted(c.index for c in choices) == list(range(asked)):
        cast("list[_Numbered]", choices).sort(key=_INDEX)
        return
    raise failed_attempt(
        route,
        f"answered {len(choices)} choice(s) not numbered 0 to {asked - 1} once each",
        "invalid_upstream_response",
        "invalid_response",
    )


def in_range(route: Route, choices: Sequence[_Numbered], asked: int) -> None:
    """A stream's first choices numbered within the `asked` for: else a failed attempt before anything reached the
    client (tried elsewhere), as an unreadable first event is; later events are checked as they are relayed."""
    for c in choices:
        if not -1 < c.index < asked:
            raise failed_attempt(
                route, f"sent a choice numbered {c.index} of {asked}", "invalid_upstream_response", "invalid_response"
            )


def _tokens(n: int) -> int:
    return n if 0 <= n <= MAX_REPORTED_TOKENS else (0 if n < 0 else MAX_REPORTED_TOKENS)


_Details = TypeVar("_Details", CompletionTokensDetails, PromptTokensDetails)


def _sane(details: CompletionTokensDetails | PromptTokensDetails | None) -> bool:
    return details is None or all(v is None or 0 <= v <= MAX_REPORTED_TOKENS for v in msgspec.structs.astuple(details))


def _clamped(details: _Details | None) -> _Details | None:
    if details is None or _sane(details):
        return details
    return type(details)(*(None if v is None else _tokens(v) for v in msgspec.structs.astuple(details)))


def sane_usage(u: Usage) -> Usage:
    """Usage as the upstream reported it, unless a count (or a detail: cached, reasoning tokens) is negative or
    absurd (then clamped)."""
    p, c, t = u.prompt_tokens, u.completion_tokens, u.total_tokens
    cd, pd = u.completion_tokens_details, u.prompt_tokens_details
    if (
        0 <= p <= MAX_REPORTED_TOKENS
        and 0 <= c <= MAX_REPORTED_TOKENS
        and p + c <= t <= MAX_REPORTED_TOKENS
        and _sane(cd)
        and _sane(pd)
    ):
        return u  # the common case: no new struct
    p, c = _tokens(p), _tokens(c)
    # A total below its parts would undercount what rate limits and budgets are charged.
    return msgspec.structs.replace(
        u,
        prompt_tokens=p,
        completion_tokens=c,
        total_tokens=max(_tokens(t), p + c),
        completion_tokens_details=_clamped(cd),
        prompt_tokens_details=_clamped(pd),
    )
