"""``python -m bench``: run every scenario against direct, passthrough and gateway, then report.

Default mode takes about 30 minutes on the 2-core reference machine, sixteen of them the two
memory soaks (1,000,000 requests each: the plain gateway at ~3,000 req/s, everything on at ~1,600); it rewrites
docs/benchmarks.md, docs/benchmarks.png and bench/results/latest.json, and appends its everything-on figures
to bench/history/everything.jsonl. ``--quick`` is a smoke run
of about three minutes that writes only under bench/results/, so it never dirties the published
figures.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from bench import everything, features, history, report, report_run, report_sweep, wrk
from bench.processes import foreign_load_pct
from bench.runner import Runner
from bench.scenarios import ALL_TARGETS, DEFAULT_TARGETS, NOISY_PCT, Settings
from bench.upstream import nginx

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short smoke run; writes bench/results only")
    parser.add_argument("--duration", type=float, help="seconds per wrk measurement (default 10, quick 2)")
    parser.add_argument("--warmup", type=float, help="unmeasured wrk seconds before each (default 2, quick 1)")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections for the c=N rows")
    parser.add_argument("--chunks", type=int, default=100, help="SSE events per streamed completion")
    parser.add_argument("--chunk-interval-ms", type=float, default=0.0, help="gap between SSE events upstream")
    parser.add_argument("--latency-ms", type=float, default=50.0, help="upstream delay in the slow scenario")
    parser.add_argument("--rate", type=float, default=500.0, help="req/s in the slow-upstream scenario")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="gateway --workers for the gateway rows (pinning is off when > 1); gateway-2w always has 2",
    )
    parser.add_argument(
        "--soak-requests",
        type=int,
        help="requests in each memory soak (soak, all_soak); RSS is read after a tenth and at the end, all_soak's "
        "after every tenth (default 1000000, quick 20000)",
    )
    parser.add_argument(
        "--soak-passthrough",
        action=argparse.BooleanOptionalAction,
        help="soak the passthrough too, for comparison (default: only in --quick; adds ~3.5 min to a full run)",
    )
    parser.add_argument(
        "--hold-streams", type=int, help="concurrent slow streams in hold_streams (default 1000, quick 100)"
    )
    parser.add_argument(
        "--hold-interval-ms",
        type=float,
        default=50.0,
        help="gap between the held streams' 100 events upstream (default 50: each stream lasts ~5 s)",
    )
    parser.add_argument(
        "--sweep-rates",
        help="offered req/s of the latency-vs-load sweep, comma-separated "
        "(default 500,1000,1500,2000,2500,3000,4000; quick 1000,2000,3000)",
    )
    parser.add_argument("--sweep-seconds", type=float, help="measured seconds per sweep point (default 4, quick 1)")
    parser.add_argument(
        "--feature-rounds",
        type=int,
        help="rounds of nothing on and the feature on in each feature_* row (and of the plain gateway and cache "
        "hits in cached_c32), each round in the order opposite the last; a row's ratio is the median of its "
        "rounds' (default 3, quick 1)",
    )
    parser.add_argument(
        "--everything-rounds",
        type=int,
        help="rounds of the everything-on rows the goals are read off (all_c32, all_c1, all_chat_c1), each in the "
        "order opposite the last; a row's ratio is the median of its rounds' (default 3, quick 1)",
    )
    parser.add_argument(
        "--limits-config",
        type=Path,
        help="YAML fragment merged into the gateway config; adds the limits_c32 scenario "
        "(the hook for Redis-backed rate limits)",
    )
    parser.add_argument(
        "--only",
        help="comma-separated scenario names to run (default: all): nonstream_c32, nonstream_c1, limits_c32, "
        "cached_c32, load_sweep, soak, pyupstream_c32, stream_c32, stream_ttfb, slow_fixed_rate, hold_streams, "
        f"{', '.join(everything.SCENARIOS)}, all_soak, {', '.join(features.SCENARIOS)}; `{everything.GROUP}` "
        "names the all_* rows but the soak (every feature on, about eight minutes), "
        f"`{features.GROUP}` the feature_* rows (each feature alone beside nothing on, in three rounds, "
        "about eight minutes)",
    )
    parser.add_argument(
        "--targets",
        default=",".join(DEFAULT_TARGETS),
        help=f"comma-separated subset of {','.join(ALL_TARGETS)} (default: all but gateway-httpx)",
    )
    parser.add_argument("--no-pin", action="store_true", help="do not pin processes to cores")
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        help="seconds the run may spend, in total, waiting for other processes to go quiet "
        "(checked before the run and before each measurement)",
    )
    parser.add_argument("--json", type=Path, help="results JSON path")
    parser.add_argument("--markdown", type=Path, help="markdown report path")
    parser.add_argument(
        "--plot",
        type=Path,
        help="PNG path (default: next to the markdown: docs/benchmarks.png, quick: bench/results/quick.png)",
    )
    parser.add_argument("--no-plot", action="store_true", help="skip the optional matplotlib PNG")
    args = parser.parse_args(argv)
    for name in ("feature_rounds", "everything_rounds"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def raise_fd_limit(streams: int) -> str | None:
    """Raise the soft open-files limit for the held streams (children inherit it); None when enough.

    A proxy holding N streams needs 2N sockets, the client and the upstream N each; all of them
    are children of this process or this process itself.
    """
    needed = 2 * streams + 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            return f"{streams} held streams need {needed} open files, but the hard limit is {hard} (ulimit -Hn)"
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return None


def expand_only(only: str | None) -> frozenset[str] | None:
    if not only:
        return None
    names = {x.strip() for x in only.split(",") if x.strip()}
    for group, scenarios in ((everything.GROUP, everything.SCENARIOS), (features.GROUP, features.SCENARIOS)):
        if group in names:
            names = (names - {group}) | set(scenarios)
    return frozenset(names)


def check_tools() -> list[str]:
    return [name for name, found in (("nginx", nginx.find_nginx()), ("wrk", wrk.find_wrk())) if not found]


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    # SystemExit unwinds the runner's ExitStack, which stops every server the bench started.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    raw_argv = sys.argv[1:] if argv is None else argv
    args = parse_args(raw_argv)
    missing = check_tools()
    if missing:
        print(
            f"bench: {' and '.join(missing)} not found. Install them (as root) with:\n\n"
            f"    {nginx.APT_HINT}\n\nThe bench installs nothing by itself.",
            file=sys.stderr,
        )
        return 2
    targets = tuple(t.strip() for t in args.targets.split(",") if t.strip())
    unknown = [t for t in targets if t not in ALL_TARGETS]
    if unknown:
        print(f"bench: unknown target(s) {unknown}; choose from {ALL_TARGETS}", file=sys.stderr)
        return 2
    try:
        sweep_rates = tuple(float(r) for r in args.sweep_rates.split(",") if r.strip()) if args.sweep_rates else None
    except ValueError:
        print(f"bench: --sweep-rates takes numbers, got {args.sweep_rates!r}", file=sys.stderr)
        return 2

    quick = args.quick
    mode = "quick" if quick else "full"
    json_path = args.json or RESULTS / ("quick.json" if quick else "latest.json")
    md_path = args.markdown or (RESULTS / "quick.md" if quick else ROOT / "docs" / "benchmarks.md")
    log_dir = RESULTS / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    pin = not args.no_pin and (os.cpu_count() or 1) >= 2 and args.workers == 1
    hold_streams = args.hold_streams or (100 if quick else 1000)
    fd_problem = raise_fd_limit(hold_streams)
    if fd_problem:
        print(f"bench: {fd_problem}", file=sys.stderr)
        return 2
    soak_requests = args.soak_requests or (20_000 if quick else 1_000_000)
    if soak_requests < 10:
        print("bench: --soak-requests must be at least 10", file=sys.stderr)
        return 2

    t0_wait = time.monotonic()
    background = foreign_load_pct(1.0)
    while background > NOISY_PCT and time.monotonic() - t0_wait < args.wait_idle:
        print(f"[bench] other processes use {background:.0f}% of a core; waiting", file=sys.stderr)
        background = foreign_load_pct(2.0)
    if background > NOISY_PCT:
        print(
            f"[bench] warning: other processes already use {background:.0f}% of a core; figures will be noisy",
            file=sys.stderr,
        )
    # The tree measured: read before the run, which rewrites docs/benchmarks.md itself.
    commit, dirty = history.git_state(ROOT)
    started = datetime.now(UTC)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-") as work:
        settings = Settings(
            duration_s=args.duration or (2.0 if quick else 10.0),
            warmup_s=args.warmup if args.warmup is not None else (1.0 if quick else 2.0),
            connections=args.connections,
            chunks=args.chunks,
            chunk_interval_ms=args.chunk_interval_ms,
            latency_ms=args.latency_ms,
            rate=args.rate,
            rate_count=int(args.rate * (2 if quick else 10)),
            rate_warmup=int(args.rate * (0.5 if quick else 1)),
            ttfb_streams=40 if quick else 1000,
            ttfb_warmup=5 if quick else 20,
            workers=args.workers,
            pin=pin,
            work_dir=Path(work),
            log_dir=log_dir,
            soak_requests=soak_requests,
            soak_checkpoint=soak_requests // 10,
            soak_passthrough=quick if args.soak_passthrough is None else args.soak_passthrough,
            hold_streams=hold_streams,
            hold_interval_ms=args.hold_interval_ms,
            sweep_rates=sweep_rates or ((1000.0, 2000.0, 3000.0) if quick else Settings.sweep_rates),
            sweep_seconds=args.sweep_seconds or (1.0 if quick else Settings.sweep_seconds),
            sweep_warmup_s=0.25 if quick else Settings.sweep_warmup_s,
            targets=targets,
            only=expand_only(args.only),
            limits_config=args.limits_config,
            wait_idle_s=max(0.0, args.wait_idle - (time.monotonic() - t0_wait)),
            feature_rounds=args.feature_rounds or (1 if quick else 3),
            everything_rounds=args.everything_rounds or (1 if quick else 3),
        )
        runner = Runner(settings)
        measurements = runner.run()

    settings_dict = {
        k: (str(v) if isinstance(v, Path | frozenset) else round(v, 3) if isinstance(v, float) else v)
        for k, v in vars(settings).items()
        if k not in ("work_dir", "log_dir")
    }
    settings_dict["targets"] = ",".join(settings.targets)
    settings_dict["sweep_rates"] = ",".join(f"{r:g}" for r in settings.sweep_rates)
    result = report_run.RunResult(
        started_at=started.strftime("%Y-%m-%d %H:%M:%S UTC"),
        finished_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        elapsed_s=round(time.monotonic() - t0, 1),
        mode=mode,
        command=".venv/bin/python -m bench" + ("" if not raw_argv else " " + shlex.join(raw_argv)),
        machine={
            **report_run.describe_machine(),
            "busy before run": f"{background:.0f}% of one core (other processes)",
        },
        versions=report_run.tool_versions(),
        settings=settings_dict,
        startup_errors=runner.startup_errors,
        skipped=runner.skipped,
        measurements=measurements,
    )
    report_run.write_json(result, json_path)
    # A full run of every scenario that publishes docs/benchmarks.md is a line of the everything-on history, and its
    # report shows the history; a run written elsewhere appends nothing.
    published = md_path.resolve() == (ROOT / "docs" / "benchmarks.md").resolve()
    past = history.record(result, settings.only, commit, dirty) if published else []
    md_path.parent.mkdir(parents=True, exist_ok=True)
    # The plot first: the markdown links it only if this run wrote it, never a stale one.
    plot_path = args.plot or md_path.with_suffix(".png")
    plot_note = "plot skipped: --no-plot" if args.no_plot else report_sweep.write_plot(result, plot_path)
    written = plot_path if plot_note.startswith("plot written") else None
    md_path.write_text(
        report.render_markdown(result, plot=written, plot_note=plot_note, md_dir=md_path.parent, past=past)
    )
    print(f"[bench] wrote {json_path} and {md_path} ({result.elapsed_s:.0f} s)", file=sys.stderr)
    print(f"[bench] {plot_note}", file=sys.stderr)
    failed = [m for m in measurements if not m.ok and not m.skipped]
    if failed:
        print(f"[bench] {len(failed)} measurement(s) failed; see {md_path}", file=sys.stderr)
    # Only a broken bench fails the command; a failing gateway is a result worth publishing.
    return 0


if __name__ == "__main__":
    sys.exit(main())
