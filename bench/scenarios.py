"""Scenario definitions and the runner that puts the same load on every target in turn.

Targets of one scenario share one upstream process and run back to back, so "direct", "passthrough" and
"gateway" differ only in what sits between the load generator and the upstream. CPU placement, the
gateway variants (``gateway-2w``, ``gateway-granian``, ``gateway-httpx``, ``gateway+limits``) and the
memory rows: docs/bench-harness.md.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import msgspec
import yaml

from bench import clients, everything, features, processes, soak_everything, stores, wrk
from bench.everything import EVERYTHING, EVERYTHING_2W, EVERYTHING_PG, EVERYTHING_TARGETS, PASSTHROUGH_2W
from bench.processes import Service, StartupError
from bench.upstream import nginx

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
HTTPX = "gateway-httpx"
LIMITS_TARGET = "gateway+limits"
# The gateway with `cache: {mode: always}` (docs/cache.md): after the first request, every answer is a hit.
CACHE_TARGET = "gateway+cache"
# What --targets may name; LIMITS_TARGET comes with --limits-config instead.
ALL_TARGETS = (*TARGETS, TWO_WORKERS, GRANIAN, HTTPX)
# What runs when --targets is not given: the httpx row is asked for by name.
DEFAULT_TARGETS = (*TARGETS, TWO_WORKERS, GRANIAN)


@dataclass(frozen=True)
class GatewayVariant:
    """How one gateway target is started; ``workers`` None means the --workers setting."""

    workers: int | None = None
    server: str = "uvicorn"
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


def build_scenarios(settings: Settings) -> list[Scenario]:
    c = settings.connections
    scenarios = [
        Scenario(
            "nonstream_c32",
            f"non-streaming, {c} connections",
            "nginx",
            "wrk",
            connections=c,
            targets=(*TARGETS, TWO_WORKERS, GRANIAN, HTTPX),
        ),
        Scenario(
            "nonstream_c1",
            "non-streaming, 1 connection",
            "nginx",
            "wrk",
            connections=1,
            placement="shared",
            targets=(*TARGETS, GRANIAN, HTTPX),
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
            targets=(*TARGETS, GRANIAN, HTTPX),
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
    # measured right before it (each request of the plain one goes to the upstream).
    scenarios.append(
        Scenario(
            "cached_c32",
            f"non-streaming, every answer a cache hit, {c} connections",
            "nginx",
            "wrk",
            connections=c,
            targets=("gateway", CACHE_TARGET),
        )
    )
    scenarios += everything_scenarios(c)
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


def everything_scenarios(c: int) -> list[Scenario]:
    """The rows of bench/everything.py's configuration, each beside the passthrough in the same scenario."""
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


def request_body(scenario: Scenario) -> bytes:
    if scenario.path == CHAT_PATH:
        return CHAT_STREAM_BODY if scenario.stream else CHAT_BODY
    return STREAM_BODY if scenario.stream else BODY


def child_env() -> dict[str, str]:
    # Every hop is loopback; a proxy inherited from the shell would silently add a hop.
    return {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}


def merge(base: dict[str, object], extra: dict[str, object]) -> dict[str, object]:
    merged = dict(base)
    for key, value in extra.items():
        current = merged.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            merged[key] = merge(current, value)
        else:
            merged[key] = value
    return merged


def gateway_config(
    upstream_port: int,
    gateway_port: int,
    extra: Path | None,
    max_connections: int | None = None,
    transport: str | None = None,
) -> dict[str, object]:
    provider: dict[str, object] = {
        "kind": "openai",
        "base_url": f"http://127.0.0.1:{upstream_port}/v1",
        "api_key": "bench-key",
    }
    if max_connections is not None:
        provider["max_connections"] = max_connections
    if transport is not None:
        provider["transport"] = transport
    config: dict[str, object] = {
        "server": {"host": "127.0.0.1", "port": gateway_port},
        "providers": {"up": provider},
    }
    if extra is not None:
        fragment = yaml.safe_load(extra.read_text()) or {}
        if not isinstance(fragment, dict):
            raise ValueError(f"{extra} must hold a YAML mapping")
        config = merge(config, fragment)
    return config


@dataclass
class Runner:
    settings: Settings
    measurements: list[Measurement] = field(default_factory=list)
    startup_errors: dict[str, str] = field(default_factory=dict)
    # target -> why it was not run at all (not a failure: e.g. an optional server not installed).
    skipped: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._idle_budget = self.settings.wait_idle_s
        # The everything-on rows' Redis and PostgreSQL, started by run() when those rows are wanted.
        self._stores: dict[str, stores.Store] = {}

    def run(self) -> list[Measurement]:
        if self.settings.pin:
            # Children inherit this, so wrk, the clients and the upstreams all start on the loadgen core.
            os.sched_setaffinity(0, {LOADGEN_CPU})
        if GRANIAN in self.settings.targets and importlib.util.find_spec("granian") is None:
            self.skipped[GRANIAN] = (
                "granian is not installed in this Python environment (`pip install -e '.[granian]'`)"
            )
        scenarios = build_scenarios(self.settings)
        try:
            self._start_stores(scenarios)
            for kind in ("nginx", "fast", "slow", "hold"):
                group = [s for s in scenarios if s.upstream == kind]
                if group:
                    self._run_group(kind, group)
        finally:
            for store in self._stores.values():
                store.stop()
        return self.measurements

    def _start_stores(self, scenarios: list[Scenario]) -> None:
        """Start Redis (and PostgreSQL) for the all_* and feature_* rows; a target whose store fails is skipped."""
        wanted = {t for s in scenarios for t in s.targets}
        if not wanted & set(REDIS_TARGETS):
            return
        try:
            self._stores["redis"] = stores.start_redis()
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            for target in REDIS_TARGETS:
                self.skipped[target] = f"no Redis: {exc}"
            return
        if EVERYTHING_PG in wanted:
            try:
                self._stores["postgresql"] = stores.start_postgres()
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                self.skipped[EVERYTHING_PG] = f"no PostgreSQL: {first_line(str(exc))}"

    def _included(self, target: str) -> bool:
        return target in IMPLIED_TARGETS or target in self.settings.targets

    def _pinned(self, target: str) -> bool:
        variant = VARIANTS.get(target)
        return self.settings.pin and target != PASSTHROUGH_2W and (variant is None or variant.pinned)

    # -- process setup -------------------------------------------------------------------------

    def _start_upstream(self, kind: UpstreamKind) -> Service:
        service = self._spawn_upstream(kind)
        if self.settings.pin:
            service.pin(LOADGEN_CPU)
        return service

    def _spawn_upstream(self, kind: UpstreamKind) -> Service:
        port = processes.free_port()
        if kind == "nginx":
            prefix = self.settings.work_dir / "nginx"
            argv = nginx.prepare(port, prefix)
            return processes.start("upstream-nginx", argv, port, self.settings.log_dir, env=child_env())
        s = self.settings
        hold = kind == "hold"
        argv = [
            sys.executable,
            "-m",
            "bench.upstream.server",
            "--port",
            str(port),
            "--chunks",
            str(HOLD_CHUNKS if hold else s.chunks),
            "--chunk-interval-ms",
            str(s.hold_interval_ms if hold else s.chunk_interval_ms),
            "--latency-ms",
            str(s.latency_ms if kind == "slow" else 0.0),
        ]
        return processes.start(f"upstream-{kind}", argv, port, s.log_dir, env=child_env())

    @contextmanager
    def _spawn_affinity(self, pinned: bool) -> Iterator[None]:
        """Start an unpinned target with every core allowed: its workers inherit the affinity they
        are forked with, and re-pinning the tree afterwards could miss a worker still starting."""
        if pinned or not self.settings.pin:
            yield
            return
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        try:
            yield
        finally:
            os.sched_setaffinity(0, {LOADGEN_CPU})

    def _start_target(self, name: str, kind: UpstreamKind, upstream: Service, fresh_for: str | None = None) -> Service:
        s = self.settings
        port = processes.free_port()
        tag = f"{name}-{kind}".replace("+", "-") + (f"-{fresh_for}" if fresh_for else "")
        # A fresh server for the soak logs a million access lines: keep them in the temporary work dir.
        log_dir = s.work_dir if fresh_for else s.log_dir
        env = child_env()
        variant = VARIANTS.get(name)
        if variant is None:
            argv = [
                sys.executable,
                "-m",
                "bench.passthrough",
                "--port",
                str(port),
                "--upstream",
                upstream.base_url,
                "--workers",
                "2" if name == PASSTHROUGH_2W else "1",
            ]
        else:
            extra = s.limits_config if variant.limits else None
            # The provider's pool cap (default 256) would queue the held streams inside the gateway.
            pool = s.hold_streams + 64 if kind == "hold" else None
            config = gateway_config(upstream.port, port, extra, pool, variant.transport)
            if variant.cache:
                config["cache"] = {"mode": "always"}
            if variant.everything:
                ledger = self._stores[variant.ledger].url if variant.ledger != "sqlite" else None
                config = merge(
                    config,
                    everything.fragment(self._stores["redis"].url, ledger or everything.sqlite_url(s.work_dir, tag)),
                )
                if fresh_for == soak_everything.SCENARIO:
                    config = merge(config, soak_everything.FRAGMENT)
            if variant.feature is not None:
                redis = self._stores["redis"].url if "redis" in self._stores else None
                config = merge(config, features.fragment(variant.feature, redis, s.work_dir, tag))
            config_path = s.work_dir / f"{tag}.yaml"
            config_path.write_text(yaml.safe_dump(config, sort_keys=False))
            workers = variant.workers or s.workers
            argv = [
                sys.executable,
                "-m",
                "gateway",
                "serve",
                "--config",
                str(config_path),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                str(workers),
            ]
            if variant.server != "uvicorn":
                argv += ["--server", variant.server]
            if workers > 1:
                # Otherwise the gateway makes its own metrics directory in /tmp and leaves it there.
                metrics_dir = s.work_dir / f"metrics-{tag}"
                metrics_dir.mkdir(exist_ok=True)
                env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        pinned = self._pinned(name)
        with self._spawn_affinity(pinned):
            service = processes.start(tag, argv, port, log_dir, timeout=45.0, env=env)
        if pinned:
            service.pin(TARGET_CPU)
        return service

    def _run_group(self, kind: UpstreamKind, group: list[Scenario]) -> None:
        with ExitStack() as stack:
            try:
                upstream = self._start_upstream(kind)
            except (StartupError, OSError) as exc:
                self._fail_all(group, f"upstream {kind} did not start: {exc}")
                return
            stack.callback(upstream.stop)
            services: dict[str, Service] = {"direct": upstream}
            wanted = {t for s in group if not s.fresh for t in s.targets if self._included(t)}
            named = (*ALL_TARGETS[1:], *IMPLIED_TARGETS)
            for name in (n for n in named if n in wanted and n not in self.skipped):
                service = self._try_start(name, kind, upstream)
                if service is not None:
                    stack.callback(service.stop)
                    services[name] = service
            restarts: dict[str, int] = {}
            for scenario in group:
                for target in scenario.targets:
                    if not self._included(target):
                        continue
                    if target in self.skipped:
                        self._record(self._skip(scenario, target, self.skipped[target]))
                    elif scenario.fresh and target != "direct":
                        self._record(self._measure_fresh(scenario, target, kind, upstream))
                    elif target not in services:
                        error = self.startup_errors.get(f"{target}@{kind}", "not started")
                        self._record(self._failed(scenario, target, f"did not start: {summary_line(error)}"))
                    else:
                        self._record(self._measure_restarting(scenario, target, kind, services, restarts, stack))

    def _try_start(
        self, name: str, kind: UpstreamKind, upstream: Service, fresh_for: str | None = None
    ) -> Service | None:
        try:
            return self._start_target(name, kind, upstream, fresh_for)
        except (StartupError, OSError, ValueError) as exc:
            message = str(exc)
            self.startup_errors[f"{name}@{kind}" + (f" ({fresh_for})" if fresh_for else "")] = message
            print(
                f"[bench] {name} FAILED TO START ({kind} upstream): {summary_line(message)}",
                file=sys.stderr,
                flush=True,
            )
            return None

    def _measure_fresh(self, scenario: Scenario, target: str, kind: UpstreamKind, upstream: Service) -> Measurement:
        """Measure a server started for this scenario alone, so its counts start at zero."""
        service = self._try_start(target, kind, upstream, fresh_for=scenario.name)
        if service is None:
            error = self.startup_errors.get(f"{target}@{kind} ({scenario.name})", "not started")
            return self._failed(scenario, target, f"did not start: {summary_line(error)}")
        try:
            return self._measure(scenario, target, service)
        finally:
            service.stop()

    def _measure_restarting(
        self,
        scenario: Scenario,
        target: str,
        kind: UpstreamKind,
        services: dict[str, Service],
        restarts: dict[str, int],
        stack: ExitStack,
    ) -> Measurement:
        """Measure; if a proxy target died meanwhile, start a fresh one and measure again.

        On a shared machine a server can be killed from outside (a stray pkill). A restart keeps
        that from voiding the rest of the run, and the note keeps it from going unnoticed.
        """
        running = services[target]
        measured = self._measure(scenario, target, running)
        code = running.proc.poll()
        if code is None or target == "direct" or restarts.get(target, 0) >= MAX_RESTARTS:
            return measured
        restarts[target] = restarts.get(target, 0) + 1
        print(f"[bench] {target} exited with code {code}; restarting it", file=sys.stderr)
        try:
            running = self._start_target(target, kind, services["direct"])
        except (StartupError, OSError, ValueError) as exc:
            self.startup_errors[f"{target}@{kind} (restart)"] = str(exc)
            services.pop(target)
            return measured
        stack.callback(running.stop)
        services[target] = running
        measured = self._measure(scenario, target, running)
        if measured.ok:
            measured.note = f"repeated: the first {target} process exited with code {code}"
        return measured

    def _fail_all(self, group: list[Scenario], note: str) -> None:
        print(f"[bench] {note}", file=sys.stderr)
        for scenario in group:
            for target in scenario.targets:
                if self._included(target):
                    self._record(self._failed(scenario, target, note))

    def _failed(self, scenario: Scenario, target: str, note: str) -> Measurement:
        return Measurement(
            scenario.name, target, scenario.upstream, scenario.tool, ok=False, note=note, offered_rps=scenario.rate
        )

    def _skip(self, scenario: Scenario, target: str, note: str) -> Measurement:
        skipped = self._failed(scenario, target, f"not run: {note}")
        skipped.skipped = True
        return skipped

    def _placement(self, scenario: Scenario, target: str) -> str:
        if not self.settings.pin:
            return "unpinned"
        if not self._pinned(target):
            variant = VARIANTS.get(target)
            workers = variant.workers if variant is not None and variant.workers else self.settings.workers
            if target == PASSTHROUGH_2W:
                return "unpinned (2 processes on both cores, sharing them with the load)"
            return f"unpinned ({workers} workers on both cores, sharing them with the load)"
        return scenario.placement

    def _record(self, measurement: Measurement) -> None:
        self.measurements.append(measurement)
        print(f"[bench] {describe(measurement)}", file=sys.stderr, flush=True)

    # -- measuring -----------------------------------------------------------------------------

    @contextmanager
    def _placed(self, scenario: Scenario, target: str, service: Service) -> Iterator[None]:
        """Put the measured server on its core for this scenario, and back where it was afterwards."""
        if not self._pinned(target):
            yield
            return
        before = service.cpu
        service.pin(TARGET_CPU if scenario.placement == "split" else LOADGEN_CPU)
        try:
            yield
        finally:
            service.pin(before)

    def _await_quiet(self) -> None:
        """Spend up to the --wait-idle budget waiting until processes outside the bench go quiet."""
        if self._idle_budget <= 0:
            return
        started = time.monotonic()
        load = processes.foreign_load_pct(1.0)
        while load > NOISY_PCT and time.monotonic() - started < self._idle_budget:
            print(f"[bench] other processes use {load:.0f}% of a core; waiting", file=sys.stderr, flush=True)
            load = processes.foreign_load_pct(2.0)
        self._idle_budget -= time.monotonic() - started

    def _measure(self, scenario: Scenario, target: str, service: Service) -> Measurement:
        self._await_quiet()
        measured = self._measure_once(scenario, target, service)
        # Memory rows are not repeated: RSS does not depend on competing load, and a soak is minutes long.
        repeatable = scenario.tool not in ("soak", "hold")
        if repeatable and (measured.other_load_pct or 0.0) > NOISY_PCT and service.proc.poll() is None:
            print(
                f"[bench] {scenario.name} -> {target}: processes outside the bench used "
                f"{measured.other_load_pct:.0f}% of a core; measuring again",
                file=sys.stderr,
            )
            self._await_quiet()
            again = self._measure_once(scenario, target, service)
            if again.ok and (again.other_load_pct or 0.0) < (measured.other_load_pct or 0.0):
                measured = again
        return measured

    def _measure_once(self, scenario: Scenario, target: str, service: Service) -> Measurement:
        url = service.base_url + scenario.path
        body = request_body(scenario)
        problem = clients.preflight(url, body, scenario.stream)
        if service.proc.poll() is not None:
            # A dead server explains any preflight error better than the error itself does.
            tail = service.log_tail(8).replace("\n", " / ")
            return self._failed(scenario, target, f"exited with code {service.proc.returncode}: {tail}")
        if problem is not None:
            return self._failed(scenario, target, f"preflight failed: {problem}")
        rate = f" at {scenario.rate:g} req/s" if scenario.rate else ""
        print(f"[bench] {scenario.name}{rate} -> {target} ...", file=sys.stderr, flush=True)
        try:
            with self._placed(scenario, target, service):
                if scenario.tool == "wrk":
                    measured = self._measure_wrk(scenario, target, service, url, body)
                elif scenario.tool == "ttfb":
                    measured = self._measure_ttfb(scenario, target, service, url, body)
                elif scenario.tool == "soak":
                    measured = self._measure_soak(scenario, target, service, url, body)
                elif scenario.tool == "hold":
                    measured = self._measure_hold(scenario, target, service, url, body)
                else:
                    measured = self._measure_fixed_rate(scenario, target, service, url, body)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            measured = self._failed(scenario, target, f"{type(exc).__name__}: {first_line(str(exc))}")
        code = service.proc.poll()
        if code is not None:
            # Errors that follow a server's death are noise; its exit code is the finding.
            measured.ok = False
            measured.note = f"server exited during the run with code {code}" + (
                f" (signal {-code})" if code < 0 else ""
            )
        return measured

    @staticmethod
    def _other_load(window: processes.Window) -> float | None:
        return window.other_load_pct()

    def _measure_wrk(self, scenario: Scenario, target: str, service: Service, url: str, body: bytes) -> Measurement:
        s = self.settings
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
            placement=self._placement(scenario, target),
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
            other_load_pct=self._other_load(window),
        )
        if summary.errors:
            result.note = wrk_errors(summary)
        return result

    def _c32_rps(self, target: str) -> float | None:
        """This run's saturated throughput of ``target``, if measured: it sizes the soak's time bound."""
        for m in self.measurements:
            if m.scenario == "nonstream_c32" and m.target == target and m.ok and m.rps:
                return m.rps
        return None

    def _measure_soak(self, scenario: Scenario, target: str, service: Service, url: str, body: bytes) -> Measurement:
        if scenario.name == soak_everything.SCENARIO:
            placement = self._placement(scenario, target)
            return soak_everything.measure(self, scenario, target, service, url, body, placement)
        s = self.settings
        expected_rps = self._c32_rps(target) or 1000.0

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
            placement=self._placement(scenario, target),
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
            other_load_pct=self._other_load(window),
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

    def _measure_hold(self, scenario: Scenario, target: str, service: Service, url: str, body: bytes) -> Measurement:
        s = self.settings
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
            placement=self._placement(scenario, target),
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
            other_load_pct=self._other_load(window),
            rss_idle_mib=round(idle, 1),
            rss_hold_mib=res.rss_peak_mib,
            concurrent_streams=res.max_open,
        )

    def _measure_ttfb(self, scenario: Scenario, target: str, service: Service, url: str, body: bytes) -> Measurement:
        s = self.settings
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
            placement=self._placement(scenario, target),
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
            other_load_pct=self._other_load(window),
        )

    def _measure_fixed_rate(
        self, scenario: Scenario, target: str, service: Service, url: str, body: bytes
    ) -> Measurement:
        s = self.settings
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
            placement=self._placement(scenario, target),
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
            other_load_pct=self._other_load(window),
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


def first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else text


def summary_line(text: str) -> str:
    """First line of a start-up failure plus the line that says why (argparse's ``error:``, a
    traceback's last line), so a one-line note names the cause and not only the exit code."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return text
    cause = next((line for line in reversed(lines[1:]) if "error" in line.lower()), lines[-1] if len(lines) > 1 else "")
    return f"{lines[0]} {cause}".strip()


def describe(m: Measurement) -> str:
    head = f"{m.scenario:<16} {m.target:<15}"
    if m.offered_rps is not None:
        head += f" @{m.offered_rps:>6,.0f}/s"
    if m.skipped:
        return f"{head} {m.note}"
    if not m.ok and m.requests is None:
        return f"{head} FAILED: {m.note}"
    parts = []
    if m.rps is not None:
        parts.append(f"{m.rps:,.0f} req/s")
    if m.p50_ms is not None:
        parts.append(f"p50 {m.p50_ms:.3f} ms p99 {m.p99_ms:.3f} ms")
    if m.ttfb_p50_ms is not None:
        parts.append(f"ttfb p50 {m.ttfb_p50_ms:.3f} ms total p50 {m.total_p50_ms:.3f} ms")
    if m.cpu_s_per_1k is not None:
        parts.append(f"cpu {m.cpu_s_per_1k:.3f} s/1k")
    if m.rss_growth_pct is not None:
        parts.append(
            f"RSS {m.rss_checkpoint_mib:.1f} MiB at {m.checkpoint_requests:,} -> {m.rss_end_mib:.1f} MiB "
            f"at {m.requests:,} ({m.rss_growth_pct:+.1f} %)"
        )
    if m.rss_hold_mib is not None:
        parts.append(
            f"RSS {m.rss_idle_mib:.1f} MiB idle, {m.rss_hold_mib:.1f} MiB peak holding "
            f"{m.concurrent_streams:,} streams, {m.events_per_stream} events each"
        )
    if m.errors:
        parts.append(f"ERRORS {m.errors}: {m.note}")
    elif m.note:
        parts.append(m.note)
    return f"{head} " + ", ".join(parts)
