"""Live config reload: SIGHUP or a changed file swaps in a new pipeline, atomically.

A reload builds a complete new `Pipeline` before replacing `app.state.pipeline`, so a request sees one
config or the other and in-flight requests finish on theirs; a config that does not load keeps the old
one. The file is polled (no dependency, works on bind mounts). Signals per server: docs/observability.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from typing import Any, Protocol

from gateway.config import ConfigError, LoadedConfig, load_config

log = logging.getLogger("gateway")


class _Usage(Protocol):
    def adopt(self, previous: Any, /) -> None: ...


class _Limiter(Protocol):
    def adopt(self, previous: Any, /) -> None: ...


class _Cache(Protocol):
    def adopt(self, previous: Any, /) -> None: ...


class _Health(Protocol):
    def adopt(self, previous: Any, /) -> None: ...


class _Queues(Protocol):
    def adopt(self, previous: Any, /) -> None: ...

    def lift(self) -> None: ...


class _Admission(Protocol):
    @property
    def limiter(self) -> _Limiter: ...


class Swappable(Protocol):
    """What a reload builds and swaps in: the pipeline (`gateway.path.pipeline.Pipeline`, a wing above this
    one, which hands its constructor in as `build`)."""

    @property
    def usage(self) -> _Usage: ...

    @property
    def admission(self) -> _Admission: ...

    @property
    def cache(self) -> _Cache | None: ...

    @property
    def health(self) -> _Health: ...

    @property
    def queues(self) -> _Queues | None: ...

    def retire(self) -> None: ...


class Reloader:
    def __init__(
        self, state: Any, path: str, build: Callable[[LoadedConfig], Swappable], interval: float = 2.0
    ) -> None:
        self.state = state  # the Litestar app state holding `pipeline`
        self.path = path
        self.build = build
        self.interval = interval
        self._seen = self._stamp()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.reloads = 0

    def _stamp(self) -> tuple[float, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime, st.st_size)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._watch())
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            # Only the main thread of a process may own a signal; embedded servers (tests) just poll.
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.trigger)

    def trigger(self) -> None:
        asyncio.ensure_future(self.reload("SIGHUP", polled=False))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.reload("file changed", polled=True)
            except Exception:  # a bug: the next edit (a key revoked, say) must still be seen
                log.exception("config reload failed; keeping the running config and watching the file")

    async def reload(self, why: str, *, polled: bool = False) -> bool:
        async with self._lock:
            stamp = self._stamp()
            # The poll reloads an edit a SIGHUP has not reloaded already (and a bad edit is told once).
            if polled and (stamp is None or stamp == self._seen):
                return False
            self._seen = stamp
            try:
                if stamp is not None and stamp[1] == 0:
                    # An empty file loads as a config of its own, with every key and provider gone: what a poll
                    # finds between the truncation and the write of a file saved in place, never an intent.
                    raise ConfigError(f"{self.path}: the file is empty")
                loaded = load_config(self.path)
                new = self.build(loaded)
            except ConfigError as exc:
                log.error("config reload (%s) failed, keeping the running config: %s", why, exc)
                return False
            except Exception as exc:  # what only building shows (a file the config names, unreadable now)
                log.error(
                    "config reload (%s) failed, keeping the running config: %s: %s: %s",
                    why,
                    self.path,
                    type(exc).__name__,
                    exc,
                )
                return False
            old: Swappable = self.state.pipeline
            new.usage.adopt(old.usage)  # in-process usage (no Redis) and budgets survive the reload
            new.admission.limiter.adopt(old.admission.limiter)  # the leases it has yet to cancel (Redis stalled)
            # Cooldowns and in-flight counts (open streams too) of every target kept, by identity, not position.
            new.health.adopt(old.health)
            if new.cache is not None and old.cache is not None:
                new.cache.adopt(old.cache)  # so do the answers the memory store holds
            if old.queues is not None:
                if new.queues is not None:
                    new.queues.adopt(old.queues)  # requests waiting for a slot, and slots held, carry over
                else:
                    old.queues.lift()  # no server is capped any more: whoever waits goes now
            self.state.pipeline = new
            self.reloads += 1
            log.info("config reloaded (%s) from %s", why, self.path)
            old.retire()
            return True
