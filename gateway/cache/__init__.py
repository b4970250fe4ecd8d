"""The response cache: exact, tenant-scoped, coalesced, streamed answers served without the upstream.

This wing owns the key (`key.py`), entries and their replay (`entry.py`), per-prompt entries of a
batch (`batch.py`), the stores (`store.py`: a bounded in-process LRU, or Redis), what a request asks of
it (`policy.py`: mode, `Cache-Control`) and each request's part (`service.py`: lookup, coalescing,
headers). Operators' account: docs/cache.md.

It may import the config, `wire/`, `providers/` (not an adapter module) and lower wings (limits, shared
state, framing, metrics). It never imports the request path (the pipeline, attempts, the relay, the
failover loop) or the edge (endpoints, the app): those call it through the thin hooks `Cache.lookup`,
`Lookup.serve`, `Lookup.chunk`, `Lookup.finish`; with every mode `off` that is one attribute check.
"""

from __future__ import annotations

from gateway.cache.service import Cache, Lookup, build

__all__ = ["Cache", "Lookup", "build"]
