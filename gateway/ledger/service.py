"""The ledger as the app holds it: built once per process, started and drained by the app's lifespan.

`LedgerService.install` hooks a pipeline (the first, and each one a config reload builds) to the
process's queue, runtime keys and budget counters. `serve`'s checks before any worker starts are
gateway/ledger/startup.py's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import msgspec
from prometheus_client import Counter, Gauge

from gateway.config import LedgerConfig, LoadedConfig, TeamConfig, model_names
from gateway.ledger import keys as keystore
from gateway.ledger.book import Ledger
from gateway.ledger.budgets import ledger_budgets
from gateway.ledger.namespaces import yaml_keys
from gateway.limits.auth import RuntimeKeys
from gateway.limits.budgets import Budgets
from gateway.limits.usage import Counters
from gateway.ops.metrics import Metrics

log = logging.getLogger("gateway")


class Hooked(Protocol):
    """What the ledger needs of a pipeline: its key ring and a place for the ledger (gateway/path/pipeline.py)."""

    keys: Any
    usage: Any
    loaded: LoadedConfig
    ledger: Ledger | None
    budgets: Budgets


class LedgerService:
    def __init__(self, loaded: LoadedConfig, metrics: Metrics | None = None) -> None:
        self.ledger = Ledger(loaded.config.ledger)
        self.runtime = RuntimeKeys()
        self.counters = Counters()
        # The `teams:` of the config in force: what `POST /admin/keys` holds a new key's team and priorities to.
        self.teams: Mapping[str, TeamConfig] = loaded.config.teams
        # What the config in force routes: a new key's `models` must be able to match some of it.
        self.names = model_names(loaded.config, loaded.providers)
        self.poller = keystore.KeyPoller(
            self.ledger,
            self.runtime,
            yaml_keys((k.name, k.team) for k in loaded.config.keys),
            self._changed,
            loaded.config.teams,
            self.names,
        )
        self.keys: Any = None  # the key ring of the config in force
        self._open: bool | None = None  # whether it served requests without a key, as last said
        if metrics is not None:
            # Read at scrape time: the request path only appends. Per process (each worker has its queue).
            r = metrics.registry
            ledger = self.ledger
            for name, doc, read in (
                ("gateway_ledger_dropped_rows", "Ledger rows turned away by the full queue", lambda: ledger.dropped),
                ("gateway_ledger_spill_lost_rows", "Ledger rows lost to a full spill file", lambda: ledger.spill.lost),
                ("gateway_ledger_refused_rows", "Ledger rows the database refused", lambda: ledger.refused),
                (
                    "gateway_ledger_refused_lost_rows",
                    "Refused ledger rows the refused-rows file could not keep",
                    lambda: ledger.rejects.lost,
                ),
                (
                    "gateway_ledger_expired_rows",
                    "Spilled ledger rows of days past ledger.retention_days, not booked at replay",
                    lambda: ledger.expired,
                ),
                (
                    "gateway_ledger_late_changes",
                    "Key changes committed after their admin call was answered 503",
                    lambda: ledger.late_changes,
                ),
                ("gateway_ledger_queued_rows", "Ledger rows waiting for the writer", lambda: len(ledger.queue)),
                ("gateway_ledger_spilled", "1 while the ledger's rows go to its spill file", lambda: ledger.spilling),
                (
                    "gateway_ledger_unavailable",
                    "1 while the ledger's database cannot be written or did not answer the last call (as /ready)",
                    lambda: int(ledger.trouble is not None),
                ),
            ):
                Gauge(name, doc, registry=r, multiprocess_mode="max").set_function(read)

    def install(self, pipeline: Hooked) -> None:
        pipeline.keys.runtime = self.runtime
        cfg = pipeline.loaded.config
        self.teams = cfg.teams
        self.names = model_names(cfg, pipeline.loaded.providers)
        self.poller.names(yaml_keys((k.name, k.team) for k in cfg.keys), cfg.teams, self.names)
        self.keys = pipeline.keys
        if self._open is not None:
            self._open = pipeline.keys.open  # a reload says it in its own line
        pipeline.ledger = self.ledger
        # The rollups bucket models and targets as this config's usage store and metrics do.
        self.ledger.fold = pipeline.usage.labels.fold
        pipeline.budgets = ledger_budgets(pipeline.loaded, self.ledger, self.counters)
        pipeline.usage.ledgered = True  # its budgets are seeded from the ledger: no spend counters to keep

    def _changed(self) -> None:
        """The runtime keys were reloaded: one INFO line when that opened or closed the gateway to requests
        without a key (the first runtime key made, say; start-up and reloads say it themselves)."""
        keys = self.keys
        if keys is None:
            return
        now = keys.open
        if self._open is not None and now != self._open:
            log.info("runtime keys changed: %s", keys.describe())
        self._open = now

    async def start(self) -> None:
        await self.ledger.start()
        await self.poller.start()

    async def close(self) -> None:
        await self.poller.stop()
        await self.ledger.close()


class Pinned:
    """`ledger.*` as the process started with it. The ledger (its database, writer, queue, spill file and
    key poller) is set up once per process, so a reload keeps it: a reload that changes `ledger.*` says
    which settings it did not apply in one WARNING and counts them (`gateway_config_reload_ignored`)."""

    def __init__(self, loaded: LoadedConfig, metrics: Metrics) -> None:
        self.started = loaded.config.ledger
        self.ignored = Counter(
            "gateway_config_reload_ignored",
            "Settings a config reload changed but did not apply (they need a restart)",
            ["setting"],
            registry=metrics.registry,
        )

    def check(self, loaded: LoadedConfig) -> list[str]:
        """The `ledger.*` settings `loaded` changes from the running ones (logged and counted), if any."""
        now = loaded.config.ledger
        if now == self.started:
            return []
        before, after = msgspec.structs.asdict(self.started), msgspec.structs.asdict(now)
        changed = [f"ledger.{name}" for name in LedgerConfig.__struct_fields__ if before[name] != after[name]]
        for setting in changed:
            self.ignored.labels(setting).inc()
        running = "keeps its settings" if self.started.url else "stays off (none was configured)"
        # Names only: `ledger.url` may hold a password.
        log.warning(
            "config reload: %s changed in %s but not applied: the ledger is set up at start and %s until the "
            "gateway restarts",
            ", ".join(changed),
            loaded.source,
            running,
        )
        return changed
