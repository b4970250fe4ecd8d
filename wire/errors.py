"""Gateway errors: one tree of `GatewayError` classes (status, type, param, code), rendered per dialect at
the edge.

An error carries everything the failover loop, the renderer, the log line and the metrics read from the
moment it is built (`evolve` makes a changed copy), and its message never includes secrets: it is shown to
clients. The class tree, `x-should-retry` and the code list: docs/dialects.md.
"""

from __future__ import annotations

import re
from typing import Final, Self

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
# The most of a client's own text (an id, a name, a batch line's value) an error quotes: the text may be
# megabytes long, and a batch keeps its errors and sends them with every read.
SHOWN_CHARS: Final = 64


def shown(text: str, most: int = SHOWN_CHARS) -> str:
    """`text` as an error quotes it: cut to `most` characters, saying so."""
    return text if len(text) <= most else text[:most] + "..."


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
    # Raised before any upstream call of the attempt (a full server, a field the target's kind refuses): the
    # failover loop does not count the attempt.
    no_call: bool = False
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
    # Upstream text in it has been through gateway.upstream.scrub (secrets cut out, length capped).
    scrubbed: bool = False

    # The upstream that failed (`provider/model[/deployment]` and its provider), when one did.
    target: str | None = None
    provider: str | None = None
    # Why an upstream call failed (a `CAUSES` key, or `http_<status>`); None for the gateway's own refusals.
    cause: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
        retry_after: float | None = None,
        type: str | None = None,
        retryable: bool | None = None,
        same_target: bool | None = None,
        cools: bool | None = None,
        elsewhere: bool | None = None,
        retry_later: bool | None = None,
        headers: dict[str, str] | None = None,
        target: str | None = None,
        provider: str | None = None,
        cause: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after
        # Unset flags keep the class's default: only what differs from it is stored on the instance.
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type
        if retryable is not None:
            self.retryable = retryable
        if same_target is not None:
            self.same_target = same_target
        if cools is not None:
            self.cools = cools
        if elsewhere is not None:
            self.elsewhere = elsewhere
        if retry_later is not None:
            self.retry_later = retry_later
        if headers is not None:
            self.headers = headers
        if target is not None:
            self.target = target
        if provider is not None:
            self.provider = provider
        if cause is not None:
            self.cause = cause

    def detached(self) -> Self:
        """This error with no traceback, nor any on the exceptions chained to it (its cause, its context).

        For an error a frame keeps after its `except` block: a traceback holds the frames it passed, and on
        Python 3.12 and later a finished callee's frame holds its caller's, so the frame that keeps the error
        would be in a cycle with it, which only the collector frees. Returns `self`, changed in place.
        """
        chained: list[BaseException | None] = [self]
        seen: set[int] = set()  # a cause is often the context too, and a chain set by hand may loop
        while chained:
            exc = chained.pop()
            if exc is not None and id(exc) not in seen:
                seen.add(id(exc))
                exc.__traceback__ = None
                chained += (exc.__cause__, exc.__context__)
        return self

    def evolve(
        self,
        *,
        attempts: int | None = None,
        retry_later: bool | None = None,
        target: str | None = None,
        provider: str | None = None,
        message: str | None = None,
        code: str | None = None,
        param: str | None = None,
        scrubbed: bool | None = None,
    ) -> Self:
        """A copy that also says what a later stage learnt (None keeps the value); `self` is left as built.

        The failover loop adds the attempts it made and whether a client's retry may help; an attempt adds
        the target to an error whose maker did not know it (an adapter's status mapping); the scrubber
        gives upstream text with the gateway's secrets cut out.
        """
        new: Self = BaseException.__new__(self.__class__, *self.args)  # no __init__: its state is copied
        new.__dict__.update(self.__dict__)
        new.__traceback__ = self.__traceback__
        if attempts is not None:
            new.attempts = attempts
        if retry_later is not None:
            new.retry_later = retry_later
        if target is not None:
            new.target = target
        if provider is not None:
            new.provider = provider
        if message is not None:
            new.message = message
            new.args = (message,)
        if code is not None:
            new.code = code
        if param is not None:
            new.param = param
        if scrubbed is not None:
            new.scrubbed = scrubbed
        return new


class InvalidRequestError(GatewayError):
    status = 400
    type = "invalid_request_error"


class UnsupportedParamError(InvalidRequestError):
    # Refused by one target before any call: another target of the plan may honour the field, and the
    # refusal says nothing of this target's health.
    elsewhere = True
    cools = False
    no_call = True

    def __init__(self, param: str, provider: str, message: str | None = None) -> None:
        super().__init__(
            message or f"Parameter '{param}' is not supported by provider '{provider}'",
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
        super().__init__(f"The model '{shown(model)}' does not exist", param="model", code="model_not_found")


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
        if context_window:
            # One code for one meaning, whatever the server called it (its words stay in the message).
            code = "context_length_exceeded"
        super().__init__(
            message,
            param=param,
            code=code,
            status=status,
            retry_after=retry_after,
            type=kind,
            provider=provider,
            cause=f"http_{upstream_status}",
        )
        self.upstream_status = upstream_status
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


_SNAKE: Final = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")
_CAMEL: Final = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SEPARATORS: Final = re.compile(r"[-_.]+")
_CODE_CHARS: Final = 64  # longer is not a code but text


def snake_code(code: object) -> str | None:
    """An upstream's error code as snake_case (`ThrottlingException` -> `throttling_exception`), or None when
    it is not a word-like code (a number, `null`, free text: anything with a space or punctuation)."""
    if not isinstance(code, str) or not code or len(code) > _CODE_CHARS:
        return None
    if _SNAKE.fullmatch(code):
        return code
    snake = _SEPARATORS.sub("_", _CAMEL.sub("_", code).lower()).strip("_")
    return snake if _SNAKE.fullmatch(snake) else None


class UpstreamConnectError(UpstreamError):
    """The connection dropped before a complete answer, or the answer was not readable HTTP."""

    retryable = True
    same_target = True


class UpstreamUnreachableError(UpstreamConnectError):
    """Nothing reached the upstream (connection refused, DNS, TLS handshake): a silent route.

    Only the failover loop treats it apart: a target that cannot be reached now is not retried, the
    request moves on to the next one at once.
    """

    same_target = False


class UpstreamTimeoutError(UpstreamError):
    status = 504
    type = "timeout_error"
    retryable = True
    # A target that did not answer in time is slow or gone: the next one is tried at once.
    same_target = False


class AllTargetsCoolingError(GatewayError):
    """Every target is cooling down; `retry_after` is the soonest recovery."""

    def __init__(self, message: str, *, rate_limited: bool, retry_after: float) -> None:
        super().__init__(
            message,
            code="all_targets_cooling",
            retry_after=retry_after,
            status=429 if rate_limited else 503,
            type="rate_limit_error" if rate_limited else "service_unavailable",
            # No upstream was called: after the soonest recovery a client's retry gets a target.
            retry_later=True,
        )


# Why an upstream call failed, as the transports (gateway/upstream/h1.py, .../httpx_transport.py) classify it.
# Each is the log line's `cause`, the `cause` label of `gateway_upstream_failures_total` and, prefixed with
# `upstream_`, the answer's `code`; the text is what the client's message says after "Upstream 'p' ".
CAUSES: Final[dict[str, str]] = {
    "dns_failure": "could not be reached: its host name does not resolve",
    "connection_refused": "could not be reached: the connection was refused",
    "network_unreachable": "could not be reached: no route to its address",
    "tls_verification_failed": "could not be reached: its TLS certificate is not trusted",
    "tls_error": "could not be reached: the TLS handshake failed",
    "connect_failed": "could not be reached",
    "connect_timeout": "timed out connecting (timeouts.connect_ms)",
    "pool_timeout": "timed out waiting for a free connection (max_connections)",
    "first_byte_timeout": "timed out waiting for its answer (timeouts.first_byte_ms)",
    "read_timeout": "timed out between two reads of its answer (timeouts.first_byte_ms)",
    "total_timeout": "timed out (timeouts.total_ms or inference_timeout)",
    "connection_reset": "reset the connection",
    "connection_closed": "closed the connection",
    "malformed_response": "sent a malformed response",
    "truncated_response": "sent a truncated response",
    "unsendable_request": "was not sent the request: a header or the URL is not valid HTTP",
}
_UNREACHABLE: Final = frozenset(
    {
        "dns_failure",
        "connection_refused",
        "network_unreachable",
        "tls_verification_failed",
        "tls_error",
        "connect_failed",
    }
)
TIMEOUTS: Final = frozenset({"connect_timeout", "pool_timeout", "first_byte_timeout", "read_timeout", "total_timeout"})


def upstream_failure(cause: str, provider: str, target: str | None) -> UpstreamError:
    """The error for a transport failure: its class by what the failover loop does with it, its code by cause."""
    what = CAUSES.get(cause)
    if what is None:
        cause, what = "connect_failed", CAUSES["connect_failed"]
    cls: type[UpstreamError]
    if cause in TIMEOUTS:
        cls = UpstreamTimeoutError
    elif cause in _UNREACHABLE:
        cls = UpstreamUnreachableError
    else:
        cls = UpstreamConnectError
    # The target (`provider/model[/deployment]`) names the provider too; without one, the provider alone.
    message = f"Upstream '{shown(target) if target else provider}' {what}"
    return cls(message, code=f"upstream_{cause}", cause=cause, provider=provider, target=target)


# Every `code` the gateway itself puts in an answer, with when. Upstream status errors keep the provider's
# own code (OpenAI's `rate_limit_exceeded`, ...), which is not the gateway's to list.
CODES: Final[dict[str, str]] = {
    "invalid_json": "the body is not JSON, or not an object",
    "invalid_utf8": "a string in the body is not valid UTF-8",
    "unknown_parameter": "a field the request schema does not have",
    "missing_required_parameter": "a required field is absent",
    "invalid_value": "a field's value is out of range or of the wrong type",
    "too_deeply_nested": "a JSON value nests deeper than the gateway reads",
    "unsupported_parameter": "the chosen provider cannot honour a field",
    "unsupported_endpoint": "the chosen provider's kind does not serve this endpoint (chat) through the gateway",
    "request_too_large": "the body is larger than caps.request_body_bytes (413)",
    "provider_unavailable": "the provider is configured but cannot be called (its key variable is unset)",
    "missing_api_key": "no key was sent (401)",
    "invalid_api_key": "the key is wrong (401)",
    "model_not_allowed": "the key's `models` patterns exclude the model (403)",
    "team_undeclared": "a runtime key whose team the config in force does not declare, refused until it is "
    "declared again (403; docs/ledger.md)",
    "model_not_found": "unknown alias or vendor, or the upstream does not serve the model (404)",
    "model_mismatch": "a tokenizer route's model differs from its scoped path",
    "tokenizer_not_available": "the provider has no tokenizer routes (404)",
    "context_length_exceeded": "the prompt (and max_tokens) does not fit the model's context window, whatever "
    "the upstream called it (400)",
    "rate_limit_exceeded": "a configured rate limit (429)",
    "provider_quota": "a provider or deployment quota of the config (429)",
    "invalid_priority": "the `x-gateway-priority` header is not high, normal or low (400)",
    "priority_not_allowed": "the `x-gateway-priority` asked is above the key's `max_priority` (403)",
    "queue_full": "the queue of a server with `max_concurrency` already holds `queue.max_depth` requests (429)",
    "queue_timeout": "the request waited `queue.max_wait_ms` for a slot of a server with `max_concurrency` (429)",
    "server_saturated": "a server was at its `max_concurrency` and the target with room failed too (429)",
    "budget_exceeded": "the key's daily budget is spent, or with a ledger its monthly or its team's (429)",
    "key_exists": "a runtime key's name is taken, by a runtime key or one in the config (409; docs/ledger.md)",
    "too_many_keys": "the team holds, or made in the last 24 hours, `teams.<name>.max_keys` keys (409)",
    "too_many_secrets": "the key keeps 16 earlier secrets in their grace already: rotate with `grace_s` 0 (409)",
    "beyond_team": "a team admin's new key asks for another team, or more than its team's budgets, weight or "
    "max_priority (403; docs/security.md)",
    "operator_only": "a team admin's key on an admin route that is the operator's alone (403; docs/security.md)",
    "ledger_unavailable": "the ledger's database cannot be reached for a key or report request (503)",
    "batches_need_ledger": "a Batch API route on a gateway without `ledger:` (404)",
    "file_too_large": "an uploaded batch input file over `batches.max_file_bytes` (413)",
    "upload_timeout": "an upload of a batch input file still arriving a day after it began (408)",
    "too_many_files": "the key holds `batches.max_files` files already (409)",
    "too_many_bytes": "the upload would take the key's files past `batches.max_key_bytes` (409)",
    "too_many_batches": "the key has `batches.max_batches` batches not ended (409)",
    "cache_miss": "`Cache-Control: only-if-cached` and no cached answer (504; docs/cache.md)",
    "invalid_cache_control": "a `Cache-Control` directive the cache cannot read (`max-age` not a number)",
    "exceeds_token_limit": "the request alone is larger than a token limit",
    "exceeds_request_limit": "an emulated fan-out makes more upstream calls than a provider's request limit allows",
    "rate_limiter_unavailable": "the shared limiter (Redis) cannot be reached and limits fail closed (503)",
    "all_targets_cooling": "every target is cooling down after failures (429 or 503)",
    "replicas_draining": "every replica of the model's provider is draining (503)",
    "deadline_exceeded": "the request's own deadline passed between attempts (504)",
    "invalid_upstream_response": "the upstream's answer could not be read (502)",
    "upstream_stream_ended_early": (
        "the upstream ended a stream before its end, or answered a choice without a finish_reason (502)"
    ),
    "upstream_ignored_n": "the upstream answered fewer choices than 'n' asked for (502)",
    "unsupported_logprobs_shape": "the upstream's logprobs cannot carry what was asked (echoed prompt) (502)",
    "upstream_event_too_large": "one upstream stream event is larger than caps.upstream_event_bytes (502)",
    "upstream_stream_idle": (
        "an upstream stream sent more than caps.upstream_idle_stream_bytes, or went on longer than"
        " timeouts.stream_idle_ms, with nothing for the client (502)"
    ),
    "upstream_answer_too_large": (
        "the upstream's answer is larger than a caps.upstream_* cap, or came after too many interim answers (502)"
    ),
    "generation_error": (
        "the upstream reported that the generation broke off (Mistral's finish_reason 'error', vLLM's 'abort')"
    ),
    "guided_output_invalid": "emulated guided decoding found no valid answer within guided_retries",
    "client_closed_request": "log only: the client left before the answer ended (499)",
    "shutdown_deadline_exceeded": "the server was draining and cut the request at server.shutdown_grace_ms (503)",
    "internal_error": "a gateway bug; the log has the traceback (500)",
    "not_found": "no such route (404)",
    "method_not_allowed": "the route does not take this HTTP method (405)",
    "invalid_request": "the HTTP request itself is malformed (400)",
    **{f"upstream_{cause}": f"the upstream {what}" for cause, what in CAUSES.items()},
}


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
