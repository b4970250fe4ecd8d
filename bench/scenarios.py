"""Scenario definitions and the runner that puts the same load on every target in turn.

Targets of one scenario share one upstream process and run back to back, so "direct",
"passthrough" and "gateway" differ only in what sits between the load generator and the upstream.

CPU placement: on a machine with at least two cores the server being measured gets core 0 to
itself while the load generator and the upstream share core 1. Without that, the scheduler
would move three busy processes across two cores and the gateway's figures would swing with
whatever wrk happened to be doing. The direct target is the upstream itself, so it is moved to
core 0 for its own measurement and back afterwards.
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

UpstreamKind = Literal["nginx", "fast", "slow"]
Tool = Literal["wrk", "fixed-rate", "ttfb"]
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


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    upstream: UpstreamKind
    tool: Tool
    stream: bool = False
    connections: int = 1
    targets: tuple[str, ...] = TARGETS


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


def build_scenarios(settings: Settings) -> list[Scenario]:
    c = settings.connections
    scenarios = [
        Scenario("nonstream_c32", f"non-streaming, {c} connections", "nginx", "wrk", connections=c),
        Scenario("nonstream_c1", "non-streaming, 1 connection", "nginx", "wrk", connections=1),
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
            "stream_ttfb", f"streaming {settings.chunks} chunks, TTFB at 1 connection", "fast", "ttfb", True
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
                targets=("direct", LIMITS_TARGET),
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
            for scenario in group:
                for target in scenario.targets:
                    if target not in self.settings.targets and target != LIMITS_TARGET:
                        continue
                    running = services.get(target)
                    if running is None:
                        error = self.startup_errors.get(f"{target}@{kind}", "not started")
                        self._record(self._failed(scenario, target, f"did not start: {first_line(error)}"))
                        continue
                    self._record(self._measure(scenario, target, running))

    def _fail_all(self, group: list[Scenario], note: str) -> None:
        print(f"[bench] {note}", file=sys.stderr)
        for scenario in group:
            for target in scenario.targets:
                self._record(self._failed(scenario, target, note))

    def _failed(self, scenario: Scenario, target: str, note: str) -> Measurement:
        return Measurement(scenario.name, target, scenario.upstream, scenario.tool, ok=False, note=note)

    def _record(self, measurement: Measurement) -> None:
        self.measurements.append(measurement)
        print(f"[bench] {describe(measurement)}", file=sys.stderr, flush=True)

    # -- measuring -----------------------------------------------------------------------------

    @contextmanager
    def _on_target_core(self, target: str, service: Service) -> Iterator[None]:
        if not self.settings.pin or target != "direct":
            yield
            return
        service.pin(TARGET_CPU)
        try:
            yield
        finally:
            service.pin(LOADGEN_CPU)

    def _measure(self, scenario: Scenario, target: str, service: Service) -> Measurement:
        url = service.base_url + "/v1/completions"
        body = STREAM_BODY if scenario.stream else BODY
        problem = clients.preflight(url, body, scenario.stream)
        if problem is not None:
            return self._failed(scenario, target, f"preflight failed: {problem}")
        print(f"[bench] {scenario.name} -> {target} ...", file=sys.stderr, flush=True)
        try:
            with self._on_target_core(target, service):
                if scenario.tool == "wrk":
                    return self._measure_wrk(scenario, target, service, url, body)
                if scenario.tool == "ttfb":
                    return self._measure_ttfb(scenario, target, service, url, body)
                return self._measure_fixed_rate(scenario, target, service, url, body)
        except (RuntimeError, OSError) as exc:
            return self._failed(scenario, target, f"{type(exc).__name__}: {first_line(str(exc))}")

    def _measure_wrk(
        self, scenario: Scenario, target: str, service: Service, url: str, body: bytes
    ) -> Measurement:
        s = self.settings
        script = wrk.write_script(body, s.work_dir, f"{scenario.name}-{target}".replace("+", "-"))
        if s.warmup_s > 0:
            wrk.run(url, script, scenario.connections, s.warmup_s)
        cpu_before, clock = service.cpu_seconds(), processes.CoreClock()
        summary = wrk.run(url, script, scenario.connections, s.duration_s)
        cpu = service.cpu_seconds() - cpu_before
        result = Measurement(
            scenario.name,
            target,
            scenario.upstream,
            scenario.tool,
            ok=summary.errors == 0 and summary.requests > 0,
            requests=summary.requests,
            errors=summary.errors,
            duration_s=round(summary.duration_us / 1e6, 3),
            rps=round(summary.rps, 1),
            mean_ms=round(summary.mean_us / 1000.0, 3),
            p50_ms=summary.p50_us / 1000.0,
            p90_ms=summary.p90_us / 1000.0,
            p99_ms=summary.p99_us / 1000.0,
            max_ms=summary.max_us / 1000.0,
            cpu_s_per_1k=round(cpu / summary.requests * 1000.0, 4) if summary.requests else None,
            peak_rss_mib=round(service.peak_rss_mib(), 1),
            core_busy_pct=clock.busy_percent(),
        )
        if summary.errors:
            result.note = (
                f"{summary.errors} errors (status {summary.status}, connect {summary.connect}, "
                f"read {summary.read}, write {summary.write}, timeout {summary.timeout})"
            )
        return result

    def _measure_ttfb(
        self, scenario: Scenario, target: str, service: Service, url: str, body: bytes
    ) -> Measurement:
        s = self.settings
        cpu_before = service.cpu_seconds()
        res = clients.stream_ttfb(url, body, s.ttfb_streams, s.ttfb_warmup)
        cpu = service.cpu_seconds() - cpu_before
        total = res.streams + s.ttfb_warmup
        return Measurement(
            scenario.name,
            target,
            scenario.upstream,
            scenario.tool,
            ok=res.errors == 0 and res.streams > 0,
            note=res.first_error,
            requests=res.streams,
            errors=res.errors,
            ttfb_p50_ms=round(res.ttfb_p50_ms, 3),
            ttfb_p90_ms=round(res.ttfb_p90_ms, 3),
            ttfb_p99_ms=round(res.ttfb_p99_ms, 3),
            total_p50_ms=round(res.total_p50_ms, 3),
            total_p90_ms=round(res.total_p90_ms, 3),
            events_per_stream=res.events_per_stream,
            cpu_s_per_1k=round(cpu / total * 1000.0, 4) if total else None,
            peak_rss_mib=round(service.peak_rss_mib(), 1),
        )

    def _measure_fixed_rate(
        self, scenario: Scenario, target: str, service: Service, url: str, body: bytes
    ) -> Measurement:
        s = self.settings
        cpu_before, clock = service.cpu_seconds(), processes.CoreClock()
        started = time.perf_counter()
        res = clients.fixed_rate(url, body, s.rate, s.rate_count, s.rate_warmup)
        elapsed = time.perf_counter() - started
        cpu = service.cpu_seconds() - cpu_before
        sent = s.rate_count + s.rate_warmup
        return Measurement(
            scenario.name,
            target,
            scenario.upstream,
            scenario.tool,
            ok=res.errors == 0 and res.ok > 0,
            note=res.first_error,
            requests=res.ok,
            errors=res.errors,
            duration_s=round(elapsed, 3),
            rps=res.achieved_rps,
            p50_ms=round(res.p50_ms, 3),
            p90_ms=round(res.p90_ms, 3),
            p99_ms=round(res.p99_ms, 3),
            max_ms=round(res.max_ms, 3),
            cpu_s_per_1k=round(cpu / sent * 1000.0, 4),
            peak_rss_mib=round(service.peak_rss_mib(), 1),
            core_busy_pct=clock.busy_percent(),
        )


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
