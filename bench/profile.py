"""``python -m bench.profile``: a sampling profile of the everything-on gateway under load, summarised.

Starts the nginx upstream, a redis-server and the gateway with bench/everything.py's configuration (SQLite
ledger), puts wrk's load on it (c=32, every request a cache miss, or ``--hits``), and samples the gateway
with py-spy (``pip install py-spy``; `--py-spy PATH` or PATH) for ``--seconds``. The summary (markdown):
the share of samples by thread, by area of the code (the innermost frame of the project's own code, or the
library it is in), and the functions with the most samples of their own and in total. ``--raw`` keeps
py-spy's collapsed stacks for flame graphs. ``--feature NAME`` profiles one part of that configuration alone
instead (bench/features.py's rows: ``nothing``, ``limits``, ``cache``, ``ledger``, ``queue``, ``queue-redis``,
``log``), to see where a feature row's cost goes. ``--against-plain`` first profiles the gateway with nothing
on under the same load, in the same run, and adds a table of what each function costs per request in both,
in microseconds of one core (its samples over the rate and the seconds sampled, divided by the requests
served a second), sorted by what the configuration adds.

    python -m bench.profile --seconds 20 --against-plain --out docs/profile-everything.md
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import redis as redis_py

from bench import everything, features, processes, stores, wrk
from bench.configs import gateway_config, merge, start_gateway
from bench.scenarios import BODY, CHAT_BODY, CHAT_PATH
from bench.tool_report import emit, invoked
from bench.upstream import nginx


def find_py_spy(given: str | None) -> str | None:
    if given:
        return given
    beside = Path(sys.executable).with_name("py-spy")
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def area(frame: str) -> str:
    """`func (path/to/file.py:123)` -> a short area name: a project package, or the library."""
    path = frame.rsplit(" (", 1)[-1].rstrip(")").rsplit(":", 1)[0]
    for marker in ("/site-packages/", "/lib/python3"):
        if marker in path:
            rest = path.split(marker, 1)[1].lstrip("/")
            if marker == "/lib/python3":
                rest = rest.split("/", 1)[1] if "/" in rest else rest
                return "stdlib:" + rest.split("/")[0].removesuffix(".py")
            return rest.split("/")[0].removesuffix(".py")
    parts = Path(path).parts
    for root in ("gateway", "providers", "wire"):
        if root in parts:
            i = parts.index(root)
            return "/".join(parts[i : i + 2]).removesuffix(".py")
    return path


def redis_traffic(counter: redis_py.Redis, requests: int) -> str:
    """Redis's side of the load, per request: commands, and reads of a client socket (a write from the gateway)."""
    if requests <= 0:
        return ""
    stats = counter.info("stats")
    commands = counter.info("commandstats")
    scripts = stores.script_calls(commands)
    reads = stats.get("total_reads_processed")
    per = f"{reads / requests:.2f} socket reads" if reads is not None else "socket reads not reported"
    each = sorted(((v["calls"] / requests, k.removeprefix("cmdstat_")) for k, v in commands.items()), reverse=True)
    which = ", ".join(f"{name} {n:.2f}" for n, name in each if n >= 0.01)
    return (
        f"Redis per request: {stats['total_commands_processed'] / requests:.2f} commands run "
        f"({scripts / requests:.2f} script calls; Redis counts the commands a script runs inside it too, which "
        f"are no round trips: `python -m bench.roundtrips` counts those), "
        f"{per} (a write from the gateway each, batched per loop tick). By command: {which}."
    )


def _frame_key(frame: str) -> str:
    """`func (path/file.py:123)` -> `func (path/file.py)`: a function's lines counted as one."""
    name, sep, where = frame.rpartition(" (")
    if not sep:
        return frame
    return f"{name} ({where.rstrip(')').rsplit(':', 1)[0]})"


def stacks(raw: str) -> Iterator[tuple[int, str, list[str]]]:
    """py-spy's collapsed stacks as (samples, thread, Python frames outermost first). `--threads` puts
    "thread (0x...): name" first; a pool's numbered threads count as the pool, and a stack without one is
    "main"'s."""
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = stack.split(";")
        head = frames[0].split(": ", 1)[-1] if frames[0].startswith(("thread", "process")) else "main"
        frames = [f for f in frames if " (" in f and not f.startswith(("thread", "process"))]
        yield int(count_text), head.rstrip("0123456789").rstrip("_"), frames


class Costs(NamedTuple):
    """Per function (and per thread): microseconds of one core per request; and per function, the functions
    it calls directly (a caller that does nothing but call one shows that one's figure again)."""

    us: dict[str, float]
    calls: dict[str, set[str]]


def per_request_us(raw: str, rate: int, seconds: float, rps: float) -> Costs:
    """Each function's samples, with what it calls, as microseconds of one core per request; and each thread's
    under `thread NAME`, everything under `all threads`. A thread is sampled `rate` times a second while it
    runs, so a count over `rate * seconds` is the share of a core it spent there."""
    if rps <= 0 or rate <= 0 or seconds <= 0:
        return Costs({}, {})
    scale = 1e6 / (rate * seconds * rps)
    counts: collections.Counter[str] = collections.Counter()
    calls: dict[str, set[str]] = collections.defaultdict(set)
    for count, thread, frames in stacks(raw):
        counts["all threads"] += count
        counts["thread " + thread] += count
        keys = [_frame_key(f) for f in frames]
        for caller, callee in zip(keys, keys[1:], strict=False):
            calls[caller].add(callee)
        for key in set(keys):
            counts[key] += count
    return Costs({key: n * scale for key, n in counts.items()}, dict(calls))


def against(plain: Costs, on: Costs, top: int) -> str:
    """The functions whose per-request cost differs most between the two profiles, threads and the total first.
    A function that shows the same two figures as one it calls (a caller that only wraps it) is left out.
    """
    keys = on.us.keys() | plain.us.keys()
    head = [k for k in keys if k == "all threads" or k.startswith("thread ")]

    def figures(key: str) -> tuple[float, float]:
        return plain.us.get(key, 0.0), on.us.get(key, 0.0)

    def wraps(key: str) -> bool:
        callees = on.calls.get(key, set()) | plain.calls.get(key, set())
        return any(callee != key and figures(callee) == figures(key) for callee in callees)

    rest = [k for k in keys if k not in head and not wraps(k)]
    rest.sort(key=lambda k: (-(figures(k)[1] - figures(k)[0]), k))
    head.sort(key=lambda k: (k != "all threads", -on.us.get(k, 0.0), k))
    lines = [
        "| function, including what it calls (µs of one core per request) | nothing on | this configuration | added |",
        "|---|---|---|---|",
    ]
    for key in head + rest[:top]:
        a, b = figures(key)
        lines.append(f"| `{key}` | {a:.1f} | {b:.1f} | {b - a:+.1f} |")
    return "\n".join(lines) + "\n"


def summarise(raw: str, top: int) -> str:
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    areas: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    samples = 0
    for count, thread, frames in stacks(raw):
        samples += count
        threads[thread] += count
        if not frames:
            continue
        own[frames[-1]] += count
        for f in set(frames):
            total[f] += count
        ours = [f for f in frames if any(f"/{r}/" in f for r in ("gateway", "providers", "wire"))]
        leaf_area = area(frames[-1])
        areas[leaf_area if ":" in leaf_area or "/" not in leaf_area else area(ours[-1]) if ours else leaf_area] += count

    def pct(n: int) -> str:
        return f"{100.0 * n / samples:.1f} %" if samples else "-"

    lines = [f"{samples:,} samples.", "", "| thread | share |", "|---|---|"]
    lines += [f"| {name} | {pct(n)} |" for name, n in threads.most_common(8)]
    lines += ["", "| where the sampled frame is (own time) | share |", "|---|---|"]
    lines += [f"| {name} | {pct(n)} |" for name, n in areas.most_common(top)]
    lines += ["", "| function, own samples | share |", "|---|---|"]
    lines += [f"| `{name}` | {pct(n)} |" for name, n in own.most_common(top)]
    lines += ["", "| function, including what it calls | share |", "|---|---|"]
    lines += [f"| `{name}` | {pct(n)} |" for name, n in total.most_common(top)]
    return "\n".join(lines) + "\n"


class Sampled(NamedTuple):
    raw: str
    rps: float
    redis_note: str


def _sample(
    args: argparse.Namespace,
    py_spy: str,
    config: dict[str, object],
    path: str,
    body: bytes,
    redis_url: str,
    work: Path,
    tag: str,
) -> Sampled | None:
    """One gateway with `config` under wrk's load, sampled by py-spy for `args.seconds`; None if py-spy wrote
    nothing (it says why on stderr)."""
    gateway = start_gateway(config, work)
    try:
        vary = None if args.hits else "Say hello"
        url = gateway.base_url + path
        wrk.run(url, wrk.write_script(body, work, f"warmup-{tag}", vary=vary), args.connections, 3.0)
        script = wrk.write_script(body, work, f"load-{tag}", vary=vary)
        raw_path = work / f"profile-{tag}.txt"
        spy = [py_spy, "record", "--format", "raw", "--rate", str(args.rate), "--threads", "--nonblocking"]
        spy += ["--duration", str(round(args.seconds)), "--output", str(raw_path), "--pid", str(gateway.proc.pid)]
        spy += ["--gil"] if args.gil else []
        counter = redis_py.Redis.from_url(redis_url)
        counter.config_resetstat()
        sampler = subprocess.Popen(spy, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)
        load = wrk.run(url, script, args.connections, args.seconds + 1.0)
        redis_note = redis_traffic(counter, load.requests)
        counter.close()
        _, err = sampler.communicate(timeout=args.seconds + 60)
        if not raw_path.exists():
            print(f"py-spy wrote nothing: {err.decode(errors='replace')[-500:]}", file=sys.stderr)
            return None
        return Sampled(raw_path.read_text(), load.rps, redis_note)
    finally:
        gateway.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--hits", action="store_true", help="one prompt for all: every answer a cache hit")
    parser.add_argument("--chat", action="store_true", help="load /v1/chat/completions instead")
    parser.add_argument("--plain", action="store_true", help="the gateway with nothing on, for comparison")
    parser.add_argument(
        "--feature",
        choices=("nothing", *(f.name for f in features.FEATURES)),
        help="one part of the configuration alone, as a feature_* row runs it (nothing: the access log off too)",
    )
    parser.add_argument(
        "--against-plain",
        dest="against_plain",
        action="store_true",
        help="profile the gateway with nothing on first, in the same run, and compare per request",
    )
    parser.add_argument("--gil", action="store_true", help="sample only the thread holding the GIL")
    parser.add_argument("--py-spy", dest="py_spy", help="the py-spy binary")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--raw", type=Path, help="keep py-spy's collapsed stacks here")
    parser.add_argument("--out", type=Path, help="write the markdown summary here (default: stdout)")
    args = parser.parse_args(argv)
    py_spy = find_py_spy(args.py_spy)
    if py_spy is None or wrk.find_wrk() is None or nginx.find_nginx() is None:
        print("bench.profile needs py-spy (pip install py-spy), wrk and nginx", file=sys.stderr)
        return 2
    # Other processes' CPU use before the run: on a busy machine, time in a write that wakes another
    # process grows with the competition, so the summary says how busy the machine was.
    busy = processes.foreign_load_pct(1.0)
    path = CHAT_PATH if args.chat else "/v1/completions"
    body = CHAT_BODY if args.chat else BODY
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as temp:
        work = Path(temp)
        upstream: processes.Service | None = None
        redis = stores.start_redis()
        try:
            port = processes.free_port()
            upstream = processes.start("upstream-nginx", nginx.prepare(port, work / "nginx"), port, work)
            config = gateway_config(upstream.port, processes.free_port(), None)
            plain_run: Sampled | None = None
            if args.against_plain and not args.plain:
                plain_run = _sample(args, py_spy, config, path, body, redis.url, work, "plain")
                if plain_run is None:
                    return 1
            if args.feature is not None:
                config = merge(config, features.fragment(args.feature, redis.url, work, "profile"))
            elif not args.plain:
                config = merge(config, everything.fragment(redis.url, everything.sqlite_url(work, "profile")))
            server = config["server"]
            assert isinstance(server, dict)
            config = {**config, "server": {**server, "port": processes.free_port()}}
            run = _sample(args, py_spy, config, path, body, redis.url, work, "on")
            if run is None:
                return 1
        finally:
            if upstream is not None:
                upstream.stop()
            redis.stop()
    if args.raw is not None:
        args.raw.write_text(run.raw)
    what = "nothing on" if args.plain else "everything on (bench/everything.py, SQLite ledger)"
    if args.feature is not None:
        what = "nothing on, the access log off too" if args.feature == "nothing" else f"only {args.feature} on"
    head = (
        f"# Profile: the gateway with {what}, under load\n\n"
        f"{invoked('profile', argv)}: wrk c={args.connections} on `{path}`, "
        f"{'every answer a cache hit' if args.hits else 'every request a cache miss'}, "
        f"{run.rps:,.0f} req/s during the {args.seconds:g} s sampled (py-spy at {args.rate} Hz"
        f"{', GIL holder only' if args.gil else ''}; {os.cpu_count()} cores; before the run, other processes "
        f"used {busy:.0f} % of one core).\n\n"
        f"{run.redis_note}\n\n"
    )
    text = head + summarise(run.raw, args.top)
    if plain_run is not None:
        text += (
            f"\n## Against the gateway with nothing on, in the same run\n\n"
            f"The gateway as shipped (the access log on, nothing else) profiled just before, under the same load: "
            f"{plain_run.rps:,.0f} req/s, against {run.rps:,.0f} with {what.split(' (')[0]}. Each figure is a "
            f"function's samples with what it calls, as microseconds of one core per request served; a coroutine "
            f"counts only while it runs, so the event loop's own work and the callbacks it makes (a connection's "
            f"`data_received`) show under `Runner.run`. Threads and the "
            f"whole process first, then the functions by what the configuration adds.\n\n"
        )
        text += against(
            per_request_us(plain_run.raw, args.rate, args.seconds, plain_run.rps),
            per_request_us(run.raw, args.rate, args.seconds, run.rps),
            args.top,
        )
    emit(text, args.out, "profile")
    return 0


if __name__ == "__main__":
    sys.exit(main())
