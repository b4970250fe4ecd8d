"""Whether a target's failures are its own or the requests': a sliding window per target, per client key.

A 5xx or a timeout may be the request's doing (an input the upstream cannot take). One tenant sending
such requests must not cool a target other tenants use, so these failures cool only when, within
`cooldown.window_ms`, at least `cooldown.min_requests` distinct requests failed on the target, at least
`cooldown.failure_ratio` of the requests of every client key that used it failed, and no other key was
served there. Outcomes are counted from a target's first such failure; before it, a success only notes
when its key was last served. The window is this process's own, kept by each target's identity (the server
it calls: `Health.named`) and carried over a config reload (`adopt`); the cooldown it decides is shared
(gateway/resilience/health.py). Rules: docs/resilience.md, "Cooldowns".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final

from gateway.config import CooldownConfig

# Outcomes kept per target: a window's count past this is already all the evidence there is.
MAX_OUTCOMES: Final = 1_000
# Targets watched at once (a client names direct `vendor/model` targets): the oldest are dropped.
MAX_WATCHED: Final = 10_000

Outcome = tuple[float, str | None, bool]  # when, the client key (None: the gateway is open), failed


class Evidence:
    __slots__ = ("clock", "window_s", "min_requests", "ratio", "watched", "served", "suspects")

    def __init__(self, cfg: CooldownConfig, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.window_s = cfg.window_ms / 1000
        self.min_requests = cfg.min_requests
        self.ratio = cfg.failure_ratio
        self.watched: dict[str, deque[Outcome]] = {}
        self.served: dict[str, dict[str | None, float]] = {}  # per target: when each key last succeeded
        # Per target cooled on this window's evidence: the keys whose failures it was. Any other key's
        # request may probe the target during that cooldown (gateway/resilience/failover.py): the evidence may be
        # those keys' inputs, and a key that never failed there must not lose the target to them.
        self.suspects: dict[str, set[str | None]] = {}

    def adopt(self, previous: Evidence) -> None:
        """A reload: go on with the previous config's outcomes (shared, so its requests still finishing add
        theirs), judged by this config's `cooldown` from the next failure on. Keyed by each target's identity, a
        target whose server changed finds none."""
        self.watched = previous.watched
        self.served = previous.served
        self.suspects = previous.suspects

    def success(self, target: str, tenant: str | None) -> None:
        now = self.clock()
        served = self.served.get(target)
        if served is None:
            served = self.served[target] = {}
            while len(self.served) > MAX_WATCHED:
                del self.served[next(iter(self.served))]
        served[tenant] = now
        if self.suspects:
            self.suspects.pop(target, None)
        seen = self.watched.get(target)
        if seen is None:
            return
        if seen and seen[-1][0] <= now - self.window_s:
            del self.watched[target]  # nothing failed there for a whole window: stop watching
            return
        seen.append((now, tenant, False))

    def failure(self, target: str, tenant: str | None) -> bool:
        """Count one request's failure; whether the window now says the target fails for everyone."""
        now = self.clock()
        seen = self.watched.pop(target, None)
        if seen is None:
            seen = deque(maxlen=MAX_OUTCOMES)
        self.watched[target] = seen  # re-inserted: the most recently failing targets are kept
        while len(self.watched) > MAX_WATCHED:
            del self.watched[next(iter(self.watched))]
        seen.append((now, tenant, True))
        start = now - self.window_s
        while seen[0][0] <= start:
            seen.popleft()
        per_key: dict[str | None, list[int]] = {}
        failed = 0
        for _, key, bad in seen:
            counts = per_key.get(key)
            if counts is None:
                counts = per_key[key] = [0, 0]
            counts[0] += bad
            counts[1] += 1
            failed += bad
        if failed < self.min_requests:
            return False
        if any(bad < self.ratio * total for bad, total in per_key.values()):
            return False
        served = self.served.get(target)
        if served and any(at > start and key not in per_key for key, at in served.items()):
            return False  # another key was served there within the window
        del self.watched[target]  # the cooldown decides from here: its probe, then a fresh window
        self.suspects.pop(target, None)
        self.suspects[target] = set(per_key)
        while len(self.suspects) > MAX_WATCHED:
            del self.suspects[next(iter(self.suspects))]
        return True
