"""The everything-on memory soak (``all_soak``): bench/everything.py's gateway, every request a new prompt.

A freshly started ``gateway+all`` gets ``--soak-requests`` completions, each a cache miss that the memory
store keeps, in ten wrk legs of a tenth each; its RSS is read before the load, after each leg and at the end,
and the cache's own count of what it holds (``GET /admin/status``) is read at the end against its bound. The
store's bound is set below the default so that it fills early in a long soak and the rest of it evicts: what
RSS does after that is the gateway's, not the cache filling. Report: docs/bench-harness.md.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import TYPE_CHECKING, Any, Final

from bench import wrk
from bench.processes import Service, Window

if TYPE_CHECKING:
    from bench.runner import Runner
    from bench.scenarios import Measurement, Scenario

SCENARIO: Final = "all_soak"
# The memory store's bound in this soak (the default is 256 MiB): a few percent of a million misses fill it.
CACHE_MAX_BYTES: Final = 16 * 1024 * 1024
_ADMIN_KEY: Final = "bench-admin"
# Merged over bench/everything.py's fragment for this scenario's server only.
FRAGMENT: Final[dict[str, object]] = {"cache": {"max_bytes": CACHE_MAX_BYTES}, "admin": {"key": _ADMIN_KEY}}
LEGS: Final = 10
_SETTLE_S: Final = 0.5  # after a leg, before RSS is read: answers still in flight are done with
_VARY: Final = "Say hello"


def cache_stats(service: Service) -> dict[str, Any]:
    """The cache's part of the server's `GET /admin/status` (its memory store's entries, bytes and bound)."""
    req = urllib.request.Request(f"{service.base_url}/admin/status", headers={"authorization": f"Bearer {_ADMIN_KEY}"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
    with opener.open(req, timeout=10) as resp:
        stats: dict[str, Any] = json.loads(resp.read())["cache"]
    return stats


def measure(
    runner: Runner, scenario: Scenario, target: str, service: Service, url: str, body: bytes, placement: str
) -> Measurement:
    """The soak of one freshly started target; `placement` as the runner describes it."""
    from bench.measuring import cpu_per_1k, wrk_errors  # it imports this module
    from bench.scenarios import Measurement

    s = runner.settings
    known = [m.rps for m in runner.measurements if m.scenario == "all_c32" and m.target == target and m.ok]
    rps = known[0] if known and known[0] else 500.0
    total, per_leg = s.soak_requests, max(1, s.soak_requests // LEGS)
    pids = service.pids()
    window = Window(service)
    series: list[list[float]] = [[0, round(service.rss_mib(pids), 1)]]
    legs: list[wrk.WrkSummary] = []
    done = 0
    for i in range(LEGS):
        count = per_leg if i < LEGS - 1 else max(1, total - done)
        # Each leg's script has its own nonce: no prompt of one leg meets an entry another stored.
        script = wrk.write_script(body, s.work_dir, f"{SCENARIO}-{target}-{i}".replace("+", "-"), count, _VARY)
        # The Lua hook ends the leg at `count`; -d only bounds a server that slowed to a third.
        leg = wrk.run(url, script, scenario.connections, count / (rps / 3.0) + 30.0)
        legs.append(leg)
        done += leg.requests
        rps = leg.rps or rps
        time.sleep(_SETTLE_S)
        series.append([done, round(service.rss_mib(pids), 1)])
        if leg.requests < count:
            break
    window.close()
    cache = cache_stats(service)
    errors = sum(x.errors for x in legs)
    duration_s = sum(x.duration_us for x in legs) / 1e6
    short = done < total
    first, end = series[1][1], series[-1][1]
    last = legs[-1]
    notes = [f"wrk hit its time bound after {done:,} of {total:,} requests"] if short else []
    notes += [wrk_errors(x) for x in legs if x.errors]
    return Measurement(
        scenario.name,
        target,
        scenario.upstream,
        scenario.tool,
        ok=errors == 0 and not short,
        note="; ".join(notes) or None,
        placement=placement,
        requests=done,
        errors=errors,
        duration_s=round(duration_s, 1),
        rps=round(done / duration_s, 1) if duration_s else None,
        mean_ms=round(last.mean_us / 1000.0, 3),
        p50_ms=last.p50_us / 1000.0,
        p90_ms=last.p90_us / 1000.0,
        p99_ms=last.p99_us / 1000.0,
        max_ms=last.max_us / 1000.0,
        cpu_s_per_1k=cpu_per_1k(window.cpu_s, done),
        peak_rss_mib=round(service.peak_rss_mib(), 1),
        core_busy_pct=window.busy,
        other_load_pct=window.other_load_pct(),
        checkpoint_requests=int(series[1][0]),
        rss_idle_mib=series[0][1],
        rss_checkpoint_mib=first,
        rss_end_mib=end,
        rss_growth_pct=round(100.0 * (end - first) / first, 2) if first else None,
        rss_series_mib=series,
        cache_entries=int(cache["memory_entries"]),
        cache_bytes=int(cache["memory_bytes"]),
        cache_max_bytes=int(cache["memory_max_bytes"]),
        cache_evictions=int(cache["evictions"]),
    )
