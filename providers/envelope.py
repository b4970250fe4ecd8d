"""An error envelope inside a `200`: which HTTP status the upstream meant by it.

Some upstreams (proxies in front of OpenAI, vLLM and TGI behind load balancers, LiteLLM-style routers)
answer `200` with `{"error": {...}}` instead of an answer, and some report a failure as the first event
of a `200` stream. Relaying that as an empty completion would hide the failure from retries, failover
and the client, so the adapter maps it to the status its words mean and handles it like that status:
quota and rate limits -> 429, overload and server errors -> 503 / 500 (retried, failed over), an
invalid request -> 400, refused credentials -> 401. Words nobody knows mean a server error.
"""

from __future__ import annotations

from typing import Final

_QUOTA: Final = frozenset(
    {"insufficient_quota", "billing_hard_limit_reached", "spend_limit_reached", "billing_error", "quota_exceeded"}
)
_RATE: Final = frozenset(
    {
        "rate_limit_exceeded",
        "rate_limit_error",
        "rate_limited",
        "too_many_requests",
        "resource_exhausted",
        "throttlingexception",
        "requests",
        "tokens",
    }
)
_OVERLOADED: Final = frozenset(
    {"overloaded", "overloaded_error", "service_unavailable", "unavailable", "engine_overloaded", "model_overloaded"}
)
_INVALID: Final = frozenset(
    {
        "invalid_request_error",
        "invalid_request",
        "badrequesterror",
        "bad_request",
        "invalid_argument",
        "validation",
        "validation_error",
        "validationexception",
        "context_length_exceeded",
        "invalid_value",
        "failed_precondition",
        "content_filter",  # Azure's code for a filtered prompt, which it answers with a 400
    }
)
_NOT_FOUND: Final = frozenset({"not_found_error", "not_found", "model_not_found", "notfounderror"})
_AUTH: Final = frozenset(
    {
        "authentication_error",
        "invalid_api_key",
        "unauthenticated",
        "unauthorized",
        "permission_error",
        "permission_denied",
        "accessdeniedexception",
    }
)


def envelope_status(*words: object) -> int:
    """The HTTP status an error envelope's code / type / status words mean (the first word that says)."""
    for word in words:
        if isinstance(word, int) and not isinstance(word, bool):
            if 400 <= word <= 599:
                return word
            continue
        if not isinstance(word, str) or not word:
            continue
        w = word.strip().lower()
        if w.isdigit() and 400 <= int(w) <= 599:
            return int(w)
        if w in _QUOTA or w in _RATE:
            return 429
        if w in _OVERLOADED:
            return 503
        if w in _INVALID:
            return 400
        if w in _NOT_FOUND:
            return 404
        if w in _AUTH:
            return 401
    return 500


class Unreadable(ValueError):
    """An upstream answer of the wrong shape (a completion without choices): a failed attempt, 502."""


__all__ = ["Unreadable", "envelope_status"]
