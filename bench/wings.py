"""``python -m bench.wings``: where a request's CPU goes, as shares by wing of gateway/ and by library.

The driver of ``bench.inprocess`` pushes completions through the real ASGI app and pipeline in
process (no HTTP server in front: uvicorn's share is not in it); cProfile, on a CPU-time clock so waiting
for the upstream counts nothing, brackets the measured requests, and each function's own time is summed
by where its code lives: a wing of gateway/ (``gateway/path``, ``gateway/upstream``, ...), providers/,
wire/, a library, or Python's built-ins. cProfile's own cost per call inflates code that makes many small
calls, so read the shares as rough; docs/performance.md quotes them as such.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import sys
import time
from pathlib import Path

from bench.inprocess import PATHS, drive, loop_runner, needs_upstream, start_upstream

ROOT = Path(__file__).resolve().parent.parent


def _place(filename: str) -> str:
    if filename == "~":
        return "Python built-ins and C extensions (msgspec, dict, str, ...)"
    path = Path(filename)
    try:
        parts = path.resolve().relative_to(ROOT).parts
    except ValueError:
        parts = ()
    if parts[:1] == ("gateway",):
        return "gateway/" + parts[1] if len(parts) > 2 else "gateway (state, ids)"
    if parts[:1] in (("providers",), ("wire",), ("bench",)):
        return parts[0] + ("/ (this driver)" if parts[0] == "bench" else "/")
    if "asyncio" in path.parts:
        return "asyncio"
    libs = [p for p in path.parts if p.endswith("-packages")]
    if libs:
        return path.parts[path.parts.index(libs[-1]) + 1].split(".")[0]
    return "Python's standard library (other)"


def shares(path: str, requests: int, warmup: int, chunks: int) -> tuple[float, list[tuple[str, float]]]:
    """CPU seconds per request without the profiler, and (place, share of the CPU time) largest first."""
    upstream = start_upstream(chunks) if needs_upstream(path) else None  # the fake paths answer in process
    port = None if upstream is None else upstream.port
    profiler = cProfile.Profile(time.process_time)
    spent = [0.0]

    def timed(start: bool) -> None:
        spent[0] = time.process_time() - spent[0] if not start else time.process_time()

    def around(start: bool) -> None:
        if start:
            profiler.enable()
        else:
            profiler.disable()

    try:
        loop_runner()(drive(path, requests, warmup, port, timed))
        loop_runner()(drive(path, requests, warmup, port, around))
    finally:
        if upstream is not None:
            upstream.stop()
    sums: collections.Counter[str] = collections.Counter()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    for (filename, _line, _name), (_cc, _nc, own, _cum, _callers) in stats.items():
        sums[_place(filename)] += own
    total = sum(sums.values()) or 1.0
    return spent[0] / requests, [(place, own / total) for place, own in sums.most_common()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wings", description=__doc__)
    parser.add_argument("--paths", default="h1", help=f"comma-separated, of {', '.join(PATHS)}")
    parser.add_argument("--requests", type=int, default=4000, help="measured requests")
    parser.add_argument("--warmup", type=int, default=300, help="unmeasured requests first")
    parser.add_argument("--chunks", type=int, default=20, help="events per upstream stream (h1-stream, chat-stream)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    for path in (p.strip() for p in args.paths.split(",") if p.strip()):
        if path not in PATHS:
            parser.error(f"--paths: unknown path {path!r} (one of {', '.join(PATHS)})")
        cpu, places = shares(path, args.requests, args.warmup, args.chunks)
        one = f"{cpu * 1e6:.0f} µs of CPU per request, one at a time in process"
        print(f"{path}: {one} ({args.requests} requests); shares:")
        for place, share in places:
            if share >= 0.005:
                print(f"  {share * 100:5.1f} %  {place}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
