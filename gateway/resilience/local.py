"""A target's health as one process keeps it: without Redis, while Redis is away, and a replica's load.

Keyed by each target's identity (`Health.named`: by the hash of the URL it calls, as in Redis), not by its
place in the config, so that a reload can hand the new pipeline's `Health` this same object: cooldowns,
probes and the requests in flight (streams too) carry over to every target the new config still has, and a
request that started before the reload gives its count back here when it ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

import msgspec

from gateway.config import CooldownConfig

_V = TypeVar("_V")

# Distinct targets whose state one process keeps: a direct `vendor/model` target is named by the client, so
# without a bound a tenant sending invented names to a failing provider would grow these maps forever. The
# oldest entries go first; a target still in use is re-inserted (moved to the end) whenever it changes.
MAX_TARGETS: Final = 10_000


def put_bounded(d: dict[str, _V], key: str, value: _V) -> None:
    d.pop(key, None)
    d[key] = value
    while len(d) > MAX_TARGETS:
        del d[next(iter(d))]


class TargetState(msgspec.Struct, frozen=True):
    """A target's state as one request sees it. Frozen: a state is shared (`IDLE`, the copies of Redis's
    view), and a caller that would change its own makes a new one (`msgspec.structs.replace`)."""

    cooling_ms: int = 0
    cause: str | None = None  # "429" when a rate limit cooled it, else "error"
    failures: int = 0
    inflight: int = 0
    latency_ms: float | None = None

    @property
    def recovering(self) -> bool:
        return self.cooling_ms <= 0 and self.failures > 0


IDLE: Final = TargetState()  # nothing cooling, failing, in flight or measured


class LocalHealth:
    """Cooldowns, failures, probes, in-flight counts and latency per target identity, in this process."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.cool: dict[str, tuple[float, str]] = {}
        self.failures: dict[str, tuple[int, float]] = {}
        self.probes: dict[str, float] = {}
        self.inflight: dict[str, int] = {}
        # A replica's requests in flight over every model it serves (`provider@i`): the load a fleet's
        # policy weighs, where a replica serving LoRA adapters has a target per model.
        self.replica_inflight: dict[str, int] = {}
        self.latency: dict[str, float] = {}

    def state(self, target: str) -> TargetState:
        if target not in self.cool and target not in self.failures:
            # The common case, without a clock read: nothing cooled or failed there.
            inflight, latency = self.inflight.get(target, 0), self.latency.get(target)
            if not inflight and latency is None:
                return IDLE
            return TargetState(inflight=inflight, latency_ms=latency)
        now = self.clock()
        until, cause = self.cool.get(target, (0.0, None))
        fails, fail_until = self.failures.get(target, (0, 0.0))
        if fail_until <= now:
            fails = 0
        return TargetState(
            cooling_ms=max(int((until - now) * 1000), 0),
            cause=cause if until > now else None,
            failures=fails,
            inflight=self.inflight.get(target, 0),
            latency_ms=self.latency.get(target),
        )

    def failure(
        self, target: str, retry_after_ms: int | None, cause: str, cfg: CooldownConfig, count: bool = True
    ) -> int:
        now = self.clock()
        fails, fail_until = self.failures.get(target, (0, 0.0))
        fails = fails if fail_until > now else 0
        if count or not fails:
            fails += 1
            put_bounded(self.failures, target, (fails, now + cfg.max_ms * 4 / 1000))
        ms = retry_after_ms if retry_after_ms is not None else min(cfg.base_ms * 2 ** (fails - 1), cfg.max_ms)
        ms = max(int(ms), 1)
        until, _ = self.cool.get(target, (0.0, cause))
        if until < now + ms / 1000:
            put_bounded(self.cool, target, (now + ms / 1000, cause))
        self.probes.pop(target, None)
        return ms

    def cooling_under(self, prefix: str) -> bool:
        """Whether a target whose key starts with `prefix` (a replica's: `provider@i/`) is cooling now."""
        now = self.clock()
        return any(until > now for key, (until, _) in self.cool.items() if key.startswith(prefix))

    def exhausted(self, target: str, ms: int) -> None:
        now = self.clock()
        until, _ = self.cool.get(target, (0.0, "429"))
        if until < now + ms / 1000:
            put_bounded(self.cool, target, (now + ms / 1000, "429"))

    def probe(self, target: str, ttl_ms: int) -> bool:
        now = self.clock()
        if self.probes.get(target, 0.0) > now:
            return False
        put_bounded(self.probes, target, now + ttl_ms / 1000)
        return True
