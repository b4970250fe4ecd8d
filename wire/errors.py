"""Gateway errors: one tree, rendered per dialect at the edge.

    GatewayError (status, type, param, code)
    ├── InvalidRequestError          400  a field the client sent is wrong (param names it)
    │   └── UnsupportedParamError    400  the chosen provider cannot honour a field
    ├── AuthenticationError          401
    ├── PermissionDeniedError        403  the key may not use this model
    ├── ModelNotFoundError           404  unknown alias or vendor (an upstream 404 is rendered the same)
    ├── ProviderUnavailableError     400  provider configured but not usable (missing key variable)
    ├── RateLimitError               429
    └── UpstreamError                502  the provider failed; status/body mapped by its adapter
        ├── UpstreamStatusError      the provider answered an error status
        ├── UpstreamConnectError     502  the connection dropped, or the answer broke off
        │   └── UpstreamUnreachableError  502  nothing reached the upstream (refused, DNS, TLS)
        └── UpstreamTimeoutError     504

Messages never include secrets or upstream request headers: they are shown to clients.

Every error answer tells the official SDKs whether to retry it (`x-should-retry`, see `client_retry`):
the gateway has already retried what retrying could help, so only a wait it could not afford is left
to the client.
"""

from __future__ import annotations

from typing import Self

RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
# The longest wait an upstream's Retry-After (or reset header) may impose: it cools the target for every
# replica and is relayed to the client, so a broken or hostile upstream must not park either for days.
MAX_RETRY_AFTER_S = 3600.0
# The longest Retry-After every official openai SDK waits for (openai-python 1.x: 60 s; later ones 120 s).
# Past it they retry after their own short backoff, long before the wait is over, or not at all.
CLIENT_RETRY_AFTER_MAX_S = 60.0
# Upstream statuses a retry of the same target may cure (`retries.same_target`): overload, a failed
# instance, a rate limit. 408 and 504 are timeouts: the target is slow, the next one may not be.
SAME_TARGET_STATUSES = frozenset({409, 429, 500, 502, 503, 529})


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
    # Whether a retry of the same target, after its Retry-After or a backoff, may succeed (a transient 5xx,
    # a dropped connection, a 429): the failover loop does that `retries.same_target` times before moving
    # on. Timeouts and unreachable targets move on at once.
    same_target: bool = False
    # Whether the client's own retry, after `retry_after`, may succeed where the gateway's could not (a
    # wait longer than its retry budget, every target cooling, the gateway's own rate limit).
    retry_later: bool = False
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
    # The gateway's own limits: room comes back after Retry-After (a daily budget's wait is too long).
    retry_later = True


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
        missing = upstream_status == 404
        if missing:
            # vLLM, OpenAI, Ollama, Azure (a deployment), Anthropic, Gemini: a 404 to a completion call says
            # the target does not serve that model. Clients get what an unknown alias gets, so the SDKs raise
            # NotFoundError; the upstream's own words stay in the message.
            code, param = "model_not_found", "model"
        super().__init__(message, param=param, code=code, status=status, retry_after=retry_after)
        self.type = kind
        self.upstream_status = upstream_status
        self.provider = provider
        self.quota = quota
        self.context_window = context_window
        # Another target of the alias, or a fallback, may serve the model; this one will not, however often
        # asked. Not a sign of ill health either: a client's typo in `vendor/model` must not cool anything.
        self.elsewhere = quota or missing or upstream_status in (401, 403)
        self.cools = not missing
        # The provider's own `x-should-retry` wins over the status; a quota never comes back by retrying.
        retryable = upstream_status in RETRYABLE_STATUSES if should_retry is None else should_retry
        self.retryable = retryable and not quota and not context_window
        self.same_target = self.retryable and upstream_status in SAME_TARGET_STATUSES


class UpstreamConnectError(UpstreamError):
    """The connection dropped before a complete answer, or the answer was not readable HTTP."""

    retryable = True
    same_target = True


class UpstreamUnreachableError(UpstreamConnectError):
    """Nothing reached the upstream (connection refused, DNS, TLS handshake): a silent route.

    Clients see the same code as any connection failure; only the failover loop tells them apart: a
    target that cannot be reached now is not retried, the request moves on to the next one at once.
    """

    same_target = False

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message, code=UpstreamConnectError.__name__)


class UpstreamTimeoutError(UpstreamError):
    status = 504
    type = "timeout_error"
    retryable = True
    # A target that did not answer in time is slow or gone: the next one is tried at once.
    same_target = False


class AllTargetsCoolingError(GatewayError):
    """Every target is cooling down; `retry_after` is the soonest recovery."""

    def __init__(self, message: str, *, rate_limited: bool, retry_after: float) -> None:
        super().__init__(message, code="all_targets_cooling", retry_after=retry_after)
        self.status = 429 if rate_limited else 503
        self.type = "rate_limit_error" if rate_limited else "service_unavailable"
        # No upstream was called: after the soonest recovery a client's retry gets a target.
        self.retry_later = True


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
        return upstream, "invalid_request_error"
    if upstream in (408, 504):
        return 504, "timeout_error"
    return 502, "upstream_error"


def client_retry(exc: GatewayError) -> bool:
    """The answer's `x-should-retry`: whether the client's own retry may help (the official SDKs obey it).

    The gateway has already retried (and failed over) as far as its policy allows, so an SDK's retry on top
    only multiplies the calls and the wait. What is left for the client is a wait the gateway did not take:
    a Retry-After past its retry budget, every target cooling, its own rate limit, or any retry at all when
    it was configured to make none. A wait must be one the SDKs honour, or they would come back before it
    ends.
    """
    return exc.retry_later and (exc.retry_after is None or exc.retry_after <= CLIENT_RETRY_AFTER_MAX_S)
