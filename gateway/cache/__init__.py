"""The response cache: exact, tenant-scoped, coalesced, streamed answers served without the upstream.

This wing owns the key (`key.py`), entries and their replay (`entry.py`), a batch's per-prompt entries
(`batch.py`), chat answers stored and replayed as streams (`chat.py`), the stores (`store.py`), what a request
asks of it (`policy.py`), each request's part (`service.py`), a buffered hit answered before any task
(`hit.py`), waiting for an identical request in flight (`inflight.py`), its counts (`counts.py`); docs/cache.md.

The request path calls it through thin hooks (`Cache.lookup`, `Lookup.serve`, `.chunk`, `.finish`; with
every mode `off`, one attribute check); the edge reads its counts and deletes entries.

May import limits, upstream, fleet, ops and the base; never resilience, emulation or ledger (the other
wings of its layer), path or edge.
"""

from __future__ import annotations

from gateway.cache.service import Cache, Lookup
from gateway.config import LoadedConfig
from gateway.limits.admission import Admission
from gateway.ops.metrics import Metrics
from gateway.state import SharedState


def build(
    loaded: LoadedConfig, shared: SharedState, admission: Admission, metrics: Metrics | None = None
) -> Cache | None:
    """The pipeline's cache, or None when every `cache` block is off (then the request path skips it)."""
    cfg = loaded.config
    blocks = [cfg.cache, *(p.cache for p in loaded.providers.values()), *(m.cache for m in cfg.models)]
    if all(b is None or b.mode == "off" for b in blocks):
        return None
    return Cache(loaded, shared, admission, metrics)


__all__ = ["Cache", "Lookup", "build"]
