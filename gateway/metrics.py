"""Prometheus metrics, correct with several workers.

With one process the values live in this process's registry. `python -m gateway serve --workers N`
sets `PROMETHEUS_MULTIPROC_DIR` before starting the workers, so prometheus_client keeps every
worker's values in files there and `GET /metrics`, whichever worker answers, reads them all.

Label values are bounded: `model` is the alias or the resolved `provider/model[/deployment]` (or
`unknown` for a model that did not resolve), never a raw client string beyond what the config
routes, so a client cannot grow the series without limit.
"""

from __future__ import annotations

import os
from typing import Final, NamedTuple

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.schema import Usage

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_OVERHEAD = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)


class Record(msgspec.Struct):
    """What one request did, filled in by the pipeline and read when the answer (or stream) ends."""

    request_id: str
    dialect: str
    key: str | None = None
    model: str = "unknown"
    provider: str = ""
    target: str = ""
    attempts: int = 0
    fallback: bool = False  # served by one of the alias's fallbacks rather than its own targets
    status: int = 200
    stream: bool = False
    usage: Usage | None = None
    # Time spent inside the failover loop (upstream calls and retry waits); a stream: to its first event.
    upstream_s: float = 0.0
    error_code: str | None = None
    prompt: str | None = None  # only when the config turns prompt logging on
    completion: str | None = None


class _Children(NamedTuple):
    requests: Counter
    latency: Histogram
    upstream: Histogram
    ttft: Histogram
    prompt_tokens: Counter
    completion_tokens: Counter


class Metrics:
    def __init__(self) -> None:
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "gateway_requests", "Completion requests", ["dialect", "model", "provider", "status"], registry=r
        )
        self.latency = Histogram(
            "gateway_request_duration_seconds",
            "End-to-end latency (streams: until the last byte)",
            ["dialect", "provider", "stream"],
            buckets=_LATENCY,
            registry=r,
        )
        self.upstream = Histogram(
            "gateway_upstream_duration_seconds",
            "Time in upstream calls and retry waits (streams: until the first event)",
            ["provider", "stream"],
            buckets=_LATENCY,
            registry=r,
        )
        self.overhead = Histogram(
            "gateway_overhead_seconds",
            "Non-streaming latency the gateway adds: end-to-end minus upstream time",
            buckets=_OVERHEAD,
            registry=r,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Streams: from the request to the first event from the upstream",
            ["provider"],
            buckets=_LATENCY,
            registry=r,
        )
        self.tokens = Counter("gateway_tokens", "Tokens", ["kind", "model", "provider"], registry=r)
        # Booked by gateway/usage.py at the configured prices; `key` is a configured key name (or anonymous).
        self.cost = Counter("gateway_cost_usd", "Spend in USD at the configured prices", ["model", "key"], registry=r)
        self.retries = Counter(
            "gateway_retries", "Upstream calls beyond the first for a request", ["model"], registry=r
        )
        self.fallbacks = Counter(
            "gateway_fallbacks", "Requests served by a target other than their first choice", ["model"], registry=r
        )
        self.cooldowns = Counter("gateway_cooldowns", "Targets cooled down", ["target", "cause"], registry=r)
        self.rate_limited = Counter(
            "gateway_rate_limited", "Requests refused by a rate limit or budget", ["code"], registry=r
        )
        self.in_flight = Gauge("gateway_in_flight", "Requests being served", multiprocess_mode="livesum", registry=r)
        # Bounded like the label values themselves (see the module docstring).
        self._cache: dict[tuple[str, str, str, int, bool], _Children] = {}

    def _children(self, dialect: str, model: str, provider: str, status: int, stream: bool) -> _Children:
        """The labelled series one kind of request touches, looked up once per label set rather than through
        `labels()` (argument checks and a lock) five times per request."""
        key = (dialect, model, provider, status, stream)
        kids = self._cache.get(key)
        if kids is None:
            flag = "true" if stream else "false"
            kids = self._cache[key] = _Children(
                requests=self.requests.labels(dialect, model, provider, str(status)),
                latency=self.latency.labels(dialect, provider, flag),
                upstream=self.upstream.labels(provider, flag),
                ttft=self.ttft.labels(provider),
                prompt_tokens=self.tokens.labels("prompt", model, provider),
                completion_tokens=self.tokens.labels("completion", model, provider),
            )
        return kids

    def observe(self, rec: Record, elapsed_s: float) -> None:
        kids = self._children(rec.dialect, rec.model, rec.provider or "none", rec.status, rec.stream)
        kids.requests.inc()
        kids.latency.observe(elapsed_s)
        if rec.provider:
            kids.upstream.observe(rec.upstream_s)
            if rec.stream:
                kids.ttft.observe(rec.upstream_s)
            elif rec.status == 200:
                self.overhead.observe(max(elapsed_s - rec.upstream_s, 0.0))
        if rec.attempts > 1:
            self.retries.labels(rec.model).inc(rec.attempts - 1)
        if rec.fallback:
            self.fallbacks.labels(rec.model).inc()
        if rec.usage is not None:
            kids.prompt_tokens.inc(rec.usage.prompt_tokens)
            kids.completion_tokens.inc(rec.usage.completion_tokens)
        if rec.status == 429 and rec.error_code in ("rate_limit_exceeded", "budget_exceeded", "provider_quota"):
            self.rate_limited.labels(rec.error_code).inc()

    def render(self) -> bytes:
        if self.multiprocess:
            registry = CollectorRegistry()
            MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            return generate_latest(registry)
        return generate_latest(self.registry)
