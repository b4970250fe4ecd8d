"""``python -m bench.roundtrips``: the Redis round trips of one request, and which of them its answer waits for.

One request at a time (so nothing is merged with another request's calls) through the gateway's real
ASGI app in process, in the everything-on configuration of ``bench.instructions --all`` (rpm + tpm
limits on the client's key in Redis, the response cache with every request a miss, the ledger,
``max_concurrency`` far above the load with its leases in Redis, the access log), against a loopback
upstream in a process of its own, while a MONITOR connection records every command Redis runs.

A command a client sent is a round trip; commands one client sends back to back (a pipeline: the
usage flush's MULTI ... EXEC, the shared health's reads) are one. A command a script ran inside Redis
(MONITOR names its client ``lua``: the admission script's TIME, GET and SET) is no round trip and is
counted apart: Redis's own command statistics (``INFO commandstats``, ``total_commands_processed``)
count those too, which is why they show several "commands" per request where the gateway sends one.

Each round trip is put in the request during whose answer it reached Redis (after the request was
handed to the app, before its answer's last byte was sent: the answer may have waited for it) or after
that answer (before the next request: work moved off the answer's path, and the timers' batches). With
one request at a time, every round trip before the answer that the answer awaits is serial latency.
Script calls are named by their mode (``acquire``, ``adjust``, ``release``, ``block``, ...); a tick's calls
merged into one (mode ``batch``) by the modes it carries, each counted among the commands before the answer.

MONITOR costs Redis time, so read the counts, not the wall times, of this run. Give it a redis-server of
its own or a database number nobody else uses: commands on other databases are left out.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import collections
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlparse

import redis as redis_py

from bench.inprocess import config_text, is_chat, lifespan, loop_runner, request_body, send_one, start_upstream

# What the run sends MONITOR to bracket the measured requests (ECHO runs no script and touches no key).
_START: Final = "bench-roundtrips-start"
_STOP: Final = "bench-roundtrips-stop"
# Commands of one client this close together, with nothing else between them, arrived in one write.
_PIPELINE_GAP_S: Final = 0.0002
PATHS: Final = ("h1", "chat", "h1-stream", "chat-stream")


@dataclass
class Command:
    at: float
    client: str  # "host:port", or "lua" for a command a script ran
    name: str
    args: list[str]


@dataclass
class Window:
    start: float
    answered: float = 0.0
    end: float = 0.0

    def answer_sent(self) -> None:
        self.answered = time.time()  # the answer's last byte


@dataclass
class Report:
    requests: int
    before: collections.Counter[str] = field(default_factory=collections.Counter)
    after: collections.Counter[str] = field(default_factory=collections.Counter)
    scripted: collections.Counter[str] = field(default_factory=collections.Counter)
    # Each command the gateway sent before an answer, by kind, whether alone or in a pipeline with others.
    commands_before: collections.Counter[str] = field(default_factory=collections.Counter)
    to_first_us: list[float] = field(default_factory=list)  # request start to its first round trip at Redis

    def as_dict(self) -> dict[str, Any]:
        n = self.requests
        return {
            "requests": n,
            "round_trips_before_answer": sum(self.before.values()) / n,
            "round_trips_after_answer": sum(self.after.values()) / n,
            "before_answer": {k: v / n for k, v in self.before.most_common()},
            "after_answer": {k: v / n for k, v in self.after.most_common()},
            "script_commands": {k: v / n for k, v in self.scripted.most_common()},
            "commands_before_answer": {k: v / n for k, v in self.commands_before.most_common()},
            "start_to_first_round_trip_us_p50": statistics.median(self.to_first_us) if self.to_first_us else None,
        }


def calls(cmd: Command) -> tuple[list[str], bool]:
    """What a command decides, and whether it is a merged script call: a script call by its mode (the argument
    after its keys), a merged one (mode `batch`: per call its key count, mode, lease and 4 arguments per key) by
    each of its calls' modes; any other command by its name."""
    args = cmd.args
    if cmd.name not in ("EVALSHA", "EVAL") or len(args) < 2 or not args[1].isdigit():
        return [cmd.name], False
    at = 2 + int(args[1])
    mode = args[at] if len(args) > at else "?"
    if mode != "batch":
        return [f"script {mode}"], False
    modes: list[str] = []
    at += 1
    while at + 1 < len(args) and args[at].isdigit():
        modes.append(f"script {args[at + 1]}")
        at += 3 + 4 * int(args[at])
    return modes, True


def kind(cmd: Command) -> str:
    """A command by what it decides (`calls`); a merged script call as `script batch (acquire, adjust)`."""
    decided, merged = calls(cmd)
    if not merged:
        return decided[0]
    return "script batch (" + ", ".join(d.removeprefix("script ") for d in decided) + ")"


def round_trips(commands: list[Command]) -> list[tuple[float, str]]:
    """(arrival, what) per round trip: a client's commands that reached Redis back to back are one."""
    out: list[tuple[float, str]] = []
    last: Command | None = None
    names: list[str] = []
    for cmd in commands:
        if cmd.client == "lua":
            last = None  # a script ran between: whatever comes next was written after its answer
            continue
        if last is not None and cmd.client == last.client and cmd.at - last.at <= _PIPELINE_GAP_S:
            names.append(kind(cmd))
            out[-1] = (out[-1][0], _label(names))
        else:
            names = [kind(cmd)]
            out.append((cmd.at, names[0]))
        last = cmd
    return out


def _label(names: list[str]) -> str:
    return f"pipeline {names[0]} ... {names[-1]} ({len(names)} commands)"


def attribute(commands: list[Command], windows: list[Window]) -> Report:
    """Each round trip to the request it arrived during (before or after that request's answer)."""
    report = Report(requests=len(windows))
    starts = [w.start for w in windows]
    for cmd in commands:
        if cmd.client == "lua":
            report.scripted[cmd.name] += 1
        else:
            i = _window(cmd.at, windows, starts)
            if i is not None and cmd.at < windows[i].answered:
                for decided in calls(cmd)[0]:  # a merged script call: each call it carried
                    report.commands_before[decided] += 1
    first_seen: set[int] = set()
    for at, what in round_trips(commands):
        i = _window(at, windows, starts)
        if i is None:
            continue  # before the first measured request or after the last one
        w = windows[i]
        if at < w.answered:
            report.before[what] += 1
            if i not in first_seen:
                first_seen.add(i)
                report.to_first_us.append((at - w.start) * 1e6)
        else:
            report.after[what] += 1
    return report


def _window(at: float, windows: list[Window], starts: list[float]) -> int | None:
    """The index of the measured request during which `at` falls (from its start to the next one's start, the
    last one's end for the last), if any; `starts` are the windows' starts."""
    i = bisect.bisect_right(starts, at) - 1
    if i < 0 or (i == len(windows) - 1 and at > windows[i].end):
        return None
    return i


class Recorder(threading.Thread):
    """MONITOR on its own connection, keeping what runs on `db` between the start and stop markers."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True, name="bench-roundtrips-monitor")
        # No read timeout: MONITOR waits for commands, and a slow machine's set-up runs none for seconds.
        self.client = redis_py.Redis.from_url(url, socket_timeout=None)
        self.db = int(urlparse(url).path.strip("/") or 0)
        self.commands: list[Command] = []
        self.started = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        recording = False
        try:
            with self.client.monitor() as monitor:  # type: ignore[no-untyped-call]
                for entry in monitor.listen():
                    text = entry["command"]
                    if text.startswith("ECHO ") and entry["db"] == self.db:
                        if text.endswith(_START):
                            recording = True
                            self.started.set()
                            continue
                        if text.endswith(_STOP):
                            return
                    if not recording or entry["db"] != self.db:
                        continue
                    parts = text.split(" ")
                    client = (
                        "lua" if entry["client_type"] == "lua" else f"{entry['client_address']}:{entry['client_port']}"
                    )
                    self.commands.append(Command(entry["time"], client, parts[0].upper(), parts[1:]))
        except BaseException as exc:  # reported by the caller
            self.error = exc
            self.started.set()

    def mark(self, marker: str) -> None:
        self.client.echo(marker)


async def _drive(path: str, requests: int, warmup: int, port: int, vary: bool, recorder: Recorder) -> list[Window]:
    from gateway.config import parse_config
    from gateway.edge.app import create_app
    from gateway.ops import accesslog

    # The access line is built and buffered as in production; only the write goes nowhere.
    devnull, kept = os.open(os.devnull, os.O_WRONLY), accesslog.SINK.fd
    accesslog.SINK.fd = devnull
    app = create_app(parse_config(config_text(port, "always"), "bench-roundtrips.yaml"))
    shutdown = await lifespan(app)
    route = "/v1/chat/completions" if is_chat(path) else "/v1/completions"
    windows: list[Window] = []
    loop = asyncio.get_running_loop()
    try:
        for i in range(warmup + requests):
            if i == warmup:
                # The marker goes on its own connection, from a thread: this loop's connections stay as they are.
                await loop.run_in_executor(None, recorder.mark, _START)
                await loop.run_in_executor(None, recorder.started.wait, 10.0)
            body = request_body(path, i if vary else None)
            window = Window(start=time.time())
            status, _ = await send_one(app, body, route, window.answer_sent)
            window.end = time.time()
            if status != 200:
                raise RuntimeError(f"request {i} on {path}: {status}")
            if i >= warmup:
                windows.append(window)
        await loop.run_in_executor(None, recorder.mark, _STOP)  # before the shutdown gives its leases back
    finally:
        await shutdown()
        accesslog.SINK.flush()
        accesslog.SINK.fd = kept
        os.close(devnull)
    return windows


def measure(
    path: str, redis_url: str, ledger_url: str, requests: int, warmup: int, hits: bool, max_concurrency: int = 100_000
) -> Report:
    # bench.instructions' `--all`, read by bench.inprocess' `config_text` from the environment; put back afterwards.
    wanted = {
        "BENCH_REDIS_URL": redis_url,
        "BENCH_LEDGER_URL": ledger_url,
        "BENCH_LIMITS": "1",
        "BENCH_MAX_CONCURRENCY": str(max_concurrency),
    }
    saved = {k: os.environ.get(k) for k in wanted}
    os.environ.update(wanted)
    upstream = start_upstream(20)
    recorder = Recorder(redis_url)
    recorder.start()
    try:
        windows = loop_runner()(_drive(path, requests, warmup, upstream.port, not hits, recorder))
    finally:
        upstream.stop()
        recorder.mark(_STOP)  # again if the run stopped early: the recorder ends either way
        recorder.join(30)
        recorder.client.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if recorder.error is not None:
        raise RuntimeError(f"MONITOR failed: {recorder.error}")
    return attribute(recorder.commands, windows)


def render(path: str, report: Report, hits: bool) -> str:
    d = report.as_dict()
    what = "every answer a cache hit" if hits else "every request a cache miss"
    lines = [
        f"{path}, everything on, {what}, one request at a time, {report.requests} requests:",
        f"  Redis round trips per request: {d['round_trips_before_answer']:.3f} before the answer, "
        f"{d['round_trips_after_answer']:.3f} after it",
    ]
    for title, counts in (("before the answer", d["before_answer"]), ("after the answer", d["after_answer"])):
        if counts:
            lines.append(f"  {title}: " + ", ".join(f"{k} {v:.3f}" for k, v in counts.items()))
    if d["script_commands"]:
        lines.append(
            "  run by scripts inside Redis (no round trips): "
            + ", ".join(f"{k} {v:.2f}" for k, v in d["script_commands"].items())
        )
    if d["start_to_first_round_trip_us_p50"] is not None:
        lines.append(
            f"  from the request's start to its first round trip reaching Redis: "
            f"{d['start_to_first_round_trip_us_p50']:.0f} µs p50 (MONITOR slows Redis: a rough figure)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.roundtrips", description=__doc__)
    parser.add_argument("--redis", required=True, help="a redis.url, with a database nobody else uses")
    parser.add_argument("--ledger", required=True, help="the ledger's URL (sqlite:///... or postgresql://...)")
    parser.add_argument("--paths", default="h1", help=f"comma-separated, of {', '.join(PATHS)}")
    parser.add_argument("--requests", type=int, default=2000, help="measured requests")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured requests first")
    parser.add_argument("--hits", action="store_true", help="the same request each time: every answer a cache hit")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    for p in paths:
        if p not in PATHS:
            parser.error(f"--paths: unknown path {p!r} (one of {', '.join(PATHS)})")
    results: dict[str, Any] = {}
    for path in paths:
        report = measure(path, args.redis, args.ledger, args.requests, args.warmup, args.hits)
        results[path] = report.as_dict()
        print(render(path, report, args.hits), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
