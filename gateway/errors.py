"""Gateway errors: one tree, rendered per dialect at the edge.

    GatewayError (status, type, param, code)
    ├── InvalidRequestError          400  a field the client sent is wrong (param names it)
    │   └── UnsupportedParamError    400  the chosen provider cannot honour a field
    ├── AuthenticationError          401
    ├── PermissionDeniedError        403  the key may not use this model
    ├── ModelNotFoundError           404  unknown alias or vendor
    ├── ProviderUnavailableError     400  provider configured but not usable (missing key variable)
    ├── RateLimitError               429
    └── UpstreamError                502  the provider failed; status/body mapped by its adapter
        ├── UpstreamStatusError      the provider answered an error status
        ├── UpstreamConnectError     502  no connection / connection dropped
        └── UpstreamTimeoutError     504

Messages never include secrets or upstream request headers: they are shown to clients.
"""

from __future__ import annotations

from typing import Self

RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
# The longest wait an upstream's Retry-After (or reset header) may impose: it cools the target for every
# replica and is relayed to the client, so a broken or hostile upstream must not park either for days.
MAX_RETRY_AFTER_S = 3600.0


class GatewayError(Exception):
    status: int = 500
    type: str = "server_error"
    # Whether another attempt (same or other target) may succeed; None = decide by class.
    retryable: bool = False
    # A 429 that means an exhausted quota or spend limit: retrying cannot help.
    quota: bool = False
    # The prompt does not fit the model: only a larger-context fallback can help.
    context_window: bool = False
    # Only another target can help (an exhausted quota, the gateway's own credentials refused):
    # never retried on the same target, but the request moves on to an untried one.
    elsewhere: bool = False
    # Upstream calls made before giving up (set by the failover loop), for `x-gateway-attempts`.
    attempts: int | None = None
    # Whether a retryable failure says the target is unhealthy (a gateway-side quota does not).
    cools: bool = True
    # Extra response headers (rate-limit state on a 429).
    headers: dict[str, str] | None = None
    # Upstream text in it has been through gateway.scrub (secrets cut out, length capped).
    scrubbed: bool = False

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after
        if status is not None:
            self.status = status

    def with_message(self, message: str) -> Self:
        self.message = message
        self.args = (message,)
        return self


class InvalidRequestError(GatewayError):
    status = 400
    type = "invalid_request_error"


class UnsupportedParamError(InvalidRequestError):
    def __init__(self, param: str, provider: str) -> None:
        super().__init__(
            f"Parameter '{param}' is not supported by provider '{provider}'",
            param=param,
            code="unsupported_parameter",
        )


class AuthenticationError(GatewayError):
    status = 401
    type = "authentication_error"


class PermissionDeniedError(GatewayError):
    status = 403
    type = "permission_error"


class ModelNotFoundError(GatewayError):
    status = 404
    type = "invalid_request_error"

    def __init__(self, model: str) -> None:
        super().__init__(f"The model '{model}' does not exist", param="model", code="model_not_found")


class ProviderUnavailableError(GatewayError):
    status = 400
    type = "invalid_request_error"


class RateLimitError(GatewayError):
    status = 429
    type = "rate_limit_error"


class UpstreamError(GatewayError):
    status = 502
    type = "upstream_error"


class UpstreamStatusError(UpstreamError):
    """The provider answered with an error status; `upstream_status` keeps the original."""

    def __init__(
        self,
        message: str,
        *,
        upstream_status: int,
        provider: str,
        code: str | None = None,
        param: str | None = None,
        retry_after: float | None = None,
        should_retry: bool | None = None,
        quota: bool = False,
        context_window: bool = False,
    ) -> None:
        status, kind = _client_status(upstream_status)
        if retry_after is not None:
            retry_after = min(retry_after, MAX_RETRY_AFTER_S)
        super().__init__(message, param=param, code=code, status=status, retry_after=retry_after)
        self.type = kind
        self.upstream_status = upstream_status
        self.provider = provider
        self.quota = quota
        self.context_window = context_window
        self.elsewhere = quota or upstream_status in (401, 403)
        # The provider's own `x-should-retry` wins over the status; a quota never comes back by retrying.
        retryable = upstream_status in RETRYABLE_STATUSES if should_retry is None else should_retry
        self.retryable = retryable and not quota and not context_window


class UpstreamConnectError(UpstreamError):
    """Connecting failed, or the connection dropped before a complete answer."""

    retryable = True


class UpstreamTimeoutError(UpstreamError):
    status = 504
    type = "timeout_error"
    retryable = True


class AllTargetsCoolingError(GatewayError):
    """Every target is cooling down; `retry_after` is the soonest recovery."""

    def __init__(self, message: str, *, rate_limited: bool, retry_after: float) -> None:
        super().__init__(message, code="all_targets_cooling", retry_after=retry_after)
        self.status = 429 if rate_limited else 503
        self.type = "rate_limit_error" if rate_limited else "service_unavailable"


def _client_status(upstream: int) -> tuple[int, str]:
    """What the client sees for an upstream status.

    Client-caused 4xx pass through (the client must fix its request); 429 stays 429 so clients back off;
    provider auth failures become 502 because the client's own key was fine: it is the gateway's
    credentials that are wrong, and a 401 would wrongly tell the client to fix its key.
    """
    if upstream == 429:
        return 429, "rate_limit_error"
    if upstream in (401, 403):
        return 502, "upstream_error"
    if upstream in (400, 404, 409, 413, 422):
        return upstream if upstream != 404 else 400, "invalid_request_error"
    if upstream in (408, 504):
        return 504, "timeout_error"
    return 502, "upstream_error"
