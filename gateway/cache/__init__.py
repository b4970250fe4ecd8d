"""The response cache: exact, tenant-scoped, coalesced, streamed answers served without the upstream.

This wing owns everything the cache is: the key (`key.py`, a SHA-256 over a canonical encoding of the
folded request), what an entry holds and how it becomes a buffered answer or a stream again
(`entry.py`), where entries live (`store.py`: a bounded in-process LRU, or Redis), and the policy that
ties them to a request (`service.py`: the mode, `Cache-Control`, coalescing of identical requests in
flight, and the `x-gateway-cache` / `Age` headers). docs/cache.md is the operators' account.

It may import the config, `wire/`, `providers/` (not an adapter module) and lower wings (limits, shared
state, framing, metrics). It never imports the request path (the pipeline, attempts, the relay, the
failover loop) or the edge (endpoints, the app): those call it through the thin hooks `Cache.lookup`,
`Lookup.serve`, `Lookup.chunk` and `Lookup.finish`, so with every mode `off` the request path pays one
attribute check.
"""

from __future__ import annotations

from gateway.cache.service import Cache, Lookup, build

__all__ = ["Cache", "Lookup", "build"]
