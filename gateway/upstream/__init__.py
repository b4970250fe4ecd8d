"""Upstream I/O: the Transport protocol and timeouts, the two transports (h1, httpx), the client every
call goes through, body framing (SSE, NDJSON, event streams), the secret scrubber, and the value types
of a route plan.

The only wing with sockets to the upstreams (the fleet reads its engines' `/metrics` itself). May import
fleet, ops and the base; never limits, emulation, resilience, cache, ledger, path or edge.
"""
