"""How each tool measures one target: wrk's closed loop, the soak, the held streams, TTFB and a fixed rate.

Each function puts the load on a server the runner (bench/runner.py) started and placed, and turns what the
tool and the server's CPU window report into one ``Measurement``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from bench import clients, processes, soak_everything, wrk
from bench.processes import Service
from bench.scenarios import HOLD_CHUNKS, SETTLE_S, Measurement, Scenario

if TYPE_CHECKING:
    from bench.runner import Runner


def measure_wrk(
    runner: Runner, scenario: Scenario, target: str, service: Service, url: str, body: bytes
) -> Measurement:
    s = runner.settings
    name = f"{scenario.name}-{target}".replace("+", "-")
    vary = "Say hello" if scenario.vary else None
    if s.warmup_s > 0:
        warmup = wrk.write_script(body, s.work_dir, f"{name}-warmup", vary=vary)
        wrk.run(url, warmup, scenario.connections, s.warmup_s)
    # Written after the warm-up: a varied script's prompts are unique to it, so none was cached then.
    script = wrk.write_script(body, s.work_dir, name, vary=vary)
    window = processes.Window(service)
    summary = wrk.run(url, script, scenario.connections, s.duration_s)
    window.close()
    result = Measurement(
        scenario.name,
        target,
        scenario.upstream,
        scenario.tool,
        ok=summary.errors == 0 and summary.requests > 0,
        placement=runner.placement(scenario, target),
        requests=summary.requests,
        errors=summary.errors,
        duration_s=round(summary.duration_us / 1e6, 3),
        rps=round(summary.rps, 1),
        mean_ms=round(summary.mean_us / 1000.0, 3),
        p50_ms=summary.p50_us / 1000.0,
        p90_ms=summary.p90_us / 1000.0,
        p99_ms=summary.p99_us / 1000.0,
        max_ms=summary.max_us / 1000.0,
        cpu_s_per_1k=cpu_per_1k(window.cpu_s, summary.requests),
        peak_rss_mib=round(service.peak_rss_mib(), 1),
        core_busy_pct=window.busy,
        other_load_pct=window.other_load_pct(),
    )
    if summary.errors:
        result.note = wrk_errors(summary)
    return result


def _c32_rps(runner: Runner, target: str) -> float | None:
    """This run's saturated throughput of ``target``, if measured: it sizes the soak's time bound."""
    for m in runner.measurements:
        if m.scenario == "nonstream_c32" and m.target == target and m.ok and m.rps:
            return m.rps
    return None


def measure_soak(
    runner: Runner, scenario: Scenario, target: str, service: Service, url: str, body: bytes
) -> Measurement:
    if scenario.name == soak_everything.SCENARIO:
        placement = runner.placement(scenario, target)
        return soak_everything.measure(runner, scenario, target, service, url, body, placement)
    s = runner.settings
    expected_rps = _c32_rps(runner, target) or 1000.0

    def leg(count: int, label: str, rps: float) -> wrk.WrkSummary:
        script = wrk.write_script(body, s.work_dir, f"soak-{target}-{label}", stop_after=count)
        # The Lua hook ends the run at ``count``; -d only bounds a server that slowed to a third.
        return wrk.run(url, script, scenario.connections, count / (rps / 3.0) + 30.0)

    window = processes.Window(service)
    first = leg(s.soak_checkpoint, "checkpoint", expected_rps)
    time.sleep(SETTLE_S)
    rss_checkpoint = service.rss_mib()
    rest = max(1, s.soak_requests - first.requests)
    second = leg(rest, "rest", first.rps or expected_rps)
    time.sleep(SETTLE_S)
    rss_end = service.rss_mib()
    window.close()
    requests = first.requests + second.requests
    errors = first.errors + second.errors
    duration_s = (first.duration_us + second.duration_us) / 1e6
    short = first.requests < s.soak_checkpoint or second.requests < rest
    result = Measurement(
        scenario.name,
        target,
        scenario.upstream,
        scenario.tool,
        ok=errors == 0 and not short,
        placement=runner.placement(scenario, target),
        requests=requests,
        errors=errors,
        duration_s=round(duration_s, 1),
        rps=round(requests / duration_s, 1) if duration_s else None,
        # Latency of the long second leg; the first is partly warm-up.
        mean_ms=round(second.mean_us / 1000.0, 3),
        p50_ms=second.p50_us / 1000.0,
        p90_ms=second.p90_us / 1000.0,
        p99_ms=second.p99_us / 1000.0,
        max_ms=second.max_us / 1000.0,
        cpu_s_per_1k=cpu_per_1k(window.cpu_s, requests),
        peak_rss_mib=round(service.peak_rss_mib(), 1),
        core_busy_pct=window.busy,
        other_load_pct=window.other_load_pct(),
        checkpoint_requests=first.requests,
        rss_checkpoint_mib=round(rss_checkpoint, 1),
        rss_end_mib=round(rss_end, 1),
        rss_growth_pct=round(100.0 * (rss_end - rss_checkpoint) / rss_checkpoint, 2) if rss_checkpoint else None,
    )
    notes = []
    if short:
        notes.append(f"wrk hit its time bound after {requests:,} of {s.soak_requests:,} requests")
    if errors:
        notes.append("; ".join(wrk_errors(x) for x in (first, second) if x.errors))
    result.note = "; ".join(notes) or None
    return result


def measure_hold(
    runner: Runner, scenario: Scenario, target: str, service: Service, url: str, body: bytes
) -> Measurement:
    s = runner.settings
    # The tree is fixed once the server is up; scanning /proc for it at every sample would cost
    # the client's core more than reading the few status files does.
    pids = service.pids()
    idle = processes.rss_mib(pids)
    expected_s = HOLD_CHUNKS * s.hold_interval_ms / 1000.0
    window = processes.Window(service)
    res = clients.hold_streams(url, body, s.hold_streams, expected_s, lambda: processes.rss_mib(pids))
    window.close()
    notes = [f"first error: {res.first_error}"] if res.first_error else []
    if res.max_open < res.streams:
        notes.append(f"at most {res.max_open:,} of {res.streams:,} streams were open at once")
    if res.completed and res.events_min != res.events_max:
        notes.append(f"events per stream varied from {res.events_min} to {res.events_max}")
    return Measurement(
        scenario.name,
        target,
        scenario.upstream,
        scenario.tool,
        ok=res.errors == 0 and res.completed == res.streams,
        note="; ".join(notes) or None,
        placement=runner.placement(scenario, target),
        requests=res.completed,
        errors=res.errors,
        duration_s=round(window.wall_s, 1),
        ttfb_p50_ms=round(res.ttfb_p50_ms, 3),
        ttfb_p99_ms=round(res.ttfb_p99_ms, 3),
        total_p50_ms=round(res.total_p50_ms, 1),
        total_p99_ms=round(res.total_p99_ms, 1),
        events_per_stream=res.events_min,
        cpu_s_per_1k=cpu_per_1k(window.cpu_s, res.streams),
        peak_rss_mib=round(service.peak_rss_mib(), 1),
        core_busy_pct=window.busy,
        other_load_pct=window.other_load_pct(),
        rss_idle_mib=round(idle, 1),
        rss_hold_mib=res.rss_peak_mib,
        concurrent_streams=res.max_open,
    )


def measure_ttfb(
    runner: Runner, scenario: Scenario, target: str, service: Service, url: str, body: bytes
) -> Measurement:
    s = runner.settings
    window = processes.Window(service)
    res = clients.stream_ttfb(url, body, s.ttfb_streams, s.ttfb_warmup)
    window.close()
    total = res.streams + s.ttfb_warmup
    return Measurement(
        scenario.name,
        target,
        scenario.upstream,
        scenario.tool,
        ok=res.errors == 0 and res.streams > 0,
        placement=runner.placement(scenario, target),
        note=res.first_error,
        requests=res.streams,
        errors=res.errors,
        ttfb_p50_ms=round(res.ttfb_p50_ms, 3),
        ttfb_p90_ms=round(res.ttfb_p90_ms, 3),
        ttfb_p99_ms=round(res.ttfb_p99_ms, 3),
        total_p50_ms=round(res.total_p50_ms, 3),
        total_p90_ms=round(res.total_p90_ms, 3),
        events_per_stream=res.events_per_stream,
        cpu_s_per_1k=cpu_per_1k(window.cpu_s, total),
        peak_rss_mib=round(service.peak_rss_mib(), 1),
        core_busy_pct=window.busy,
        other_load_pct=window.other_load_pct(),
    )


def measure_fixed_rate(
    runner: Runner, scenario: Scenario, target: str, service: Service, url: str, body: bytes
) -> Measurement:
    s = runner.settings
    if scenario.rate is None:
        rate, count, warmup = s.rate, s.rate_count, s.rate_warmup
    else:
        rate = scenario.rate
        count = max(1, round(rate * s.sweep_seconds))
        warmup = round(rate * s.sweep_warmup_s)
    window = processes.Window(service)
    res = clients.fixed_rate(url, body, rate, count, warmup)
    window.close()
    return Measurement(
        scenario.name,
        target,
        scenario.upstream,
        scenario.tool,
        ok=res.errors == 0 and res.ok > 0,
        placement=runner.placement(scenario, target),
        note=res.first_error,
        requests=res.ok,
        errors=res.errors,
        duration_s=round(window.wall_s, 3),
        rps=res.achieved_rps,
        p50_ms=round(res.p50_ms, 3),
        p90_ms=round(res.p90_ms, 3),
        p99_ms=round(res.p99_ms, 3),
        max_ms=round(res.max_ms, 3),
        cpu_s_per_1k=cpu_per_1k(window.cpu_s, count + warmup),
        peak_rss_mib=round(service.peak_rss_mib(), 1),
        core_busy_pct=window.busy,
        other_load_pct=window.other_load_pct(),
        offered_rps=scenario.rate,
    )


def wrk_errors(summary: wrk.WrkSummary) -> str:
    return (
        f"{summary.errors} errors (status {summary.status}, connect {summary.connect}, "
        f"read {summary.read}, write {summary.write}, timeout {summary.timeout})"
    )


def cpu_per_1k(cpu_s: float, requests: int) -> float | None:
    # /proc/<pid>/stat counts in 10 ms ticks: below ~10 ticks the quotient is mostly rounding.
    if requests <= 0 or cpu_s < 0.1:
        return None
    return round(cpu_s / requests * 1000.0, 4)
