"""``python -m bench.cpusplit``: the gateway's user and system CPU per request under load, per feature.

Where the benchmark's ``feature_*`` rows give each feature's throughput beside nothing on, this asks the other
question too: what each part costs *inside* the everything-on configuration. It serves the same load (wrk,
c=32 or ``--connections``, a prompt of its own per request, the nginx upstream, a redis-server of its own) to
the gateway with:
nothing on (the access log off too), each part alone, everything on (bench/everything.py, SQLite ledger),
and everything on but one part. Each configuration is a fresh gateway, warmed, then loaded for ``--seconds``;
its user and system CPU (every thread: the ledger's writer is in it) are read from /proc before and after,
divided by the requests served. ``--rounds`` rounds, each in the order opposite the last; each figure is the
median of its rounds. A part costs more inside everything on than alone when "everything but it" saves more
than "it alone" adds. Each row also gives wrk's p50. At one connection every process (wrk, nginx, Redis, the
gateway) runs on one core, as the benchmark's c=1 rows do: there a request's latency is about the CPU
that all of them spend on it, and what a part adds to the p50 is what it costs one client. ``--workers 2``
serves with two worker processes on the two cores (as the benchmark's two-worker rows do), every process's
CPU counted: what each part costs when the workers, wrk, nginx and Redis share both cores. Each row also
gives Redis's own CPU per request (its `INFO cpu`: the cores it takes from the rest) and the
script calls it ran per request (`INFO commandstats`: a gateway merges the admissions of one loop tick
into one call, so fewer requests per tick mean more calls per request), and the gateway's context switches
per request (every thread's, from /proc): how often it slept with nothing to run (waiting on Redis or the
upstream) and how often another process took its core while it had work (with processes sharing cores).

    python -m bench.cpusplit --rounds 3 --seconds 8 --out /tmp/cpusplit.md
    python -m bench.cpusplit --connections 1 --rounds 3 --seconds 5
    python -m bench.cpusplit --workers 2 --rounds 3 --seconds 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import redis

from bench import everything, features, processes, stores, wrk
from bench.configs import gateway_config, merge, start_gateway
from bench.redis_channel import redis_cpu_s
from bench.scenarios import BODY, LOADGEN_CPU
from bench.tool_report import emit, invoked
from bench.upstream import nginx

# The parts of bench/everything.py's configuration that "everything but" leaves out, one at a time.
PARTS = ("limits", "cache", "ledger", "queue", "log")


def without(part: str, redis_url: str, ledger_url: str) -> dict[str, object]:
    """bench/everything.py's fragment with `part` left out (the log: turned off, as it is on by default)."""
    frag = everything.fragment(redis_url, ledger_url)
    match part:
        case "limits":  # the key, its limits and Redis (only they bring it: the queue keeps its slots in process)
            del frag["keys"], frag["redis"]
        case "cache":
            del frag["cache"]
        case "ledger":
            del frag["ledger"]
        case "queue":
            del frag["providers"]
        case "log":
            frag["logging"] = {"requests": False}
        case _:
            raise ValueError(f"no part {part!r} (one of {', '.join(PARTS)})")
    return frag


def configurations(redis_url: str, work: Path, tag: str) -> dict[str, dict[str, object]]:
    """Every configuration measured, by its row's name: fragments merged into the bench's gateway config."""
    ledger_url = everything.sqlite_url(work, tag)
    out: dict[str, dict[str, object]] = {"nothing on": features.fragment("nothing", redis_url, work, tag)}
    for f in features.FEATURES:
        out[f"{f.name} alone"] = features.fragment(f.name, redis_url, work, f"{tag}-{f.name}")
    out["everything on"] = everything.fragment(redis_url, ledger_url)
    for part in PARTS:
        out[f"everything but {part}"] = without(part, redis_url, everything.sqlite_url(work, f"{tag}-no-{part}"))
    return out


@dataclass(frozen=True)
class Run:
    rps: float
    user_us: float  # per request
    system_us: float
    p50_us: float
    redis_us: float = 0.0  # Redis's own CPU per request
    script_calls: float = 0.0  # script calls Redis ran per request (EVALSHA and EVAL)
    slept: float = 0.0  # the gateway's voluntary context switches per request: waits with nothing to run
    preempted: float = 0.0  # its involuntary ones: its core taken by another process while it had work


Row = tuple[str, float, float, float, float, float, float, float, float]


def summary(runs: dict[str, list[Run]]) -> list[Row]:
    """(name, median req/s, median user µs, median system µs, median p50 µs, median Redis CPU µs, median
    script calls, median switches slept and preempted) per configuration, in measuring order."""
    return [
        (
            name,
            statistics.median(r.rps for r in rows),
            statistics.median(r.user_us for r in rows),
            statistics.median(r.system_us for r in rows),
            statistics.median(r.p50_us for r in rows),
            statistics.median(r.redis_us for r in rows),
            statistics.median(r.script_calls for r in rows),
            statistics.median(r.slept for r in rows),
            statistics.median(r.preempted for r in rows),
        )
        for name, rows in runs.items()
        if rows
    ]


def report(rows: list[Row], head: str) -> str:
    base = {name: (user + system, p50) for name, _, user, system, p50, *_ in rows}
    nothing, on = base.get("nothing on"), base.get("everything on")
    lines = [
        head,
        "",
        "| configuration | req/s | user µs/request | system µs/request | CPU µs/request | p50 µs | against "
        "| Redis CPU µs/request | Redis script calls/request | gateway switches/request: slept / preempted |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rps, user, system, p50, redis_us, calls, slept, preempted in rows:
        total = user + system
        if name.startswith("everything but") and on is not None:
            against = f"{total - on[0]:+.1f} µs CPU, p50 {p50 - on[1]:+.0f} µs against everything on"
        elif name != "nothing on" and nothing is not None:
            against = f"{total - nothing[0]:+.1f} µs CPU, p50 {p50 - nothing[1]:+.0f} µs against nothing on"
        else:
            against = ""
        lines.append(
            f"| {name} | {rps:,.0f} | {user:.1f} | {system:.1f} | {total:.1f} | {p50:.0f} | {against} "
            f"| {redis_us:.1f} | {calls:.3f} | {slept:.2f} / {preempted:.2f} |"
        )
    return "\n".join(lines) + "\n"


def measure(
    url: str, work: Path, seconds: float, gateway: processes.Service, redis_url: str, connections: int = 32
) -> Run:
    # Each script numbers its prompts afresh from a nonce of its own: no request repeats an earlier one's.
    wrk.run(url, wrk.write_script(BODY, work, "warmup", vary="Say hello"), connections, 2.0)
    pids = gateway.pids()  # the server and its workers, every one started by now
    with redis.Redis.from_url(redis_url) as client:
        r0, c0 = redis_cpu_s(redis_url), stores.script_calls(client.info("commandstats"))
        u0, s0 = processes.tree_user_system_seconds(pids)
        v0, i0 = processes.tree_switches(pids)
        load = wrk.run(url, wrk.write_script(BODY, work, "load", vary="Say hello"), connections, seconds)
        u1, s1 = processes.tree_user_system_seconds(pids)
        v1, i1 = processes.tree_switches(pids)
        r1, c1 = redis_cpu_s(redis_url), stores.script_calls(client.info("commandstats"))
    if load.errors or not load.requests:
        raise RuntimeError(f"{url}: {load.errors} errors in {load.requests} requests")
    n = load.requests
    return Run(
        load.rps,
        (u1 - u0) / n * 1e6,
        (s1 - s0) / n * 1e6,
        float(load.p50_us),
        (r1 - r0) / n * 1e6,
        (c1 - c0) / n,
        (v1 - v0) / n,
        (i1 - i0) / n,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpusplit", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--connections", type=int, default=32, help="wrk's connections (1: every process on one core)")
    parser.add_argument("--workers", type=int, default=1, help="the gateway's worker processes (default 1)")
    parser.add_argument("--only", help="comma-separated row names to measure (default: every row)")
    parser.add_argument("--out", type=Path, help="write the markdown table here (default: stdout)")
    args = parser.parse_args(argv)
    if wrk.find_wrk() is None or nginx.find_nginx() is None:
        print("bench.cpusplit needs wrk and nginx", file=sys.stderr)
        return 2
    if args.connections < 1:
        parser.error("--connections must be at least 1")
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.connections == 1:
        # Children inherit it: Redis, nginx, every gateway and wrk share the core, as in the bench's c=1 rows.
        os.sched_setaffinity(0, {LOADGEN_CPU})
    with tempfile.TemporaryDirectory(prefix="bench-cpusplit-") as temp:
        work = Path(temp)
        redis = stores.start_redis()
        port = processes.free_port()
        upstream = processes.start("upstream-nginx", nginx.prepare(port, work / "nginx"), port, work)
        try:
            names = list(configurations(redis.url, work, "probe"))
            if args.only:
                wanted = [n.strip() for n in args.only.split(",")]
                unknown = set(wanted) - set(names)
                if unknown:
                    parser.error(f"--only: no row {sorted(unknown)} (rows: {', '.join(names)})")
                names = [n for n in names if n in wanted]
            runs: dict[str, list[Run]] = {n: [] for n in names}
            for r in range(args.rounds):
                configs = configurations(redis.url, work, f"r{r}")
                for name in names if r % 2 == 0 else names[::-1]:
                    config = merge(gateway_config(upstream.port, processes.free_port(), None), configs[name])
                    gateway = start_gateway(config, work, args.workers)
                    try:
                        url = gateway.base_url + "/v1/completions"
                        run = measure(url, work, args.seconds, gateway, redis.url, args.connections)
                    finally:
                        gateway.stop()
                    runs[name].append(run)
                    print(
                        f"[cpusplit] round {r + 1}: {name}: {run.rps:,.0f} req/s, user {run.user_us:.1f} µs, "
                        f"system {run.system_us:.1f} µs per request, p50 {run.p50_us:.0f} µs; Redis "
                        f"{run.redis_us:.1f} µs and {run.script_calls:.3f} script calls per request; the gateway "
                        f"slept {run.slept:.2f} and was preempted {run.preempted:.2f} times per request",
                        file=sys.stderr,
                    )
        finally:
            upstream.stop()
            redis.stop()
    head = (
        f"{invoked('cpusplit', argv)}: wrk c={args.connections} on `/v1/completions`, every request a "
        f"cache miss, {args.seconds:g} s per run, the median of {args.rounds} rounds"
        f"{'; every process on one core' if args.connections == 1 else ''}"
        f"{f'; {args.workers} workers, the CPU of every process of the gateway' if args.workers > 1 else ''}."
    )
    text = report(summary(runs), head)
    emit(text, args.out, "cpusplit")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
