"""The Batch API as the app holds it: the store and the runner, built once per process with the ledger.

`Batches.owner` is who a request speaks for: the calling key's name (`anonymous` on an open gateway). A key
sees only what it owns; another key's id is answered as if it did not exist.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.batches.runner import Runner
from gateway.batches.store import Store
from gateway.config import LoadedConfig
from gateway.limits.usage import ANONYMOUS
from gateway.ops.metrics import Metrics
from gateway.path.pipeline import Pipeline

__all__ = ["ANONYMOUS", "Batches"]


class Batches:
    def __init__(self, loaded: LoadedConfig, current: Callable[[], Pipeline], metrics: Metrics | None) -> None:
        cfg = loaded.config
        self.cfg = cfg.batches  # read at start, as `ledger.*` is: the runner and its store live as long as the process
        self.store = Store(cfg.ledger.url, cfg.ledger.timeout_ms)
        self.runner = Runner(self.store, self.cfg, current, metrics)

    async def start(self) -> None:
        self.runner.start()

    async def close(self) -> None:
        await self.runner.close()
        await self.store.close()
