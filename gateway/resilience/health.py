"""Target health shared by every replica: cooldowns, recovery probes, in-flight counts, latency.

A target that fails for everyone (what decides that: gateway/resilience/failover.py `_blame` and
gateway/resilience/evidence.py) is cooled down for its Retry-After or a growing backoff (`cooldown.base_ms`
doubling per consecutive failure, capped at `cooldown.max_ms`); a failure during a cooldown extends it.
When the cooldown ends the target is "recovering": exactly one request (the one that wins the probe
slot) may use it; its success clears the failure count, its failure starts a longer cooldown, and a
failure that was the request's own gives the slot back.
In Redis these are keys with TTLs (`gw:{target}:cd|cf|probe|in|lat`, hash-tagged per target), so every
replica skips the same target; without Redis, or while Redis is unreachable, the same semantics run on
in-process dictionaries.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final

import msgspec
import redis.asyncio as aioredis

from gateway.config import CooldownConfig
from gateway.resilience.evidence import Evidence
from gateway.resilience.local import LocalHealth, put_bounded
from gateway.resilience.local import TargetState as TargetState  # what callers of Health read
from gateway.state import Degraded, SharedState

# The default (`redis.lease_ttl_ms`): a replica that dies mid-request must not leave a target "busy" forever.
# While this process counts requests in flight on a target it renews the key every third of the TTL.
_INFLIGHT_TTL_MS: Final = 600_000
_LATENCY_TTL_MS: Final = 3_600_000
_EWMA_ALPHA: Final = 0.3
# The share of `redis.refresh_ms` after which a request renews the copies of the shared health ahead of time.
_AHEAD: Final = 0.75
# Targets whose identity is kept (`Health.named`): a config names far fewer; past it the memo starts afresh.
_NAMES_MAX: Final = 65_536


_FAILURE = """
local f
if ARGV[6] == '1' then
  f = redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
else
  f = math.max(tonumber(redis.call('GET', KEYS[2]) or '1'), 1)
end
local ms = tonumber(ARGV[1])
if ms < 0 then ms = math.min(tonumber(ARGV[2]) * 2 ^ (f - 1), tonumber(ARGV[3])) end
ms = math.max(math.floor(ms), 1)
if redis.call('PTTL', KEYS[1]) < ms then redis.call('SET', KEYS[1], ARGV[5], 'PX', ms) end
redis.call('DEL', KEYS[3])
return ms
"""

_EXHAUSTED = """
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], '429', 'PX', ARGV[1]) end
return 1
"""

# A target's in-flight count moved by one request, never below zero: a restarted Redis (or one that was away
# when the request started) lost the increment its end now takes off. Zero, not the missing count: the
# replicas' requests still running under-count until they end, and from then on the count is exact again.
_INFLIGHT = """
local n = redis.call('INCRBY', KEYS[1], ARGV[1])
if n < 0 then
  n = 0
  redis.call('SET', KEYS[1], 0)
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return n
"""

_EWMA = """
local v = redis.call('GET', KEYS[1])
local x = tonumber(ARGV[1])
if v then x = tonumber(ARGV[2]) * x + (1 - tonumber(ARGV[2])) * tonumber(v) end
redis.call('SET', KEYS[1], tostring(x), 'PX', ARGV[3])
return tostring(x)
"""


def _keys(target: str) -> tuple[str, str, str, str, str]:
    tag = "gw:{" + target + "}"
    return tag + ":cd", tag + ":cf", tag + ":probe", tag + ":in", tag + ":lat"


class Health:
    def __init__(
        self,
        shared: SharedState,
        cooldown: CooldownConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_cooldown: Callable[[str, str], None] | None = None,
        refresh_ms: int = 250,
        inflight_ttl_ms: int = _INFLIGHT_TTL_MS,
        shared_name: Callable[[str], str] | None = None,
    ) -> None:
        self.shared = shared
        # A target's identity, in its Redis keys and in this process's own view (`local`): a replica's names the
        # replica by URL (gateway/fleet `shared_name`), so a reload that reorders `replicas:` moves no state.
        self._shared_name = shared_name or str
        # Each target's identity, worked out once: targets are the config's, so this holds one entry per target.
        self._names: dict[str, str] = {}
        self.inflight_ttl_ms = inflight_ttl_ms
        self._renewer: asyncio.Task[None] | None = None
        self.cooldown = cooldown
        self.on_cooldown = on_cooldown
        self.clock = clock
        # Copies of Redis's view per target, with when they were read: a round trip per request cost a
        # saturated worker about 10 % of its time, for a picture that changes only when targets fail.
        self.refresh_s = refresh_ms / 1000
        # A request that finds copies this old (but not yet `refresh_s`) uses them and starts their read in the
        # background: with requests coming steadily the copies are renewed before they expire, and no request
        # waits for the read, while none is answered from a copy older than `refresh_s` either.
        self.ahead_s = self.refresh_s * _AHEAD
        self._seen: dict[str, tuple[float, TargetState]] = {}
        # The read under way per target list: when the copies go stale under load, every request arriving
        # in the round trip would start a read of its own (dozens at 32 connections); they share one.
        self._reading: dict[tuple[str, ...], asyncio.Future[dict[str, TargetState] | None]] = {}
        # Bumped by forget(): a read started before this replica changed a target is neither joined by
        # later requests nor kept as the copy.
        self._changes = 0
        self.local = LocalHealth(clock)
        self.evidence = Evidence(cooldown, clock)
        self._failure_script = shared.client.register_script(_FAILURE) if shared.client is not None else None
        self._ewma_script = shared.client.register_script(_EWMA) if shared.client is not None else None
        self._exhausted_script = shared.client.register_script(_EXHAUSTED) if shared.client is not None else None
        self._inflight_script = shared.client.register_script(_INFLIGHT) if shared.client is not None else None

    def reset(self) -> None:
        """Forget this process's view of every target (cooldowns, failures, probes, counts)."""
        self.local = LocalHealth(self.local.clock)
        self.evidence = Evidence(self.cooldown, self.local.clock)
        self._seen.clear()
        self._reading.clear()
        self._changes += 1

    def adopt(self, previous: Health) -> None:
        """A reload: keep the previous pipeline's in-process view and the failures counted in the cooldown
        window (both keyed by identity, so a reordered `replicas:` changes nothing, and a target pointed at
        another server starts clean), shared with it while its requests finish and give their counts back."""
        self.local = previous.local
        self.evidence.adopt(previous.evidence)

    def named(self, target: str) -> str:
        """The target's identity (`shared_name`), computed once per target."""
        name = self._names.get(target)
        if name is None:
            if len(self._names) >= _NAMES_MAX:
                self._names.clear()
            name = self._names[target] = self._shared_name(target)
        return name

    def local_state(self, target: str) -> TargetState:
        """The target's state as this process alone knows it."""
        return self.local.state(self._names.get(target) or self.named(target))

    def at_hand(self, targets: Sequence[str]) -> dict[str, TargetState] | None:
        """The targets' states when they need no wait (no Redis, or copies fresh enough): `snapshot` without
        a coroutine. None: `snapshot` reads them."""
        if self.shared.client is None:
            state, names, out = self.local.state, self._names, {}
            for t in targets:  # a loop, not a comprehension (a call of its own on Python 3.11)
                out[t] = state(names.get(t) or self.named(t))
            return out
        if self.refresh_s > 0:
            return self._cached(targets, self.clock())
        return None

    async def snapshot(self, targets: Sequence[str]) -> dict[str, TargetState]:
        states = self.at_hand(targets)
        if states is not None:
            return states
        now = self.clock()
        # Shielded: one caller's cancellation (a client gone) must not cancel the read the others wait for.
        states = await asyncio.shield(self._reading_of(targets, now))
        if states is None:
            return {t: self.local_state(t) for t in targets}
        return dict(states)  # the states are frozen: the waiters share them, each with a dict of its own

    def _reading_of(self, targets: Sequence[str], now: float) -> asyncio.Future[dict[str, TargetState] | None]:
        """The read of `targets` under way, or a new one."""
        key = tuple(targets)
        reading = self._reading.get(key)
        if reading is None:
            reading = self._reading[key] = asyncio.ensure_future(self._read(targets, now))
            reading.add_done_callback(lambda done: self._read_done(key, done))
        return reading

    def _read_done(self, key: tuple[str, ...], done: asyncio.Future[dict[str, TargetState] | None]) -> None:
        if self._reading.get(key) is done:
            del self._reading[key]
        if not done.cancelled():
            done.exception()  # retrieved: when every waiter went away, an error is not logged as unretrieved

    async def _read(self, targets: Sequence[str], now: float) -> dict[str, TargetState] | None:
        """Redis's view of `targets`, kept as this replica's copies; None while Redis is degraded."""
        changes = self._changes
        try:
            states = await self.shared.run(lambda r: self._redis_snapshot(r, targets))
        except Degraded:
            return None
        if changes == self._changes:
            for t, st in states.items():
                put_bounded(self._seen, t, (now, st))
        return states

    def _cached(self, targets: Sequence[str], now: float) -> dict[str, TargetState] | None:
        out: dict[str, TargetState] = {}
        due = False
        for t in targets:
            seen = self._seen.get(t)
            if seen is None:
                return None
            age = now - seen[0]
            if age >= self.refresh_s:
                return None
            if age >= self.ahead_s:
                due = True
            st = seen[1]
            if st.cooling_ms:
                # The cooldown counted down by the copy's age (a state is frozen: one not cooling is shared).
                st = msgspec.structs.replace(st, cooling_ms=max(st.cooling_ms - int(age * 1000), 0))
            out[t] = st
        if due:
            self._reading_of(targets, now)  # not awaited: the copies are still fresh enough for this request
        return out

    def forget(self, target: str) -> None:
        """This replica changed the target's state: its next snapshot must read it back."""
        self._seen.pop(target, None)
        self._changes += 1
        for key in [k for k in self._reading if target in k]:
            del self._reading[key]

    async def _redis_snapshot(self, r: aioredis.Redis, targets: Sequence[str]) -> dict[str, TargetState]:
        pipe = r.pipeline(transaction=False)
        for t in targets:
            cd, cf, _, inflight, lat = _keys(self.named(t))
            pipe.pttl(cd)
            pipe.get(cd)
            pipe.get(cf)
            pipe.get(inflight)
            pipe.get(lat)
        raw = await pipe.execute()
        out: dict[str, TargetState] = {}
        for i, t in enumerate(targets):
            pttl, cause, fails, inflight, lat = raw[i * 5 : i * 5 + 5]
            out[t] = TargetState(
                cooling_ms=max(int(pttl), 0),
                cause=cause.decode() if cause else None,
                failures=int(fails or 0),
                inflight=max(int(inflight or 0), 0),
                latency_ms=float(lat) if lat else None,
            )
        return out

    async def failure(self, target: str, retry_after_s: float | None, cause: str, *, count: bool = True) -> int:
        """Cool a target down; returns the cooldown in ms. `count=False`: a request's repeated failure
        on the same target, which may extend the cooldown (its Retry-After) but not lengthen the next."""
        self.forget(target)
        if self.on_cooldown is not None:
            self.on_cooldown(target, cause)
        ra = int(retry_after_s * 1000) if retry_after_s is not None else None
        if cause == "quota":
            # An exhausted quota will not come back within a retry: keep everyone off it for the longest time.
            ra = self.cooldown.max_ms
        script = self._failure_script
        if script is not None:
            cd, cf, probe, _, _ = _keys(self.named(target))
            args: list[int | str] = [
                ra if ra is not None else -1,
                self.cooldown.base_ms,
                self.cooldown.max_ms,
                self.cooldown.max_ms * 4,
                cause,
                1 if count else 0,
            ]
            try:
                return int(await self.shared.run(lambda r: script(keys=[cd, cf, probe], args=args, client=r)))
            except Degraded:
                pass
        return self.local.failure(self.named(target), ra, cause, self.cooldown, count)

    async def exhausted(self, target: str, seconds: float) -> None:
        """The upstream said its quota is used up until `seconds` from now: every replica skips the target
        until then. Not a failure: it neither counts toward longer cooldowns nor needs a probe."""
        ms = max(int(seconds * 1000), 1)
        self.forget(target)
        if self.on_cooldown is not None:
            self.on_cooldown(target, "exhausted")
        script = self._exhausted_script
        if script is not None:
            key = _keys(self.named(target))[0]
            try:
                await self.shared.run(lambda r: script(keys=[key], args=[ms], client=r))
                return
            except Degraded:
                pass
        self.local.exhausted(self.named(target), ms)

    def success(
        self, target: str, state: TargetState | None, tenant: str | None = None
    ) -> Coroutine[Any, Any, None] | None:
        """Note a served request; the coroutine to await when the target was failing (it is back), else None:
        nearly every success changes nothing shared, and pays no coroutine for it."""
        self.evidence.success(self._names.get(target) or self.named(target), tenant)
        if state is None or state.failures == 0:
            return None
        return self._recovered(target)

    async def _recovered(self, target: str) -> None:
        self.forget(target)
        # A probe (or a request's own retry after the failure it caused) succeeded: the target is back.
        named = self.named(target)
        self.local.cool.pop(named, None)
        self.local.failures.pop(named, None)
        self.local.probes.pop(named, None)
        cd, cf, probe, _, _ = _keys(named)
        try:
            await self.shared.run(lambda r: r.delete(cd, cf, probe))
        except Degraded:
            pass

    async def probe(self, target: str, ttl_ms: int) -> bool:
        """Claim the one recovery probe of a target whose cooldown has ended."""
        _, _, probe, _, _ = _keys(self.named(target))
        try:
            return bool(await self.shared.run(lambda r: r.set(probe, b"1", nx=True, px=max(ttl_ms, 1))))
        except Degraded:
            return self.local.probe(self.named(target), ttl_ms)

    async def release(self, target: str) -> None:
        """Give back a probe slot whose request said nothing about the target (it failed for its own
        reasons): the next request probes at once instead of everyone waiting out the slot."""
        self.forget(target)
        named = self.named(target)
        self.local.probes.pop(named, None)
        probe = _keys(named)[2]
        try:
            await self.shared.run(lambda r: r.delete(probe))
        except Degraded:
            pass

    async def inflight(self, target: str, delta: int) -> None:
        local, named = self.local, self.named(target)
        count = local.inflight.get(named, 0) + delta
        if count:
            put_bounded(local.inflight, named, count)
        else:
            local.inflight.pop(named, None)
        replica = named.partition("/")[0]
        if "@" in replica:
            on_replica = local.replica_inflight.get(replica, 0) + delta
            if on_replica:
                put_bounded(local.replica_inflight, replica, on_replica)
            else:
                local.replica_inflight.pop(replica, None)
        script = self._inflight_script
        if script is None:
            return
        if count > 0 and self._renewer is None:
            self._renewer = asyncio.ensure_future(self._renew())
        key = _keys(named)[3]
        try:
            await self.shared.run(lambda r: script(keys=[key], args=[delta, self.inflight_ttl_ms], client=r))
        except Degraded:
            pass

    async def _renew(self) -> None:
        """Every third of the TTL while this process has requests in flight: their targets' shared counts
        kept from expiring (a stream longer than the TTL would otherwise take its count below zero when
        it ended). Off the request path, one pipelined write."""
        ttl = self.inflight_ttl_ms
        try:
            while self.local.inflight:
                await asyncio.sleep(ttl / 3000)
                keys = [_keys(t)[3] for t in self.local.inflight]  # identities already

                async def op(r: aioredis.Redis, keys: list[str] = keys) -> None:
                    pipe = r.pipeline(transaction=False)
                    for key in keys:
                        pipe.pexpire(key, ttl)
                    await pipe.execute()

                if keys:
                    with contextlib.suppress(Degraded):
                        await self.shared.run(op)
        finally:
            self._renewer = None

    async def close(self) -> None:
        renewer = self._renewer
        if renewer is not None:
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)
        reading = list(self._reading.values())  # reads started ahead, which no request waits for
        for read in reading:
            read.cancel()
        await asyncio.gather(*reading, return_exceptions=True)

    async def latency(self, target: str, ms: float) -> None:
        named = self.named(target)
        prev = self.local.latency.get(named)
        put_bounded(self.local.latency, named, ms if prev is None else _EWMA_ALPHA * ms + (1 - _EWMA_ALPHA) * prev)
        script = self._ewma_script
        if script is None:
            return
        key = _keys(named)[4]
        try:
            await self.shared.run(lambda r: script(keys=[key], args=[ms, _EWMA_ALPHA, _LATENCY_TTL_MS], client=r))
        except Degraded:
            pass
