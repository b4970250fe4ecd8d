"""``python -m bench.cpusplit``: the gateway's user and system CPU per request at 32 connections, per feature.

Where the benchmark's ``feature_*`` rows give each feature's throughput beside nothing on, this asks the other
question too: what each part costs *inside* the everything-on configuration. It serves the same load (wrk,
c=32, a prompt of its own per request, the nginx upstream, a redis-server of its own) to the gateway with:
nothing on (the access log off too), each part alone, everything on (bench/everything.py, SQLite ledger),
and everything on but one part. Each configuration is a fresh gateway, warmed, then loaded for ``--seconds``;
its user and system CPU (every thread: the ledger's writer is in it) are read from /proc before and after,
divided by the requests served. ``--rounds`` rounds, each in the order opposite the last; each figure is the
median of its rounds. A part costs more inside everything on than alone when "everything but it" saves more
than "it alone" adds.

    python -m bench.cpusplit --rounds 3 --seconds 8 --out /tmp/cpusplit.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench import everything, features, processes, stores, wrk
from bench.configs import gateway_config, merge, start_gateway
from bench.scenarios import BODY
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


def summary(runs: dict[str, list[Run]]) -> list[tuple[str, float, float, float]]:
    """(name, median req/s, median user µs, median system µs) per configuration, in measuring order."""
    return [
        (
            name,
            statistics.median(r.rps for r in rows),
            statistics.median(r.user_us for r in rows),
            statistics.median(r.system_us for r in rows),
        )
        for name, rows in runs.items()
        if rows
    ]


def report(rows: list[tuple[str, float, float, float]], head: str) -> str:
    base = {name: (user + system) for name, _, user, system in rows}
    nothing, on = base.get("nothing on"), base.get("everything on")
    lines = [head, "", "| configuration | req/s | user µs/request | system µs/request | CPU µs/request | against |"]
    lines.append("|---|---|---|---|---|---|")
    for name, rps, user, system in rows:
        total = user + system
        if name.startswith("everything but") and on is not None:
            against = f"{total - on:+.1f} µs against everything on"
        elif name != "nothing on" and nothing is not None:
            against = f"{total - nothing:+.1f} µs against nothing on"
        else:
            against = ""
        lines.append(f"| {name} | {rps:,.0f} | {user:.1f} | {system:.1f} | {total:.1f} | {against} |")
    return "\n".join(lines) + "\n"


def measure(url: str, work: Path, seconds: float, pid: int) -> Run:
    wrk.run(url, wrk.write_script(BODY, work, "warmup", vary="Say hello"), 32, 2.0)
    u0, s0 = processes.user_system_seconds(pid)
    load = wrk.run(url, wrk.write_script(BODY, work, "load", vary="Say hello"), 32, seconds)
    u1, s1 = processes.user_system_seconds(pid)
    if load.errors or not load.requests:
        raise RuntimeError(f"{url}: {load.errors} errors in {load.requests} requests")
    n = load.requests
    return Run(load.rps, (u1 - u0) / n * 1e6, (s1 - s0) / n * 1e6)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpusplit", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--only", help="comma-separated row names to measure (default: every row)")
    parser.add_argument("--out", type=Path, help="write the markdown table here (default: stdout)")
    args = parser.parse_args(argv)
    if wrk.find_wrk() is None or nginx.find_nginx() is None:
        print("bench.cpusplit needs wrk and nginx", file=sys.stderr)
        return 2
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
                    gateway = start_gateway(config, work)
                    try:
                        run = measure(gateway.base_url + "/v1/completions", work, args.seconds, gateway.proc.pid)
                    finally:
                        gateway.stop()
                    runs[name].append(run)
                    print(
                        f"[cpusplit] round {r + 1}: {name}: {run.rps:,.0f} req/s, user {run.user_us:.1f} µs, "
                        f"system {run.system_us:.1f} µs per request",
                        file=sys.stderr,
                    )
        finally:
            upstream.stop()
            redis.stop()
    head = (
        f"{invoked('cpusplit', argv)}: wrk c=32 on `/v1/completions`, every request a "
        f"cache miss, {args.seconds:g} s per run, the median of {args.rounds} rounds."
    )
    text = report(summary(runs), head)
    emit(text, args.out, "cpusplit")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
