"""Scenario definitions and the runner that puts the same load on every target in turn.

Targets of one scenario share one upstream process and run back to back, so "direct",
"passthrough" and "gateway" differ only in what sits between the load generator and the upstream.

CPU placement (machines with two or more cores): for throughput rows the server being measured
gets core 0 to itself while the load generator and the upstream share core 1; otherwise the
scheduler would shuffle three busy processes over two cores and the figures would swing with
whatever wrk happened to be doing. The direct target is the upstream itself, so it moves to core 0
for its own measurement and back afterwards. One-request-at-a-time latency rows instead put every
process on core 1: the work is strictly serial there, so one core loses nothing, and on a VM a
wake-up across cores costs from ~80 us to milliseconds, which would drown what a hop adds.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import msgspec
import yaml

from bench import clients, processes, wrk
from bench.processes import Service, StartupError
from bench.upstream import nginx

REQUEST: dict[str, object] = {"model": "up/bench-model", "prompt": "Say hello", "max_tokens": 16}
BODY = msgspec.json.encode(REQUEST)
STREAM_BODY = msgspec.json.encode({**REQUEST, "stream": True})

TARGET_CPU = 0
LOADGEN_CPU = 1
# Per target and upstream group; a server that keeps dying is a finding, not something to retry.
MAX_RESTARTS = 2
# Above this CPU use by processes outside the bench (% of one core), a measurement is repeated once.
NOISY_PCT = 20.0

UpstreamKind = Literal["nginx", "fast", "slow"]
Tool = Literal["wrk", "fixed-rate", "ttfb"]
Placement = Literal["split", "shared"]
TARGETS = ("direct", "passthrough", "gateway")
LIMITS_TARGET = "gateway+limits"


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


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    upstream: UpstreamKind
    tool: Tool
    stream: bool = False
    connections: int = 1
    targets: tuple[str, ...] = TARGETS
    # "split": the measured server alone on TARGET_CPU, everything else on LOADGEN_CPU (throughput).
    # "shared": every process on LOADGEN_CPU. For one-at-a-time latency: on a VM a wake-up across
    # cores can cost milliseconds and would drown the microseconds a hop adds.
    placement: Placement = "split"


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
    targets: tuple[str, ...] = TARGETS
    only: frozenset[str] | None = None
    limits_config: Path | None = None
    # Total seconds the run may spend waiting for other processes to quieten down before measuring.
    wait_idle_s: float = 0.0


def build_scenarios(settings: Settings) -> list[Scenario]:
    c = settings.connections
    scenarios = [
        Scenario("nonstream_c32", f"non-streaming, {c} connections", "nginx", "wrk", connections=c),
        Scenario("nonstream_c1", "non-streaming, 1 connection", "nginx", "wrk", connections=1, placement="shared"),
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
        ),
        Scenario(
            "stream_ttfb",
            f"streaming {settings.chunks} chunks, TTFB at 1 connection",
            "fast",
            "ttfb",
            stream=True,
            placement="shared",
        ),
        Scenario(
            "slow_fixed_rate",
            f"{settings.latency_ms:g} ms upstream at {settings.rate:g} req/s",
            "slow",
            "fixed-rate",
        ),
    ]
    if settings.limits_config is not None:
        # Hook for the rate-limit work: same load as nonstream_c32 against a gateway whose config
        # has the fragment from --limits-config merged in (e.g. Redis-backed limits).
        scenarios.append(
            Scenario(
                "limits_c32",
                f"non-streaming with limits config, {c} connections",
                "nginx",
                "wrk",
                connections=c,
                targets=("gateway", LIMITS_TARGET),
            )
        )
    wanted = settings.only
    return [s for s in scenarios if wanted is None or s.name in wanted]


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


def gateway_config(upstream_port: int, gateway_port: int, extra: Path | None) -> dict[str, object]:
    config: dict[str, object] = {
        "server": {"host": "127.0.0.1", "port": gateway_port},
        "providers": {
            "up": {
                "kind": "openai",
                "base_url": f"http://127.0.0.1:{upstream_port}/v1",
                "api_key": "bench-key",
            }
        },
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

    def __post_init__(self) -> None:
        self._idle_budget = self.settings.wait_idle_s

    def run(self) -> list[Measurement]:
        if self.settings.pin:
            # Children inherit this, so wrk, the clients and the upstreams all start on the loadgen core.
            os.sched_setaffinity(0, {LOADGEN_CPU})
        scenarios = build_scenarios(self.settings)
        for kind in ("nginx", "fast", "slow"):
            group = [s for s in scenarios if s.upstream == kind]
            if group:
                self._run_group(kind, group)
        return self.measurements

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
        argv = [
            sys.executable,
            "-m",
            "bench.upstream.server",
            "--port",
            str(port),
            "--chunks",
            str(self.settings.chunks),
            "--chunk-interval-ms",
            str(self.settings.chunk_interval_ms),
            "--latency-ms",
            str(self.settings.latency_ms if kind == "slow" else 0.0),
        ]
        return processes.start(f"upstream-{kind}", argv, port, self.settings.log_dir, env=child_env())

    def _start_target(self, name: str, kind: UpstreamKind, upstream: Service) -> Service:
        port = processes.free_port()
        tag = f"{name}-{kind}".replace("+", "-")
        if name == "passthrough":
            argv = [
                sys.executable,
                "-m",
                "bench.passthrough",
                "--port",
                str(port),
                "--upstream",
                upstream.base_url,
            ]
        else:
            extra = self.settings.limits_config if name == LIMITS_TARGET else None
            config = gateway_config(upstream.port, port, extra)
            config_path = self.settings.work_dir / f"{tag}.yaml"
            config_path.write_text(yaml.safe_dump(config, sort_keys=False))
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
                str(self.settings.workers),
            ]
        service = processes.start(tag, argv, port, self.settings.log_dir, timeout=45.0, env=child_env())
        if self.settings.pin:
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
            wanted = {t for s in group for t in s.targets if t in self.settings.targets or t == LIMITS_TARGET}
            for name in (n for n in (*TARGETS[1:], LIMITS_TARGET) if n in wanted):
                try:
                    service = self._start_target(name, kind, upstream)
                except (StartupError, OSError, ValueError) as exc:
                    message = str(exc)
                    self.startup_errors[f"{name}@{kind}"] = message
                    print(f"[bench] {name} FAILED TO START ({kind} upstream): {message}", file=sys.stderr)
                    continue
                stack.callback(service.stop)
                services[name] = service
            restarts: dict[str, int] = {}
            for scenario in group:
                for target in scenario.targets:
                    if target not in self.settings.targets and target != LIMITS_TARGET:
                        continue
                    if target not in services:
                        error = self.startup_errors.get(f"{target}@{kind}", "not started")
                        self._record(self._failed(scenario, target, f"did not start: {first_line(error)}"))
                        continue
                    self._record(self._measure_restarting(scenario, target, kind, services, restarts, stack))

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
                self._record(self._failed(scenario, target, note))

    def _failed(self, scenario: Scenario, target: str, note: str) -> Measurement:
        return Measurement(scenario.name, target, scenario.upstream, scenario.tool, ok=False, note=note)

    def _placement(self, scenario: Scenario) -> str:
        return scenario.placement if self.settings.pin else "unpinned"

    def _record(self, measurement: Measurement) -> None:
        self.measurements.append(measurement)
        print(f"[bench] {describe(measurement)}", file=sys.stderr, flush=True)

    # -- measuring -----------------------------------------------------------------------------

    @contextmanager
    def _placed(self, scenario: Scenario, service: Service) -> Iterator[None]:
        """Put the measured server on its core for this scenario, and back where it was afterwards."""
        if not self.settings.pin:
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
        if (measured.other_load_pct or 0.0) > NOISY_PCT and service.proc.poll() is None:
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
        url = service.base_url + "/v1/completions"
        body = STREAM_BODY if scenario.stream else BODY
        problem = clients.preflight(url, body, scenario.stream)
        if service.proc.poll() is not None:
            # A dead server explains any preflight error better than the error itself does.
            tail = service.log_tail(8).replace("\n", " / ")
            return self._failed(scenario, target, f"exited with code {service.proc.returncode}: {tail}")
        if problem is not None:
            return self._failed(scenario, target, f"preflight failed: {problem}")
        print(f"[bench] {scenario.name} -> {target} ...", file=sys.stderr, flush=True)
        try:
            with self._placed(scenario, service):
                if scenario.tool == "wrk":
                    measured = self._measure_wrk(scenario, target, service, url, body)
                elif scenario.tool == "ttfb":
                    measured = self._measure_ttfb(scenario, target, service, url, body)
                else:
                    measured = self._measure_fixed_rate(scenario, target, service, url, body)
        except (RuntimeError, OSError) as exc:
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
        script = wrk.write_script(body, s.work_dir, f"{scenario.name}-{target}".replace("+", "-"))
        if s.warmup_s > 0:
            wrk.run(url, script, scenario.connections, s.warmup_s)
        window = processes.Window(service)
        summary = wrk.run(url, script, scenario.connections, s.duration_s)
        window.close()
        result = Measurement(
            scenario.name,
            target,
            scenario.upstream,
            scenario.tool,
            ok=summary.errors == 0 and summary.requests > 0,
            placement=self._placement(scenario),
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
            result.note = (
                f"{summary.errors} errors (status {summary.status}, connect {summary.connect}, "
                f"read {summary.read}, write {summary.write}, timeout {summary.timeout})"
            )
        return result

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
            placement=self._placement(scenario),
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
        window = processes.Window(service)
        res = clients.fixed_rate(url, body, s.rate, s.rate_count, s.rate_warmup)
        window.close()
        sent = s.rate_count + s.rate_warmup
        return Measurement(
            scenario.name,
            target,
            scenario.upstream,
            scenario.tool,
            ok=res.errors == 0 and res.ok > 0,
            placement=self._placement(scenario),
            note=res.first_error,
            requests=res.ok,
            errors=res.errors,
            duration_s=round(window.wall_s, 3),
            rps=res.achieved_rps,
            p50_ms=round(res.p50_ms, 3),
            p90_ms=round(res.p90_ms, 3),
            p99_ms=round(res.p99_ms, 3),
            max_ms=round(res.max_ms, 3),
            cpu_s_per_1k=cpu_per_1k(window.cpu_s, sent),
            peak_rss_mib=round(service.peak_rss_mib(), 1),
            core_busy_pct=window.busy,
            other_load_pct=self._other_load(window),
        )


def cpu_per_1k(cpu_s: float, requests: int) -> float | None:
    # /proc/<pid>/stat counts in 10 ms ticks: below ~10 ticks the quotient is mostly rounding.
    if requests <= 0 or cpu_s < 0.1:
        return None
    return round(cpu_s / requests * 1000.0, 4)


def first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else text


def describe(m: Measurement) -> str:
    head = f"{m.scenario:<16} {m.target:<15}"
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
    if m.errors:
        parts.append(f"ERRORS {m.errors}: {m.note}")
    return f"{head} " + ", ".join(parts)
