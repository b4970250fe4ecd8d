"""The runner that puts the same load on every target in turn, one upstream group at a time.

It starts the upstream of a group of scenarios and every target they name (Redis and PostgreSQL first when a
target needs them), pins the measured server to its core, measures each target in turn (bench/measuring.py),
repeats a measurement that other processes disturbed, and restarts a server that died. Placement and the
targets: docs/bench-harness.md.
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

import yaml

from bench import clients, everything, features, measuring, processes, soak_everything, stores
from bench.configs import child_env, gateway_config, merge
from bench.everything import EVERYTHING_PG, PASSTHROUGH_2W
from bench.processes import Service, StartupError
from bench.scenarios import (
    ALL_TARGETS,
    GRANIAN,
    HOLD_CHUNKS,
    IMPLIED_TARGETS,
    LOADGEN_CPU,
    MAX_RESTARTS,
    NOISY_PCT,
    REDIS_TARGETS,
    TARGET_CPU,
    VARIANTS,
    GatewayVariant,
    Measurement,
    Scenario,
    Settings,
    UpstreamKind,
    build_scenarios,
    median_run,
    request_body,
    round_order,
)
from bench.upstream import nginx


def serve_argv(variant: GatewayVariant, config_path: Path, port: int, workers: int) -> list[str]:
    """The command line that starts one gateway variant on loopback."""
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(config_path)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]
    if variant.server != "uvicorn":
        argv += ["--server", variant.server]
    if variant.http != "gateway":
        argv += ["--http", variant.http]
    return argv


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
            argv = serve_argv(variant, config_path, port, workers)
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
                runs: dict[str, list[Measurement]] = {}
                for target in round_order(scenario.targets, scenario.rounds):
                    if not self._included(target):
                        continue
                    if target in self.skipped:
                        measured = self._skip(scenario, target, self.skipped[target])
                    elif scenario.fresh and target != "direct":
                        measured = self._measure_fresh(scenario, target, kind, upstream)
                    elif target not in services:
                        error = self.startup_errors.get(f"{target}@{kind}", "not started")
                        measured = self._failed(scenario, target, f"did not start: {summary_line(error)}")
                    else:
                        measured = self._measure_restarting(scenario, target, kind, services, restarts, stack)
                    if scenario.rounds == 1:
                        self._record(measured)
                    else:
                        print(f"[bench]   run {len(runs.get(target, [])) + 1}: {describe(measured)}", file=sys.stderr)
                        runs.setdefault(target, []).append(measured)
                for target in (t for t in scenario.targets if t in runs):
                    self._record(median_run(runs[target]))

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

    def placement(self, scenario: Scenario, target: str) -> str:
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
                    measured = measuring.measure_wrk(self, scenario, target, service, url, body)
                elif scenario.tool == "ttfb":
                    measured = measuring.measure_ttfb(self, scenario, target, service, url, body)
                elif scenario.tool == "soak":
                    measured = measuring.measure_soak(self, scenario, target, service, url, body)
                elif scenario.tool == "hold":
                    measured = measuring.measure_hold(self, scenario, target, service, url, body)
                else:
                    measured = measuring.measure_fixed_rate(self, scenario, target, service, url, body)
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
