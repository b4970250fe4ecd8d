"""The engines' own load, read in the background: each replica's Prometheus `/metrics`, never on the request path.

For every provider whose `routing.engine_metrics` is on and whose kind declares its gauges
(providers/engine.py), one task reads each replica's exposition every `routing.metrics_interval_ms` and
stores the waiting queue, the running batch and the KV-cache usage on the provider's Fleet. A replica
whose metrics cannot be read (refused, timed out, unparsable, missing series) is stored as unknown: it is
routed as if idle, not as if dead; its health is the failover loop's business.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

import httpx

from gateway.config import ProviderConfig
from gateway.fleet.background import Background
from gateway.fleet.picker import EngineLoad, Fleet
from providers import REGISTRY
from providers.engine import EngineGauges
from providers.tokenizer import server_root

log = logging.getLogger("gateway.fleet")

# The most of an exposition read: vLLM's is tens of kilobytes (histograms per model); more is not metrics.
MAX_EXPOSITION_BYTES = 4 * 1024 * 1024


def parse(text: str, gauges: EngineGauges) -> EngineLoad | None:
    """The load in one Prometheus text exposition (series summed over their labels), or None without the
    waiting queue's series."""
    wanted = {*gauges.waiting, *gauges.running, *gauges.kv_usage}
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if name_end <= 0:
            continue
        name = line[:name_end]
        if name not in wanted:
            continue
        rest = line[line.find("}", name_end) + 1 :] if line[name_end] == "{" else line[name_end:]
        value = rest.split()
        try:
            found[name] = found.get(name, 0.0) + float(value[0])
        except (IndexError, ValueError):
            continue

    def first(names: tuple[str, ...]) -> float | None:
        return next((found[n] for n in names if n in found), None)

    waiting = first(gauges.waiting)
    if waiting is None:
        return None
    return EngineLoad(waiting=waiting, running=first(gauges.running) or 0.0, kv_usage=first(gauges.kv_usage))


class EngineReader(Background):
    """One background task per pipeline: every fleet with engine metrics on, each replica in turn."""

    def __init__(self, fleets: Callable[[], Mapping[str, tuple[Fleet, EngineGauges, Mapping[str, str]]]]) -> None:
        self._fleets = fleets
        super().__init__()

    def start(self) -> None:
        if self._fleets():
            self._spawn(self._run(), "fleet-engine-metrics")

    async def _run(self) -> None:
        async with httpx.AsyncClient(trust_env=False, timeout=2.0) as client:
            while True:
                fleets = self._fleets()
                interval = min((f.routing.metrics_interval_ms for f, _, _ in fleets.values()), default=1000)
                await asyncio.gather(*(self.read_fleet(client, *entry) for entry in fleets.values()))
                await asyncio.sleep(interval / 1000)

    @staticmethod
    async def read_fleet(
        client: httpx.AsyncClient, fleet: Fleet, gauges: EngineGauges, headers: Mapping[str, str]
    ) -> None:
        async def one(i: int, url: str) -> None:
            try:
                resp = await client.get(server_root(url) + gauges.path, headers=dict(headers))
                body = resp.content[:MAX_EXPOSITION_BYTES]
                fleet.engine[i] = parse(body.decode("utf-8", "replace"), gauges) if resp.status_code == 200 else None
            except (httpx.HTTPError, OSError):
                fleet.engine[i] = None  # unknown, not dead
            except Exception:  # a bug must not end the reader: keep routing on what is known
                log.exception("reading %s's engine metrics failed", fleet.names[i])
                fleet.engine[i] = None

        await asyncio.gather(*(one(i, url) for i, url in enumerate(fleet.urls)))


def watched(
    fleets: Mapping[str, Fleet], providers: Mapping[str, ProviderConfig]
) -> dict[str, tuple[Fleet, EngineGauges, Mapping[str, str]]]:
    """The fleets whose engine load is read: `routing.engine_metrics` on and a kind that declares gauges."""
    out: dict[str, tuple[Fleet, EngineGauges, Mapping[str, str]]] = {}
    for name, fleet in fleets.items():
        p = providers[name]
        gauges = REGISTRY[p.kind].engine_gauges
        if fleet.routing.engine_metrics and gauges is not None:
            headers = {k.lower(): v for k, v in p.headers.items()}
            if p.api_key:
                headers["authorization"] = f"Bearer {p.api_key}"
            out[name] = (fleet, gauges, headers)
    return out
