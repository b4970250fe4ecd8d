"""OpenTelemetry traces of the completion path: a server span per request, a client span per upstream attempt.

Off by default, and then free (nothing imports opentelemetry); on with `tracing.enabled: true` or
`OTEL_TRACES_EXPORTER=otlp` (the `otel` extra). A client's `traceparent` becomes the parent (or, with
`tracing.client_context: link`, a link from a new trace) and every attempt sends its own upstream.
Variables, propagation and attributes: docs/observability.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final, Protocol
from urllib.parse import urlsplit

import msgspec

if TYPE_CHECKING:  # only for the types: the running code imports opentelemetry when tracing is on
    from opentelemetry.trace import Span, Tracer

    from gateway.config import LoadedConfig
    from gateway.ops.metrics import Record
    from providers.base import Capabilities, Endpoint, UpstreamRequest

OPERATION: Final = "text_completion"


class Target(Protocol):
    """What an attempt's span reads of its route (`gateway.upstream.plan.Route`, a wing above this one)."""

    @property
    def key(self) -> str: ...

    @property
    def provider(self) -> str: ...

    @property
    def adapter(self) -> Capabilities: ...

    @property
    def endpoint(self) -> Endpoint: ...


# The request being traced in this task (and the tasks it starts); never set while tracing is off.
_REQUEST: ContextVar[_Request | None] = ContextVar("gateway_trace_request", default=None)
# The attempt span of the upstream call running in this task: its traceparent is what goes upstream.
_ATTEMPT: ContextVar[_Attempt | None] = ContextVar("gateway_trace_attempt", default=None)


def wanted(loaded: LoadedConfig) -> bool:
    """Whether this config and environment turn tracing on."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    return loaded.config.tracing.enabled or exporter == "otlp"


_TRACERS: dict[tuple[tuple[str, str], ...], Tracing] = {}


def from_config(loaded: LoadedConfig) -> Tracing | None:
    """The process's tracing for this environment, or None when off (then opentelemetry is never imported).

    One per distinct set of `OTEL_*` variables, so a config reload keeps the exporter (and its queue of
    spans) instead of starting another.
    """
    if not wanted(loaded):
        return None
    key = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("OTEL_")))
    found = _TRACERS.get(key)
    if found is None:
        found = _TRACERS[key] = Tracing()
    return found


class Tracing:
    """The SDK, an OTLP/HTTP exporter behind a batch processor, and the W3C propagator."""

    def __init__(self) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        named = "OTEL_SERVICE_NAME" in os.environ or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
        # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the default only fills a gap.
        resource = Resource.create({} if named else {"service.name": "completions-gateway"})
        self.provider = TracerProvider(resource=resource)  # the sampler comes from OTEL_TRACES_SAMPLER
        # The exporter takes its endpoint, headers, timeout and compression from OTEL_EXPORTER_OTLP_*.
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.tracer: Tracer = self.provider.get_tracer("completions-gateway")
        self.propagator = TraceContextTextMapPropagator()

    def begin(
        self, headers: Mapping[str, str], dialect: str, path: str, link: bool = False, operation: str = OPERATION
    ) -> _Request:
        """Start the request's server span: the child of the client's `traceparent` when it sent a valid one,
        or with `link` (`tracing.client_context: link`) the root of a new trace with a link to it."""
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.trace import Link, SpanKind

        parent = self.propagator.extract(headers)
        links: list[Link] = []
        if link:
            client = trace.get_current_span(parent).get_span_context()
            if client.is_valid:
                links.append(Link(client))
            # A root: the gateway's sampler decides, and nothing of the client's context goes upstream.
            parent = Context()
        span = self.tracer.start_span(
            f"POST {path}",
            context=parent,
            links=links,
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": "POST",
                "url.path": path,
                "gen_ai.operation.name": operation,
                "gateway.dialect": dialect,
            },
        )
        request = _Request(self, span, trace.set_span_in_context(span, parent), operation)
        request.token = _REQUEST.set(request)
        return request

    def shutdown(self) -> None:
        self.provider.shutdown()


class _Attempt:
    """One upstream attempt's client span, current in its task until `close`."""

    __slots__ = ("request", "span", "headers", "token")

    def __init__(self, request: _Request, span: Span, operator_headers: Mapping[str, str]) -> None:
        self.request = request
        self.span = span
        self.headers = operator_headers  # the provider's configured headers: what `outgoing` must not replace
        self.token = _ATTEMPT.set(self)

    def succeeded(self, value: object) -> None:
        """The answer's GenAI attributes (a stream's usage and finish reasons come with the request's end)."""
        request = self.request
        request.served = True
        from wire.schema import Completion

        if not isinstance(value, Completion):
            return
        reasons: list[str] = [c.finish_reason or "" for c in value.choices]
        request.finish_reasons = reasons
        attrs: dict[str, Any] = {"gen_ai.response.finish_reasons": reasons}
        if value.id:
            attrs["gen_ai.response.id"] = value.id
        if value.usage is not None:
            attrs["gen_ai.usage.input_tokens"] = value.usage.prompt_tokens
            attrs["gen_ai.usage.output_tokens"] = value.usage.completion_tokens
        self.span.set_attributes(attrs)

    def close(self, error: BaseException | None) -> None:
        """End the span, failed when `error` is set (the attempt's exception, if it raised one)."""
        from opentelemetry.trace import Status, StatusCode

        from wire.errors import GatewayError

        span = self.span
        if isinstance(error, GatewayError):
            span.set_attribute("error.type", error.code or type(error).__name__)
            if error.cause is not None:
                span.set_attribute("gateway.failure.cause", error.cause)
            span.set_status(Status(StatusCode.ERROR, error.message))
        elif error is not None:
            span.set_attribute("error.type", type(error).__name__)
            span.set_status(Status(StatusCode.ERROR))
        _ATTEMPT.reset(self.token)
        self.request.in_flight -= 1
        span.end()


class _Request:
    """One traced request: its server span and what its attempts so far were."""

    def __init__(self, tracing: Tracing, span: Span, context: Any, operation: str = OPERATION) -> None:
        self.tracing = tracing
        self.operation = operation  # GenAI's `gen_ai.operation.name`: text_completion or chat
        self.span = span
        self.context = context
        self.token: Any = None
        self.tried: set[str] = set()
        self.attempts = 0
        self.in_flight = 0
        self.served = False
        self.finish_reasons: list[str] = []

    def _kind(self, route: Target) -> str:
        if self.served:
            return "resume"  # a stream that broke after it started, continued from what was sent
        if self.attempts == 0:
            return "first"
        if self.in_flight:
            return "hedge"  # started while another attempt of the same request is still waiting
        return "retry" if route.key in self.tried else "failover"

    def attempt(self, route: Target) -> _Attempt:
        from opentelemetry.trace import SpanKind

        # The adapter declares its semantic-conventions name; a kind without one goes by its own name.
        kind = getattr(route.adapter, "genai_provider", None) or getattr(route.adapter, "kind", route.provider)
        endpoint = route.endpoint
        span = self.tracing.tracer.start_span(
            f"{self.operation} {endpoint.model}",
            context=self.context,
            kind=SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": self.operation,
                "gen_ai.provider.name": kind,
                "gen_ai.request.model": endpoint.model,
                "gateway.provider": route.provider,
                "gateway.target": route.key,
                "gateway.attempt": self.attempts + 1,
                "gateway.attempt.kind": self._kind(route),
            },
        )
        self.attempts += 1
        self.tried.add(route.key)
        self.in_flight += 1
        return _Attempt(self, span, {k.lower(): v for k, v in endpoint.headers.items()})

    def end(self, rec: Record) -> None:
        """End the server span with what the request did (the Record the log line and metrics read)."""
        from opentelemetry.trace import Status, StatusCode

        span = self.span
        attrs: dict[str, Any] = {
            "http.response.status_code": rec.status,
            "gen_ai.request.model": rec.model,
            "gateway.attempts": rec.attempts,
            "gateway.stream": rec.stream,
            # What the client, the log line and an error answer carry: the way from a ticket to the trace.
            "gateway.request_id": rec.request_id,
        }
        if rec.provider:
            attrs["gateway.provider"] = rec.provider
            attrs["gateway.target"] = rec.target
        if rec.usage is not None:
            attrs["gen_ai.usage.input_tokens"] = rec.usage.prompt_tokens
            attrs["gen_ai.usage.output_tokens"] = rec.usage.completion_tokens
        if self.finish_reasons:
            attrs["gen_ai.response.finish_reasons"] = self.finish_reasons
        if rec.error_code is not None:
            attrs["error.type"] = rec.error_code
        if rec.cause is not None:
            attrs["gateway.failure.cause"] = rec.cause
        if rec.batch_id is not None:
            attrs["gateway.batch_id"] = rec.batch_id
        span.set_attributes(attrs)
        if rec.status >= 500:
            # HTTP semantic conventions: a server span is an error only for a 5xx; a 4xx is the client's.
            span.set_status(Status(StatusCode.ERROR, rec.error_code or str(rec.status)))
        span.end()
        if self.token is not None:
            _REQUEST.reset(self.token)
            self.token = None


def attempt(route: Target) -> _Attempt | None:
    """Start the span of one upstream attempt; None when the request is not traced (the only cost when off).

    The caller reports the answer (`succeeded`) and always ends it (`close`), in the same task.
    """
    request = _REQUEST.get()
    return None if request is None else request.attempt(route)


class _Wait:
    """A request's wait for a slot in a server's queue (gateway/queue), as an internal span."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def close(self, error: BaseException | None) -> None:
        from opentelemetry.trace import Status, StatusCode

        from wire.errors import GatewayError

        if error is not None:
            code = error.code if isinstance(error, GatewayError) else None
            self.span.set_attribute("error.type", code or type(error).__name__)
            self.span.set_status(Status(StatusCode.ERROR))
        self.span.end()


def wait(server: str, priority: str) -> _Wait | None:
    """Start the span of a wait in a server's queue; None when the request is not traced."""
    request = _REQUEST.get()
    if request is None:
        return None
    span = request.tracing.tracer.start_span(
        "queue wait",
        context=request.context,
        attributes={"gateway.queue.server": server, "gateway.queue.priority": priority},
    )
    return _Wait(span)


def outgoing(req: UpstreamRequest) -> UpstreamRequest:
    """`req` with the running attempt's `traceparent` (and `tracestate`) when one is traced.

    The operator's own header of the same name wins; a client's (from `inference_extra_headers`) does not.
    """
    current = _ATTEMPT.get()
    if current is None:
        return req
    from opentelemetry import trace

    carrier: dict[str, str] = {}
    current.request.tracing.propagator.inject(carrier, context=trace.set_span_in_context(current.span))
    headers = {k: v for k, v in req.headers.items() if k.lower() not in carrier or k.lower() in current.headers}
    for name, value in carrier.items():
        if name not in current.headers:
            headers[name] = value
    parts = urlsplit(req.url)
    if parts.hostname:
        default = 443 if parts.scheme == "https" else 80
        current.span.set_attributes({"server.address": parts.hostname, "server.port": parts.port or default})
    return msgspec.structs.replace(req, headers=headers)
