"""The Batch API as the app holds it: the store and the runner, built once per process with the ledger.

What a request owns is its key's: the calling key's identity (`ClientKey.ident`: a runtime key's id, a YAML
key's fingerprint; `anonymous` on an open gateway), never its name, which another key may share. A key sees
only what it owns; another key's id is answered as if it did not exist, and a batch runs as the key that
made it.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.batches.runner import Runner
from gateway.batches.store import Store
from gateway.config import BatchesConfig, LoadedConfig
from gateway.limits.usage import ANONYMOUS
from gateway.ops.metrics import Metrics
from gateway.path.pipeline import Pipeline

__all__ = ["ANONYMOUS", "Batches"]


class Batches:
    def __init__(self, loaded: LoadedConfig, current: Callable[[], Pipeline], metrics: Metrics | None) -> None:
        # The database is the ledger's, set up at start as the ledger is; `batches.*` follow config reloads.
        self.store = Store(loaded.config.ledger.url, loaded.config.ledger.timeout_ms, lambda: self.cfg.lease_ms)
        self.runner = Runner(self.store, current, metrics)

    @property
    def cfg(self) -> BatchesConfig:
        return self.runner.cfg

    async def start(self) -> None:
        self.runner.start()

    async def close(self) -> None:
        await self.runner.close()
        await self.store.close()
