"""Scenario definitions: what is measured, against which targets, and the row each measurement becomes.

Targets of one scenario share one upstream process and run back to back (bench/runner.py), so "direct",
"passthrough" and "gateway" differ only in what sits between the load generator and the upstream. CPU
placement, the gateway variants (``gateway-2w``, ``gateway-granian``, ``gateway-httptools``, ``gateway-httpx``,
``gateway+limits``)
and the memory rows: docs/bench-harness.md.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec

from bench import everything, features, soak_everything
from bench.everything import EVERYTHING, EVERYTHING_2W, EVERYTHING_PG, EVERYTHING_TARGETS, PASSTHROUGH_2W

REQUEST: dict[str, object] = {"model": "up/bench-model", "prompt": "Say hello", "max_tokens": 16}
BODY = msgspec.json.encode(REQUEST)
STREAM_BODY = msgspec.json.encode({**REQUEST, "stream": True})
CHAT_BODY = msgspec.json.encode(everything.CHAT_REQUEST)
CHAT_STREAM_BODY = msgspec.json.encode({**everything.CHAT_REQUEST, "stream": True})
CHAT_PATH = "/v1/chat/completions"

TARGET_CPU = 0
LOADGEN_CPU = 1
# Per target and upstream group; a server that keeps dying is a finding, not something to retry.
MAX_RESTARTS = 2
# Above this CPU use by processes outside the bench (% of one core), a measurement is repeated once.
NOISY_PCT = 20.0

# Wait after a load stops before reading RSS, so answers still in flight at the stop are done with.
SETTLE_S = 0.5
# The Python upstream's schedule for the held streams: HOLD_CHUNKS events, --hold-interval-ms apart.
HOLD_CHUNKS = 100

UpstreamKind = Literal["nginx", "fast", "slow", "hold"]
Tool = Literal["wrk", "fixed-rate", "ttfb", "soak", "hold"]
Placement = Literal["split", "shared"]
TARGETS = ("direct", "passthrough", "gateway")
TWO_WORKERS = "gateway-2w"
GRANIAN = "gateway-granian"
# The gateway under uvicorn with uvicorn's httptools protocol instead of its own (docs/servers.md).
HTTPTOOLS = "gateway-httptools"
HTTPX = "gateway-httpx"
LIMITS_TARGET = "gateway+limits"
# The gateway with `cache: {mode: always}` (docs/cache.md): after the first request, every answer is a hit.
CACHE_TARGET = "gateway+cache"
# What --targets may name; LIMITS_TARGET comes with --limits-config instead.
ALL_TARGETS = (*TARGETS, TWO_WORKERS, GRANIAN, HTTPTOOLS, HTTPX)
# What runs when --targets is not given: the httpx row is asked for by name.
DEFAULT_TARGETS = (*TARGETS, TWO_WORKERS, GRANIAN, HTTPTOOLS)


@dataclass(frozen=True)
class GatewayVariant:
    """How one gateway target is started; ``workers`` None means the --workers setting."""

    workers: int | None = None
    server: str = "uvicorn"
    # Under uvicorn, the HTTP/1.1 protocol (`serve --http`): the gateway's own, or uvicorn's "httptools".
    http: str = "gateway"
    limits: bool = False
    # More than one worker process cannot be confined to the one core a measured server gets.
    pinned: bool = True
    # The bench provider's `transport:` (None: the config default, `auto`, which is h1 on the bench).
    transport: str | None = None
    cache: bool = False
    # bench/everything.py's configuration, with its ledger on "sqlite" or "postgresql".
    everything: bool = False
    ledger: str = "sqlite"
    # bench/features.py: the access log off and this one feature on ("nothing": none).
    feature: str | None = None


VARIANTS: dict[str, GatewayVariant] = {
    "gateway": GatewayVariant(),
    LIMITS_TARGET: GatewayVariant(limits=True),
    CACHE_TARGET: GatewayVariant(cache=True),
    TWO_WORKERS: GatewayVariant(workers=2, pinned=False),
    GRANIAN: GatewayVariant(server="granian"),
    HTTPTOOLS: GatewayVariant(http="httptools"),
    HTTPX: GatewayVariant(transport="httpx"),
    EVERYTHING: GatewayVariant(everything=True),
    EVERYTHING_PG: GatewayVariant(everything=True, ledger="postgresql"),
    EVERYTHING_2W: GatewayVariant(everything=True, workers=2, pinned=False),
    features.NOTHING: GatewayVariant(feature="nothing"),
    **{f.target: GatewayVariant(feature=f.name) for f in features.FEATURES},
}
# Targets the runner adds by itself when their scenarios run (not named in --targets).
IMPLIED_TARGETS = (LIMITS_TARGET, CACHE_TARGET, *EVERYTHING_TARGETS, PASSTHROUGH_2W, *features.TARGETS)
# Targets that need the Redis the bench starts.
REDIS_TARGETS = (*EVERYTHING_TARGETS, *features.REDIS_TARGETS)


class Measurement(msgspec.Struct):
    """One target under one scenario; fields a tool does not produce stay None."""

    scenario: str
    target: str
    upstream: str
    tool: str
    ok: bool
    note: str | None = None
    placement: str | None = None
    requests: int | None = None
    errors: int | None = None
    duration_s: float | None = None
    rps: float | None = None
    mean_ms: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    ttfb_p50_ms: float | None = None
    ttfb_p90_ms: float | None = None
    ttfb_p99_ms: float | None = None
    total_p50_ms: float | None = None
    total_p90_ms: float | None = None
    events_per_stream: int | None = None
    cpu_s_per_1k: float | None = None
    peak_rss_mib: float | None = None
    core_busy_pct: dict[str, float] | None = None
    # CPU (% of one core) used by processes outside the bench: other work competing with it.
    other_load_pct: float | None = None
    # Not measured on purpose (e.g. granian missing); the note says why. Not a failure of the target.
    skipped: bool = False
    # load_sweep: the rate the open-loop client offered (rps is what was achieved).
    offered_rps: float | None = None
    # A scenario of rounds (Scenario.rounds): req/s of each of this target's runs in round order (None: a run
    # that failed); the other fields are its median run's.
    runs_rps: list[float | None] | None = None
    # soak: current RSS (VmRSS, whole tree) after the first checkpoint_requests and after all requests.
    checkpoint_requests: int | None = None
    rss_checkpoint_mib: float | None = None
    rss_end_mib: float | None = None
    rss_growth_pct: float | None = None
    # all_soak (bench/soak_everything.py): [requests, RSS MiB] before the load and after each tenth; what the
    # cache's memory store held at the end (entries, bytes counted against its bound) and had evicted.
    rss_series_mib: list[list[float]] | None = None
    cache_entries: int | None = None
    cache_bytes: int | None = None
    cache_max_bytes: int | None = None
    cache_evictions: int | None = None
    # hold_streams: RSS before the streams opened, peak RSS while they were open, most open at once.
    rss_idle_mib: float | None = None
    rss_hold_mib: float | None = None
    concurrent_streams: int | None = None
    total_p99_ms: float | None = None


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    upstream: UpstreamKind
    tool: Tool
    stream: bool = False
    connections: int = 1
    targets: tuple[str, ...] = TARGETS
    # Offered load of a fixed-rate row; None: Settings.rate.
    rate: float | None = None
    # Measure freshly started servers (stopped afterwards) instead of the group's warm ones.
    fresh: bool = False
    # "split": the measured server alone on TARGET_CPU, everything else on LOADGEN_CPU (throughput).
    # "shared": every process on LOADGEN_CPU. For one-at-a-time latency: on a VM a wake-up across
    # cores can cost milliseconds and would drown the microseconds a hop adds.
    placement: Placement = "split"
    # The route the load goes to, and whether every request carries a prompt of its own (a cache miss).
    path: str = "/v1/completions"
    vary: bool = False
    # Measure the targets this many times, each round in the order opposite the last (A B, B A, A B): every
    # target's row is its median run, and each of its runs sits next to one of the others'.
    rounds: int = 1


@dataclass(frozen=True)
class Settings:
    """Everything the CLI decides; see ``bench.__main__`` for the defaults of each mode."""

    duration_s: float
    warmup_s: float
    connections: int
    chunks: int
    chunk_interval_ms: float
    latency_ms: float
    rate: float
    rate_count: int
    rate_warmup: int
    ttfb_streams: int
    ttfb_warmup: int
    workers: int
    pin: bool
    work_dir: Path
    log_dir: Path
    # soak: total requests, and the count after which RSS is read the first time.
    soak_requests: int = 1_000_000
    soak_checkpoint: int = 100_000
    soak_passthrough: bool = False
    # hold_streams: concurrent streams, and the upstream's gap between their events.
    hold_streams: int = 1000
    hold_interval_ms: float = 50.0
    # load_sweep: offered rates, seconds measured at each (after sweep_warmup_s unmeasured).
    sweep_rates: tuple[float, ...] = (500.0, 1000.0, 1500.0, 2000.0, 2500.0, 3000.0, 4000.0)
    sweep_seconds: float = 4.0
    sweep_warmup_s: float = 0.5
    targets: tuple[str, ...] = DEFAULT_TARGETS
    only: frozenset[str] | None = None
    limits_config: Path | None = None
    # Total seconds the run may spend waiting for other processes to quieten down before measuring.
    wait_idle_s: float = 0.0
    # The feature_* rows: rounds of nothing on and the feature on (Scenario.rounds).
    feature_rounds: int = 3
    # The everything-on rows the goals are read off (`all_c32`, `all_c1`, `all_chat_c1`): rounds of their targets.
    everything_rounds: int = 3


def build_scenarios(settings: Settings) -> list[Scenario]:
    c = settings.connections
    scenarios = [
        Scenario(
            "nonstream_c32",
            f"non-streaming, {c} connections",
            "nginx",
            "wrk",
            connections=c,
            targets=(*TARGETS, TWO_WORKERS, GRANIAN, HTTPTOOLS, HTTPX),
        ),
        Scenario(
            "nonstream_c1",
            "non-streaming, 1 connection",
            "nginx",
            "wrk",
            connections=1,
            placement="shared",
            targets=(*TARGETS, GRANIAN, HTTPTOOLS, HTTPX),
        ),
        Scenario(
            "pyupstream_c32",
            f"Python upstream ceiling, non-streaming, {c} connections",
            "fast",
            "wrk",
            connections=c,
            targets=("direct",),
        ),
        Scenario(
            "stream_c32",
            f"streaming {settings.chunks} chunks, {c} connections",
            "fast",
            "wrk",
            stream=True,
            connections=c,
            targets=(*TARGETS, HTTPX),
        ),
        Scenario(
            "stream_ttfb",
            f"streaming {settings.chunks} chunks, TTFB at 1 connection",
            "fast",
            "ttfb",
            stream=True,
            placement="shared",
            targets=(*TARGETS, HTTPX),
        ),
        Scenario(
            "slow_fixed_rate",
            f"{settings.latency_ms:g} ms upstream at {settings.rate:g} req/s",
            "slow",
            "fixed-rate",
            targets=(*TARGETS, GRANIAN, HTTPTOOLS, HTTPX),
        ),
    ]
    if settings.limits_config is not None:
        # Hook for the rate-limit work: same load as nonstream_c32 against a gateway whose config
        # has the fragment from --limits-config merged in (e.g. Redis-backed limits). The passthrough and
        # the plain gateway are measured again right before it: this VM's speed drifts over minutes, so
        # the ratio is only fair between rows seconds apart.
        scenarios.append(
            Scenario(
                "limits_c32",
                f"non-streaming with limits config, {c} connections",
                "nginx",
                "wrk",
                connections=c,
                targets=("passthrough", "gateway", LIMITS_TARGET),
            )
        )
    # The response cache: the same load as nonstream_c32, every answer a hit, beside the plain gateway
    # measured right before it (each request of the plain one goes to the upstream). Its goal is a ratio
    # of two runs, so it takes the feature rows' rounds: one slow minute of the machine moved it by a fifth.
    scenarios.append(
        Scenario(
            "cached_c32",
            f"non-streaming, every answer a cache hit, {c} connections",
            "nginx",
            "wrk",
            connections=c,
            targets=("gateway", CACHE_TARGET),
            rounds=settings.feature_rounds,
        )
    )
    scenarios += everything_scenarios(c, settings.everything_rounds)
    # Each feature alone (bench/features.py), right after the gateway with nothing on.
    scenarios += [
        Scenario(
            f.scenario,
            f"{f.name} alone against nothing on, every request a miss, {c} connections",
            "nginx",
            "wrk",
            connections=c,
            vary=True,
            targets=(features.NOTHING, f.target),
            rounds=settings.feature_rounds,
        )
        for f in features.FEATURES
    ]
    # One row per offered rate and target; rates in the outer loop so drift over the sweep hits
    # every target alike.
    scenarios += [
        Scenario("load_sweep", f"open loop at {rate:g} req/s", "nginx", "fixed-rate", rate=rate)
        for rate in settings.sweep_rates
    ]
    scenarios.append(
        Scenario(
            "soak",
            f"memory over {settings.soak_requests:,} requests, {c} connections",
            "nginx",
            "soak",
            connections=c,
            targets=("passthrough", "gateway") if settings.soak_passthrough else ("gateway",),
            fresh=True,
        )
    )
    # The everything-on soak (bench/soak_everything.py): RSS over --soak-requests misses the cache keeps.
    scenarios.append(
        Scenario(
            soak_everything.SCENARIO,
            f"everything on, memory over {settings.soak_requests:,} requests, each a cache miss, {c} connections",
            "nginx",
            "soak",
            connections=c,
            targets=(EVERYTHING,),
            fresh=True,
            vary=True,
        )
    )
    scenarios.append(
        Scenario(
            "hold_streams",
            f"{settings.hold_streams:,} concurrent streams of {HOLD_CHUNKS} events "
            f"{settings.hold_interval_ms:g} ms apart",
            "hold",
            "hold",
            stream=True,
            connections=settings.hold_streams,
        )
    )
    wanted = settings.only
    return [s for s in scenarios if wanted is None or s.name in wanted]


def everything_scenarios(c: int, rounds: int = 1) -> list[Scenario]:
    """The rows of bench/everything.py's configuration, each beside the passthrough in the same scenario; the
    rows the goals are read off in `rounds` rounds (each round's ratio against the passthrough beside it)."""
    plain = ("passthrough", "gateway", EVERYTHING)
    return [
        Scenario(
            "all_c32",
            f"everything on, every request a cache miss, {c} connections",
            "nginx",
            "wrk",
            connections=c,
            vary=True,
            targets=(*plain, EVERYTHING_PG),
            rounds=rounds,
        ),
        Scenario(
            "all_hits_c32",
            f"everything on, every answer a cache hit, {c} connections",
            "nginx",
            "wrk",
            connections=c,
            targets=("passthrough", EVERYTHING),
        ),
        Scenario(
            "all_chat_c32",
            f"everything on, chat, every request a miss, {c} connections",
            "nginx",
            "wrk",
            connections=c,
            vary=True,
            path=CHAT_PATH,
            targets=plain,
        ),
        Scenario(
            "all_stream_c32",
            f"everything on, streamed, every request a miss, {c} connections",
            "fast",
            "wrk",
            stream=True,
            connections=c,
            vary=True,
            targets=plain,
        ),
        Scenario(
            "all_chat_stream_c32",
            f"everything on, chat streamed, every request a miss, {c} connections",
            "fast",
            "wrk",
            stream=True,
            connections=c,
            vary=True,
            path=CHAT_PATH,
            targets=("passthrough", EVERYTHING),
        ),
        Scenario(
            "all_c1",
            "everything on, every request a miss, 1 connection",
            "nginx",
            "wrk",
            placement="shared",
            vary=True,
            targets=("direct", *plain),
            rounds=rounds,
        ),
        Scenario(
            "all_chat_c1",
            "everything on, chat, every request a miss, 1 connection",
            "nginx",
            "wrk",
            placement="shared",
            vary=True,
            path=CHAT_PATH,
            targets=("direct", "passthrough", EVERYTHING),
            rounds=rounds,
        ),
        Scenario(
            "all_2w_c32",
            f"everything on, two workers, every request a miss, {c} connections",
            "nginx",
            "wrk",
            connections=c,
            vary=True,
            targets=(PASSTHROUGH_2W, TWO_WORKERS, EVERYTHING_2W),
        ),
    ]


def round_order(targets: tuple[str, ...], rounds: int) -> list[str]:
    """The order a scenario's targets are measured in: each round the reverse of the last (A B, B A, A B)."""
    order: list[str] = []
    for n in range(rounds):
        order += targets if n % 2 == 0 else targets[::-1]
    return order


def round_ratios(base: Measurement | None, on: Measurement | None) -> list[float]:
    """`on`'s req/s over `base`'s in each round both ran in (one for a scenario measured once)."""
    if base is None or on is None:
        return []
    if base.runs_rps is None or on.runs_rps is None:
        return [on.rps / base.rps] if on.rps and base.rps else []
    return [o / b for b, o in zip(base.runs_rps, on.runs_rps, strict=False) if b and o]


def median_ratio(base: Measurement | None, on: Measurement | None) -> float | None:
    """`on` against `base`: the median of their rounds' ratios, each taken between two runs seconds apart, so
    the machine's drift over the rounds does not enter it."""
    found = round_ratios(base, on)
    return statistics.median(found) if found else None


def median_run(runs: list[Measurement]) -> Measurement:
    """A target's row from its runs: the run of median req/s among those that succeeded (the lower of the two
    middle ones for an even count), with every run's req/s; the first run when none succeeded."""
    ok = sorted((m for m in runs if m.ok and m.rps), key=lambda m: m.rps or 0.0)
    chosen = ok[(len(ok) - 1) // 2] if ok else runs[0]
    every = [m.rps if m.ok and m.rps else None for m in runs]
    note = chosen.note
    if ok and len(ok) < len(runs):
        failed = f"{len(runs) - len(ok)} of its {len(runs)} runs failed ({_first_failure(runs)})"
        note = f"{note}; {failed}" if note else failed
    return msgspec.structs.replace(chosen, runs_rps=every, note=note)


def _first_failure(runs: list[Measurement]) -> str:
    return next((m.note or "no answer" for m in runs if not (m.ok and m.rps)), "")


def request_body(scenario: Scenario) -> bytes:
    if scenario.path == CHAT_PATH:
        return CHAT_STREAM_BODY if scenario.stream else CHAT_BODY
    return STREAM_BODY if scenario.stream else BODY
