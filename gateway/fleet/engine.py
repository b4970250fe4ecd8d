"""The engines' own load, read in the background: each replica's Prometheus `/metrics`, never on the request path.

For every provider whose `routing.engine_metrics` is on and whose kind declares its gauges
(providers/engine.py), each replica is read by a task of its own every `routing.metrics_interval_ms`, so
a slow replica (up to `metrics_timeout_ms`) delays no other; after a read that gives no load, or one that
cost more than a quarter of the byte cap (HEAVY_SHARE), the next waits from its end, twice as long per such
read in a row (up to MAX_BACKOFF_S); a heavy read's load steers only as long as a light read's would. A read
stops at `metrics_max_bytes` counted off the socket (gateway/fleet/metered.py) and again inflated, parsed as it
arrives (gateway/fleet/exposition.py). The load is stored on the Fleet; a replica whose metrics cannot be
read is stored as unknown (routed as if idle, not as if dead), and no load outlives two intervals and
timeouts unrenewed (`Fleet.load_of`). Losing a replica's metrics is one WARNING, getting them back one INFO.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Final

import httpcore

from gateway.config import ProviderConfig
from gateway.fleet.background import Background
from gateway.fleet.exposition import PIECE, Exposition, Inflater, Unreadable
from gateway.fleet.metered import METER, Meter
from gateway.fleet.picker import EngineLoad, Fleet
from providers import REGISTRY
from providers.engine import EngineGauges
from providers.tokenizer import server_root

log = logging.getLogger("gateway.fleet")

Watched = Mapping[str, tuple[Fleet, EngineGauges, Mapping[str, str], ProviderConfig]]
# Connections to one provider's replicas (gateway/fleet/metered.py): its CA bundle, client certificate and
# proxy, as its requests use.
TransportFor = Callable[[ProviderConfig], httpcore.AsyncConnectionPool]
# (provider, replica index, replica URL): one reading, kept across reloads that keep the replica.
Key = tuple[str, int, str]
# What tells one provider's connections from another's: its proxy, CA bundle and client certificate.
Settings = tuple[str | None, ...]

# How often the set of replicas to read is compared with the config serving now (a reload may change it).
_CONFIG_CHECK_S: Final = 1.0
# Failed reads in a row back off, doubling from `metrics_interval_ms` up to this (or the interval, if longer).
MAX_BACKOFF_S: Final = 30.0
# A read charged more than this share of `metrics_max_bytes` gives its load but backs off as a failed one: a
# real exposition is tens of KiB, so such a read is a replica making the gateway work just under every cap.
HEAVY_SHARE: Final = 4
_TRANSPORT_ERRORS: Final = (
    httpcore.NetworkError,
    httpcore.TimeoutException,
    httpcore.ProtocolError,
    httpcore.ProxyError,
    httpcore.UnsupportedProtocol,
    OSError,
)


async def read_load(
    pool: httpcore.AsyncConnectionPool,
    url: str,
    gauges: EngineGauges,
    headers: Mapping[str, str],
    timeout_s: float,
    max_bytes: int,
    meter: Meter | None = None,
) -> EngineLoad:
    """One replica's load from its exposition at `url`. Raises Unreadable with the cause. `meter` (its cap
    `max_bytes`) tells the caller afterwards what the read cost."""
    meter = meter or Meter(max_bytes)
    metering = METER.set(meter)
    try:
        async with asyncio.timeout(timeout_s):  # the whole read, a body dripping byte by byte too
            # httpcore's pool itself: no per-request log line, no decoding of a body it would hold whole.
            async with pool.stream(
                "GET",
                url,
                headers=list({**headers, "accept": "text/plain", "accept-encoding": "identity"}.items()),
                extensions={"timeout": dict.fromkeys(("connect", "read", "write", "pool"), timeout_s)},
            ) as resp:
                meter.head = False
                if resp.status != 200:
                    raise Unreadable(f"HTTP {resp.status}", "http_status")
                # A replica may compress even when asked not to: undone here, within the same cap.
                encoding = b", ".join(v for k, v in resp.headers if k.lower() == b"content-encoding")
                inflater = Inflater(encoding.decode("latin-1"))
                parsed = Exposition(gauges, max_bytes)
                # Pieces are parsed, and the loop runs, per PIECE charged, not per chunk the replica cuts.
                batch = bytearray()
                mark = meter.taken
                async for chunk in resp.aiter_stream():
                    meter.piece(len(chunk))
                    batch += chunk
                    if meter.taken - mark >= PIECE:
                        await _parse(inflater, parsed, bytes(batch))
                        batch.clear()
                        mark = meter.taken
                await _parse(inflater, parsed, bytes(batch))
                return parsed.load()
    except TimeoutError:
        raise Unreadable(f"no whole answer within {round(timeout_s * 1000)} ms", "timeout") from None
    except _TRANSPORT_ERRORS as exc:
        raise Unreadable(type(exc).__name__, "transport") from None
    finally:
        METER.reset(metering)


async def _parse(inflater: Inflater, parsed: Exposition, data: bytes) -> None:
    for piece in inflater.pieces(data):
        parsed.feed(piece)
    while piece := inflater.more():
        parsed.feed(piece)
        await asyncio.sleep(0)  # one piece's work at a time: the loop serves requests between
    await asyncio.sleep(0)


class EngineReader(Background):
    """Per pipeline: a supervising task that keeps one reading task per replica of every watched fleet."""

    def __init__(
        self, fleets: Callable[[], Watched], failed: Callable[[str, str], None], transport_for: TransportFor
    ) -> None:
        self._fleets = fleets
        self._failed = failed  # counts a failed read: (the replica's name, the cause's kind)
        self._transport_for = transport_for
        # One per distinct TLS and proxy settings a watched provider has now: a reload that changes them closes
        # the pool no provider uses any more, once no read holds it (`_lent`: reads under way per settings).
        self._transports: dict[Settings, httpcore.AsyncConnectionPool] = {}
        self._lent: Counter[Settings] = Counter()
        self._watched: Watched = {}
        # Why each replica's metrics cannot be read now (None: they can), so that only changes are logged.
        self._trouble: dict[Key, str | None] = {}
        self._heavy: set[Key] = set()  # replicas whose last read that gave a load was heavy (logged once)
        super().__init__()

    def start(self) -> None:
        # Also without a watched fleet now: a reload may add one, and the supervisor follows reloads.
        self._spawn(self._run(), "fleet-engine-metrics")

    def _transport(self, p: ProviderConfig) -> httpcore.AsyncConnectionPool:
        settings = _settings(p)
        transport = self._transports.get(settings)
        if transport is None:
            transport = self._transports[settings] = self._transport_for(p)
        return transport

    async def _run(self) -> None:
        readers: dict[Key, asyncio.Task[None]] = {}
        broken = 0  # checks in a row that failed
        try:
            while True:
                try:
                    await self._follow(readers)
                except Exception as exc:  # a bug must not end the reader: the replicas it reads go on being read
                    broken += 1
                    self._failed("*", "reader")
                    if broken == 1:
                        log.warning(
                            "fleet: the engine-metrics reader cannot follow the config (%s: %s); it keeps "
                            "reading the replicas it had and tries again, less often while it fails",
                            type(exc).__name__,
                            exc,
                            exc_info=True,
                        )
                    await asyncio.sleep(min(_CONFIG_CHECK_S * 2 ** min(broken - 1, 16), MAX_BACKOFF_S))
                    continue
                if broken:
                    log.info("fleet: the engine-metrics reader follows the config again")
                    broken = 0
                await asyncio.sleep(_CONFIG_CHECK_S)
        finally:
            for task in readers.values():
                task.cancel()
            await asyncio.gather(*readers.values(), return_exceptions=True)
            for transport in self._transports.values():
                await transport.aclose()
            self._transports.clear()

    async def _follow(self, readers: dict[Key, asyncio.Task[None]]) -> None:
        """One look at the config serving now: a reading task per replica to read, none for the others,
        and the connection pools of settings no watched provider has any more closed."""
        loop = asyncio.get_running_loop()
        self._watched = watched_now = self._fleets()
        keys = {(n, i, u) for n, (f, *_) in watched_now.items() for i, u in enumerate(f.urls)}
        for key in keys - readers.keys():
            readers[key] = loop.create_task(self._replica(key), name=f"engine-metrics {key[0]}@{key[1]}")
        for key in readers.keys() - keys:
            readers.pop(key).cancel()
            self._trouble.pop(key, None)
            self._heavy.discard(key)
        in_use = {_settings(entry[3]) for entry in watched_now.values()}
        for settings in [s for s in self._transports if s not in in_use and not self._lent[s]]:
            self._lent.pop(settings, None)
            await self._transports.pop(settings).aclose()

    async def _replica(self, key: Key) -> None:
        name, i, url = key
        loop = asyncio.get_running_loop()
        failed = 0  # reads in a row that gave no load
        while True:
            started = loop.time()
            entry = self._watched.get(name)
            if entry is None or i >= entry[0].size or entry[0].urls[i] != url:
                return  # gone with a reload; the supervisor forgets it
            fleet, gauges, headers, provider = entry
            r = fleet.routing
            meter = Meter(r.metrics_max_bytes)
            settings = _settings(provider)
            self._lent[settings] += 1  # its pool stays open until this read ends
            try:
                load: EngineLoad | None = await read_load(
                    self._transport(provider),
                    server_root(url) + gauges.path,
                    gauges,
                    headers,
                    r.metrics_timeout_ms / 1000,
                    r.metrics_max_bytes,
                    meter,
                )
                cause: str | None = None
                kind: str | None = None
            except Unreadable as exc:
                load, cause, kind = None, str(exc), exc.kind
            except Exception as exc:  # a bug must not end the reader: keep routing on what is known
                log.exception("reading %s's engine metrics failed", fleet.names[i])
                load, cause, kind = None, f"unexpected {type(exc).__name__}", "unexpected"
            finally:
                self._lent[settings] -= 1
            if kind is not None:
                self._failed(fleet.names[i], kind)
            fleet.store(i, load, cause)  # None: unknown, routed as idle, not as dead
            self._note(key, fleet.names[i], cause)
            interval = r.metrics_interval_ms / 1000
            heavy = meter.taken > r.metrics_max_bytes // HEAVY_SHARE
            if kind is None:
                self._weigh(key, fleet.names[i], meter.taken if heavy else None)
            if kind is None and not heavy:
                failed = 0
                await asyncio.sleep(max(0.0, started + interval - loop.time()))
            else:
                # From the failed (or heavy) read's end, never at once (it may have run to its timeout), and twice
                # as long per one in a row: a replica that answers with work and no load, or with a load buried
                # under work just below the caps, is asked ever less often.
                failed = min(failed + 1, 32)
                wait = min(interval * 2 ** (failed - 1), max(interval, MAX_BACKOFF_S))
                fresh = interval + r.metrics_timeout_ms / 1000  # as old as a light read's load may get
                if load is not None and wait > fresh:
                    await asyncio.sleep(fresh)
                    wait -= fresh
                    if fleet.engine[i] is load:  # a heavy read's load steers no longer than a light one's
                        fleet.engine[i] = None
                        fleet.engine_error[i] = (
                            f"the last read was heavy ({meter.taken} bytes); read again in {wait:.1f} s"
                        )
                await asyncio.sleep(wait)

    def _weigh(self, key: Key, replica: str, heavy: int | None) -> None:
        """Log a change of a replica's reads between heavy (`heavy` bytes) and light once: WARNING, then INFO."""
        if heavy is not None and key not in self._heavy:
            self._heavy.add(key)
            log.warning(
                "fleet: %s's engine metrics took %d bytes to read, over a quarter of metrics_max_bytes; they are "
                "read ever less often while they stay that heavy",
                replica,
                heavy,
            )
        elif heavy is None and key in self._heavy:
            self._heavy.discard(key)
            log.info("fleet: %s's engine metrics are light again", replica)

    def _note(self, key: Key, replica: str, cause: str | None) -> None:
        """Log a change of a replica's readability once: WARNING when it is lost, INFO when it is back."""
        first = key not in self._trouble
        before = self._trouble.get(key)
        self._trouble[key] = cause
        if cause is not None and (first or before is None):
            log.warning(
                "fleet: %s's engine metrics cannot be read (%s); it is routed as if its load were unknown "
                "until they can",
                replica,
                cause,
            )
        elif cause is None and before is not None:
            log.info("fleet: %s's engine metrics are read again", replica)


def _settings(p: ProviderConfig) -> Settings:
    return (p.proxy, p.ca_bundle, p.client_cert, p.client_key)


def watched(fleets: Mapping[str, Fleet], providers: Mapping[str, ProviderConfig]) -> Watched:
    """The fleets whose engine load is read: `routing.engine_metrics` on and a kind that declares gauges."""
    out: dict[str, tuple[Fleet, EngineGauges, Mapping[str, str], ProviderConfig]] = {}
    for name, fleet in fleets.items():
        p = providers[name]
        gauges = REGISTRY[p.kind].engine_gauges
        if fleet.routing.engine_metrics and gauges is not None:
            headers = {k.lower(): v for k, v in p.headers.items()}
            if p.api_key:
                headers["authorization"] = f"Bearer {p.api_key}"
            out[name] = (fleet, gauges, headers, p)
    return out
