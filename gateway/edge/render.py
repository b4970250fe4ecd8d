"""The one error renderer: status, headers and body of an error answer in a dialect's shape.

Every route answers errors through `render`: the raw endpoints (completion, tokenizer, and the body limit
in `gateway.edge.app.Front`) send its result as two ASGI messages, the Litestar routes return it as a
`Response` (`error_response`). So an exception looks the same on the wire whichever route raised it; only
the dialect (the path's error shape, gateway/path/dialects.py) differs.
"""

from __future__ import annotations

from typing import Final

from litestar import Response

from gateway.path.dialects import Dialect
from wire.errors import GatewayError, client_retry

JSON: Final = "application/json"


def error_headers(exc: GatewayError) -> dict[str, str]:
    # Every error answer says whether to retry it, so the SDKs do not retry what the gateway already did.
    headers: dict[str, str] = {"x-should-retry": "true" if client_retry(exc) else "false"}
    if exc.retry_after is not None:
        # The same wait twice: `retry-after-ms` exact (the SDKs prefer it), `retry-after` rounded up.
        headers["retry-after"] = str(max(int(exc.retry_after + 0.999), 0))
        headers["retry-after-ms"] = str(max(int(exc.retry_after * 1000 + 0.999), 0))
    if exc.attempts is not None:
        headers["x-gateway-attempts"] = str(exc.attempts)
    if exc.target is not None:
        # The target that failed, in the headers that name the one that served a success.
        headers["x-gateway-model"] = exc.target
    if exc.provider is not None:
        headers["x-gateway-provider"] = exc.provider
    if exc.headers:
        headers.update(exc.headers)
    return headers


def render(dialect: Dialect, exc: GatewayError, request_id: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, JSON body) of the error answer; the content type is always JSON."""
    status, body = dialect.error(exc)
    headers = error_headers(exc)
    if request_id is not None:
        headers["x-request-id"] = request_id
    return status, headers, body


def error_response(
    dialect: Dialect, exc: GatewayError, request_id: str | None = None, extra: dict[str, str] | None = None
) -> Response[bytes]:
    """`render` as a Litestar response, for the Litestar routes and their exception handlers."""
    status, headers, body = render(dialect, exc, request_id)
    if extra:
        headers.update(extra)
    return Response(body, status_code=status, media_type=JSON, headers=headers)


__all__ = ["JSON", "error_headers", "error_response", "render"]
