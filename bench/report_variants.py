"""The gateway's variants (workers, server, HTTP protocol, transport, limits, cache) under the same c=32 load."""

from __future__ import annotations

from collections.abc import Callable

from bench.report_format import Index, markdown_table, num, ratio, target_label, why_missing
from bench.report_run import RunResult
from bench.report_template import Template
from bench.scenarios import (
    CACHE_TARGET,
    GRANIAN,
    HTTPTOOLS,
    HTTPX,
    LIMITS_TARGET,
    TWO_WORKERS,
    Measurement,
    median_ratio,
)


def variants_section(t: Template, idx: Index, result: RunResult) -> str:
    """The gateway's variants under the same c=32 load, against the 1-worker gateway and the passthrough."""
    base = idx.get("nonstream_c32", "gateway")
    passthrough = idx.get("nonstream_c32", "passthrough")
    limits_base = idx.get("limits_c32", "gateway")
    cache_base = idx.get("cached_c32", "gateway")
    rows: list[list[str]] = []
    for scenario, target in (
        ("nonstream_c32", "gateway"),
        ("nonstream_c32", TWO_WORKERS),
        ("nonstream_c32", GRANIAN),
        ("nonstream_c32", HTTPTOOLS),
        ("nonstream_c32", HTTPX),
        ("limits_c32", LIMITS_TARGET),
        ("cached_c32", CACHE_TARGET),
    ):
        if idx.raw(scenario, target) is None:
            continue
        m = idx.get(scenario, target)
        if m is None:
            rows.append([f"`{target_label(target, result)}`", why_missing(idx, scenario, target), *["-"] * 5])
            continue
        # gateway+limits is compared with the plain gateway of its own scenario, measured right before it.
        versus = limits_base if target == LIMITS_TARGET else cache_base if target == CACHE_TARGET else base
        # The cache row is measured in rounds: its ratio is their median, as the Targets section reads it.
        hits = median_ratio(cache_base, m) if target == CACHE_TARGET else None
        rows.append(
            [
                f"`{target_label(target, result)}`",
                num(m.rps, 0),
                f"{hits:.2f}x" if hits is not None else ratio(m.rps, versus.rps if versus else None),
                ratio(m.rps, passthrough.rps if passthrough else None),
                num(m.p99_ms, 3),
                num(m.cpu_s_per_1k, 3),
                m.placement or "-",
            ]
        )
    table = markdown_table(
        ["target", "req/s", "vs 1-worker gateway", "vs passthrough", "p99 ms", "CPU s/1k", "placement"], rows
    )
    # The same gateway under the other servers and protocols, at one connection and at a fixed rate.
    servers = [
        (target, title)
        for target, title in ((GRANIAN, "gateway on granian"), (HTTPTOOLS, "gateway on uvicorn's httptools protocol"))
        if idx.raw("nonstream_c1", target) is not None
    ]
    servers_table: list[str] = []
    if servers:
        slow = f"{result.settings['latency_ms']:g} ms upstream at {result.settings['rate']:g} req/s"
        picks: list[tuple[str, str, Callable[[Measurement], float | None]]] = [
            ("c=1 p50 ms", "nonstream_c1", lambda m: m.p50_ms),
            ("c=1 p99 ms", "nonstream_c1", lambda m: m.p99_ms),
            (f"{slow}: p50 ms", "slow_fixed_rate", lambda m: m.p50_ms),
            (f"{slow}: p99 ms", "slow_fixed_rate", lambda m: m.p99_ms),
        ]
        targets = ["gateway", *(target for target, _ in servers)]
        servers_table = markdown_table(
            ["same load", "gateway (uvicorn, the gateway's own HTTP/1.1 protocol)", *(title for _, title in servers)],
            ([title, *(_cell(idx, scenario, target, pick) for target in targets)] for title, scenario, pick in picks),
        )
    return t.section("variants", table="\n".join(table), servers_table="\n".join(servers_table))


def _cell(idx: Index, scenario: str, target: str, pick: Callable[[Measurement], float | None]) -> str:
    m = idx.get(scenario, target)
    return num(pick(m), 3) if m is not None else why_missing(idx, scenario, target)
