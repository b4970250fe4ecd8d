"""``python -m bench.redisload``: how many admissions one Redis core decides, for sizing the Redis that exact
rate limits share across gateways.

Every gateway with limits in Redis asks it once per request (the admission script: every bucket of the
request checked and charged, or none, atomically), and merges the requests of one loop tick into one script
call (up to 64 per call). So Redis's cost per request depends on how many requests a call carries, which
grows with each gateway's load, and on whether they charge the same buckets (one busy key: each bucket is
read and written once per call) or buckets of their own (many tenants: each request's own keys).

This drives the gateway's own limiter (gateway/limits/ratelimit.py, its script channel and script) against a
redis-server of its own: rounds of ``B`` admissions issued in one tick (rpm + tpm on the key, far above what
the run reaches, so nothing is refused), for ``--seconds`` per row, and reads Redis's process CPU (user and
system, from /proc) and its ``INFO commandstats`` before and after. Redis's CPU per admission is its whole
cost (reading the request, the script, the reply, its event loop); 1,000,000 / that is the admissions one
Redis core decides per second. The driver runs in this Python process, which is slower than Redis: it
measures Redis's cost per admission, not how fast one client can send.

    python -m bench.redisload --seconds 3 --out /tmp/redisload.md

``--count instructions`` runs redis-server under ``valgrind --tool=callgrind`` and gives the instructions Redis
runs per admission over ``--admissions`` of them per row (its user-space work only: the kernel's side of
each read and write is not counted), which the machine's load does not move: what to compare two scripts by.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import redis as redis_py

from bench import processes, stores
from bench.instructions import callgrind_total
from bench.tool_report import emit, invoked
from gateway.limits.bucketset import BucketSet
from gateway.limits.gcra import Bucket
from gateway.limits.ratelimit import Limiter
from gateway.state import SharedState

# Admissions issued in one tick: one request at a time, then what busier gateways merge into one call.
BATCHES: Final = (1, 8, 32, 128)
# Tenants charged in turn in the "a key per admission" rows (each one's buckets compiled once).
TENANTS: Final = 512
TOKENS: Final = 50  # each admission's tokens: a short prompt and its max_tokens
RPM: Final = 1_000_000_000
TPM: Final = 100_000_000_000


@dataclass
class Row:
    batch: int
    keys: str  # "one key" or "a key per admission"
    admissions: int
    calls: int  # script calls Redis ran (EVALSHA), merged ones counted once
    cpu_us: float  # Redis's process CPU per admission
    script_us: float  # of which INFO commandstats counts running the script
    instructions: float = 0.0  # per admission, with `--count instructions`

    @property
    def per_call(self) -> float:
        return self.admissions / self.calls if self.calls else 0.0

    @property
    def per_core(self) -> float:
        return 1e6 / self.cpu_us if self.cpu_us else 0.0


def _evalsha(client: redis_py.Redis) -> tuple[int, float]:
    """EVALSHA calls so far and the microseconds Redis spent running them."""
    stats = client.info("commandstats").get("cmdstat_evalsha")
    if not stats:
        return 0, 0.0
    return int(stats["calls"]), float(stats["usec"])


def _sets(limiter: Limiter, own_keys: bool) -> list[BucketSet]:
    """The bucket sets charged in turn: one key's rpm + tpm, or each of TENANTS keys'."""
    keys = [f"key:t{t}" for t in range(TENANTS)] if own_keys else ["key:bench"]
    return [limiter.compiled([Bucket(k, "rpm", RPM), Bucket(k, "tpm", TPM)]) for k in keys]


async def _load(
    limiter: Limiter, sets: list[BucketSet], batch: int, seconds: float = 0.0, rounds: int | None = None
) -> int:
    """Rounds of `batch` admissions issued together for `seconds` (or `rounds` of them), charging `sets` in
    turn; the admissions made."""
    turn = 0
    made = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end if rounds is None else made < rounds * batch:
        futures = []
        for _ in range(batch):
            pending = limiter.acquiring(sets[turn % len(sets)], TOKENS)
            if pending is None:
                raise RuntimeError("the limiter does not call Redis (is it answering?)")
            futures.append(pending)
            turn += 1
        for reply in await asyncio.gather(*futures):
            if reply[0] != 1:
                raise RuntimeError(f"an admission was refused: {reply}")
        made += batch
    return made


@contextlib.asynccontextmanager
async def _driver(url: str) -> AsyncIterator[tuple[Limiter, redis_py.Redis]]:
    """A fresh limiter on `url`, and a plain client for Redis's own figures."""
    shared = SharedState(url)
    limiter = Limiter(shared, fail_open=False)
    client = redis_py.Redis.from_url(url)
    try:
        yield limiter, client
    finally:
        client.close()
        await limiter.close()
        await shared.close()


async def measure(url: str, pid: int, batch: int, own_keys: bool, seconds: float) -> Row:
    """One row: a fresh limiter warmed for a fraction of the time, then measured for `seconds`."""
    async with _driver(url) as (limiter, client):
        sets = _sets(limiter, own_keys)
        await _load(limiter, sets, batch, min(seconds / 4, 1.0))
        calls0, usec0 = _evalsha(client)
        user0, system0 = processes.user_system_seconds(pid)
        made = await _load(limiter, sets, batch, seconds)
        user1, system1 = processes.user_system_seconds(pid)
        calls1, usec1 = _evalsha(client)
    cpu = (user1 - user0) + (system1 - system0)
    return Row(
        batch,
        "a key per admission" if own_keys else "one key",
        made,
        calls1 - calls0,
        cpu / made * 1e6,
        (usec1 - usec0) / made,
    )


class Callgrind:
    """A redis-server run under callgrind (`wrapper` is its command; `pid` set once it runs), counted between
    `zero` and `count`."""

    def __init__(self) -> None:
        valgrind, control = shutil.which("valgrind"), shutil.which("callgrind_control")
        if valgrind is None or control is None:
            raise SystemExit("--count instructions needs valgrind (apt-get install -y valgrind)")
        self.control = control
        self.dir = Path(tempfile.mkdtemp(prefix="redisload-callgrind-"))
        self.wrapper = [valgrind, "--tool=callgrind", f"--callgrind-out-file={self.dir}/callgrind.%p"]
        self.pid = 0

    def _control(self, *args: str) -> None:
        subprocess.run([self.control, *args, str(self.pid)], check=True, capture_output=True, timeout=120)

    def zero(self) -> None:
        self._control("--zero")

    def count(self) -> int:
        """Instructions since `zero`: callgrind writes them to a file of their own."""
        before = set(self.dir.iterdir())
        self._control("--dump")
        (written,) = set(self.dir.iterdir()) - before
        return callgrind_total(written)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


async def count(url: str, grind: Callgrind, batch: int, own_keys: bool, admissions: int) -> Row:
    """One row of `--count instructions`: `admissions` (rounded up to whole ticks) after a warm-up."""
    async with _driver(url) as (limiter, client):
        sets = _sets(limiter, own_keys)
        await _load(limiter, sets, batch, rounds=max(2, 200 // batch))
        calls0, _ = _evalsha(client)
        grind.zero()
        made = await _load(limiter, sets, batch, rounds=-(-admissions // batch))
        total = grind.count()
        calls1, _ = _evalsha(client)
    return Row(batch, "a key per admission" if own_keys else "one key", made, calls1 - calls0, 0.0, 0.0, total / made)


def report(rows: list[Row], head: str) -> str:
    if rows and rows[0].instructions:
        lines = [
            head,
            "",
            "| admissions per tick | keys | admissions | per script call | Redis instructions per admission |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r.batch} | {r.keys} | {r.admissions:,} | {r.per_call:.1f} | {r.instructions:,.0f} |" for r in rows
        ]
        return "\n".join(lines) + "\n"
    lines = [
        head,
        "",
        "| admissions per tick | keys | admissions | per script call | Redis CPU µs per admission | of which the "
        "script | admissions per second per Redis core |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.batch} | {r.keys} | {r.admissions:,} | {r.per_call:.1f} | {r.cpu_us:.1f} | {r.script_us:.1f} | "
            f"{r.per_core:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.redisload", description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per row")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="admissions per tick, comma-separated")
    parser.add_argument("--redis-cpu", type=int, help="pin redis-server to this CPU (and this driver off it)")
    parser.add_argument("--out", type=Path, help="write the markdown table here (default: stdout)")
    parser.add_argument(
        "--count",
        choices=("cpu", "instructions"),
        default="cpu",
        help="Redis's CPU from /proc, or its instructions under callgrind (needs valgrind)",
    )
    parser.add_argument("--admissions", type=int, default=2000, help="admissions counted per row (instructions)")
    args = parser.parse_args(argv)
    if args.admissions < 1:
        parser.error("--admissions: at least 1")
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        parser.error(f"--batches: whole numbers, comma-separated (got {args.batches!r})")
    if any(b < 1 for b in batches):
        parser.error("--batches: each at least 1")
    grind = Callgrind() if args.count == "instructions" else None
    redis = stores.start_redis(grind.wrapper if grind is not None else ())
    try:
        pid = redis.proc.pid
        if grind is not None:
            grind.pid = pid
        if args.redis_cpu is not None:
            os.sched_setaffinity(pid, {args.redis_cpu})
            others = os.sched_getaffinity(0) - {args.redis_cpu}
            if others:
                os.sched_setaffinity(0, others)
        rows = []
        for own_keys in (False, True):
            for batch in batches:
                if grind is not None:
                    row = asyncio.run(count(redis.url, grind, batch, own_keys, args.admissions))
                    cost = f"{row.instructions:,.0f} Redis instructions"
                else:
                    row = asyncio.run(measure(redis.url, pid, batch, own_keys, args.seconds))
                    cost = f"{row.cpu_us:.1f} µs of Redis CPU"
                rows.append(row)
                print(
                    f"[redisload] {row.batch} per tick, {row.keys}: {row.per_call:.1f} per call, {cost} per admission",
                    file=sys.stderr,
                )
    finally:
        redis.stop()
        if grind is not None:
            grind.close()
    per_row = f"{args.seconds:g} s per row" if grind is None else f"{args.admissions:,} admissions per row, callgrind"
    head = f"{invoked('redisload', argv)}: rpm + tpm on the key, {per_row}."
    text = report(rows, head)
    emit(text, args.out, "redisload")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
