"""The response cache: exact, tenant-scoped, coalesced, streamed answers served without the upstream.

This wing owns the key (`key.py`), entries and their replay (`entry.py`), per-prompt entries of a batch
(`batch.py`), chat answers stored and replayed as streams (`chat.py`), the stores (`store.py`: a bounded
in-process LRU, or Redis), what a request asks of it (`policy.py`), each request's part (`service.py`),
waiting for an identical request in flight (`inflight.py`) and its counts (`counts.py`); docs/cache.md.

The request path calls it through thin hooks (`Cache.lookup`, `Lookup.serve`, `.chunk`, `.finish`; with
every mode `off`, one attribute check); the edge reads its counts and deletes entries.

May import limits, upstream, fleet, ops and the base; never resilience, emulation or ledger (the other
wings of its layer), path or edge.
"""

from __future__ import annotations

from gateway.cache.service import Cache, Lookup, build

__all__ = ["Cache", "Lookup", "build"]
