"""The request path: a decoded request (dialects, request folding), the route it resolves to (routing),
and the pipeline that runs it (pipeline, attempt, relay).

May import resilience, emulation, cache, ledger, limits, upstream, fleet, ops and the base; never edge.
"""
