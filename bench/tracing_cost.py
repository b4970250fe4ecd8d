"""``python -m bench.tracing_cost``: what the tracing hooks cost a request when tracing is off.

An in-process loop over exactly the calls the request path makes with tracing off (the endpoint's test
of `pipeline.tracing`, `tracing.attempt` and its two checks in the failover loop, `tracing.outgoing` on the
upstream request), minus the same loop without them. Prints nanoseconds per request (one attempt) and
whether opentelemetry's tracing API got imported (it must not). Figures: docs/observability.md.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from gateway.ops import tracing
from providers.base import UpstreamRequest

N = 1_000_000


class _Pipeline:
    tracing: tracing.Tracing | None = None


def _hooks(pipeline: _Pipeline, req: UpstreamRequest, route: Any) -> float:
    started = time.perf_counter()
    for _ in range(N):
        span = pipeline.tracing.begin({}, "openai", "/v1/completions") if pipeline.tracing is not None else None
        attempt = tracing.attempt(route)
        sent = tracing.outgoing(req)
        if attempt is not None:
            attempt.succeeded(sent)
        if attempt is not None:
            attempt.close(None)
        if span is not None:
            raise AssertionError("tracing is on")
    return time.perf_counter() - started


def _bare(req: UpstreamRequest) -> float:
    started = time.perf_counter()
    for _ in range(N):
        span = None
        attempt = None
        sent = req
        if attempt is not None:
            pass
        if attempt is not None or sent is None:
            pass
        if span is not None:
            pass
    return time.perf_counter() - started


def main() -> None:
    req = UpstreamRequest("POST", "http://127.0.0.1:1/v1/completions", {"content-type": "application/json"}, b"{}")
    runs = sorted(_hooks(_Pipeline(), req, None) - _bare(req) for _ in range(7))
    print(
        f"tracing off: {runs[0] / N * 1e9:.0f} ns per request (best of 7), median {runs[3] / N * 1e9:.0f} ns; "
        f"opentelemetry.trace imported: {'opentelemetry.trace' in sys.modules}"
    )


if __name__ == "__main__":
    main()
