"""Python load clients for what wrk cannot do: open-loop fixed rate, stream TTFB, many open
streams at once, preflight.

Latency at a fixed rate is timed from each request's *scheduled* send time, not its actual one,
so a server that stalls is charged for the queue it causes (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence

import aiohttp
import msgspec
import uvloop

HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer bench-key"}


class FixedRateResult(msgspec.Struct):
    sent: int
    ok: int
    errors: int
    duration_s: float
    achieved_rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    first_error: str | None = None


class TtfbResult(msgspec.Struct):
    streams: int
    errors: int
    events_per_stream: int
    ttfb_p50_ms: float
    ttfb_p90_ms: float
    ttfb_p99_ms: float
    total_p50_ms: float
    total_p90_ms: float
    first_error: str | None = None


class HoldResult(msgspec.Struct):
    streams: int
    completed: int
    errors: int
    # Most streams open at the same moment (answer headers in, end not yet reached).
    max_open: int
    events_min: int
    events_max: int
    ttfb_p50_ms: float
    ttfb_p99_ms: float
    total_p50_ms: float
    total_p99_ms: float
    rss_peak_mib: float
    rss_samples: int
    first_error: str | None = None


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile; returns NaN for an empty sample so a gap stays visible."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(pct / 100.0 * len(ordered)) - 1))
    return ordered[rank]


async def _fixed_rate(url: str, body: bytes, rate: float, count: int, warmup: int) -> FixedRateResult:
    # The pool must never be what queues requests in an open-loop test, so it is unbounded.
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=10)
    latencies: list[float] = []
    errors: list[str] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(scheduled: float, record: bool) -> None:
            try:
                async with session.post(url, data=body, headers=HEADERS) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"HTTP {response.status}")
            except Exception as exc:  # any failure is a data point, not a crash of the bench
                if record:
                    errors.append(f"{type(exc).__name__}: {exc}")
                return
            if record:
                latencies.append(time.perf_counter() - scheduled)

        tasks: list[asyncio.Task[None]] = []
        start = time.perf_counter() + 0.01
        total = warmup + count
        # Hard stop: schedule length plus one request timeout, whatever the server does.
        async with asyncio.timeout(total / rate + 15):
            for index in range(total):
                scheduled = start + index / rate
                delay = scheduled - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(scheduled, index >= warmup)))
            await asyncio.gather(*tasks)
        measured_start = start + warmup / rate
        duration = time.perf_counter() - measured_start
    ms = [value * 1000.0 for value in latencies]
    return FixedRateResult(
        sent=count,
        ok=len(latencies),
        errors=len(errors),
        duration_s=round(duration, 3),
        achieved_rps=round(len(latencies) / duration, 1) if duration > 0 else 0.0,
        p50_ms=percentile(ms, 50),
        p90_ms=percentile(ms, 90),
        p99_ms=percentile(ms, 99),
        max_ms=max(ms) if ms else float("nan"),
        first_error=errors[0] if errors else None,
    )


async def _ttfb(url: str, body: bytes, streams: int, warmup: int) -> TtfbResult:
    # One connection, one stream at a time: TTFB is a latency figure, not a throughput one.
    connector = aiohttp.TCPConnector(limit=1)
    timeout = aiohttp.ClientTimeout(total=30)
    ttfb: list[float] = []
    totals: list[float] = []
    events = 0
    errors: list[str] = []
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        # Hard stop for the whole series, so a stalled stream cannot hold the bench for long.
        asyncio.timeout(120),
    ):
        for index in range(warmup + streams):
            started = time.perf_counter()
            first: float | None = None
            buffer = bytearray()
            try:
                async with session.post(url, data=body, headers=HEADERS) as response:
                    if response.status != 200:
                        raise RuntimeError(f"HTTP {response.status}: {(await response.read())[:200]!r}")
                    async for chunk in response.content.iter_any():
                        if first is None and chunk:
                            first = time.perf_counter()
                        buffer += chunk
            except Exception as exc:  # any failure is a data point, not a crash of the bench
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            finished = time.perf_counter()
            if index < warmup or first is None:
                continue
            ttfb.append((first - started) * 1000.0)
            totals.append((finished - started) * 1000.0)
            events = bytes(buffer).count(b"data: ")
    return TtfbResult(
        streams=len(ttfb),
        errors=len(errors),
        events_per_stream=events,
        ttfb_p50_ms=percentile(ttfb, 50),
        ttfb_p90_ms=percentile(ttfb, 90),
        ttfb_p99_ms=percentile(ttfb, 99),
        total_p50_ms=percentile(totals, 50),
        total_p90_ms=percentile(totals, 90),
        first_error=errors[0] if errors else None,
    )


async def _hold(
    url: str, body: bytes, streams: int, expected_s: float, sample_rss: Callable[[], float], interval_s: float
) -> HoldResult:
    # Unlimited pool: every stream needs its own connection, and a cap here would queue them in the
    # client instead of holding them open in the server under test.
    connector = aiohttp.TCPConnector(limit=0)
    # Generous per stream (a loaded server streams slower than the upstream emits), but bounded.
    timeout = aiohttp.ClientTimeout(total=expected_s * 4 + 30, sock_connect=15)
    ttfb: list[float] = []
    totals: list[float] = []
    events: list[int] = []
    errors: list[str] = []
    open_now = max_open = 0
    peak = 0.0
    samples = 0
    running = True

    async def sampler() -> None:
        nonlocal peak, samples
        while running:
            peak = max(peak, sample_rss())
            samples += 1
            await asyncio.sleep(interval_s)

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal open_now, max_open
        started = time.perf_counter()
        first: float | None = None
        buffer = bytearray()
        try:
            async with session.post(url, data=body, headers=HEADERS) as response:
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}: {(await response.read())[:200]!r}")
                open_now += 1
                max_open = max(max_open, open_now)
                try:
                    async for chunk in response.content.iter_any():
                        if first is None and chunk:
                            first = time.perf_counter()
                        buffer += chunk
                finally:
                    open_now -= 1
        except Exception as exc:  # any failure is a data point, not a crash of the bench
            errors.append(f"{type(exc).__name__}: {exc}")
            return
        if first is None or b"data: [DONE]" not in buffer:
            errors.append(f"stream ended without [DONE] after {len(buffer)} bytes")
            return
        ttfb.append((first - started) * 1000.0)
        totals.append((time.perf_counter() - started) * 1000.0)
        events.append(bytes(buffer).count(b"data: "))

    # Hard stop for the whole hold, whatever the server does.
    limit_s = expected_s * 6 + 60
    watcher = asyncio.create_task(sampler())
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session, asyncio.timeout(limit_s):
            await asyncio.gather(*(one(session) for _ in range(streams)))
    except TimeoutError:
        errors.append(f"{streams - len(totals) - len(errors)} streams still unfinished after {limit_s:.0f} s")
    finally:
        running = False
        await watcher
    return HoldResult(
        streams=streams,
        completed=len(totals),
        # Counted from the total: streams cut off by the hard stop are failures too.
        errors=streams - len(totals),
        max_open=max_open,
        events_min=min(events, default=0),
        events_max=max(events, default=0),
        ttfb_p50_ms=percentile(ttfb, 50),
        ttfb_p99_ms=percentile(ttfb, 99),
        total_p50_ms=percentile(totals, 50),
        total_p99_ms=percentile(totals, 99),
        rss_peak_mib=round(peak, 1),
        rss_samples=samples,
        first_error=errors[0] if errors else None,
    )


def fixed_rate(url: str, body: bytes, rate: float, count: int, warmup: int) -> FixedRateResult:
    """Send ``warmup + count`` requests at ``rate``/s regardless of answers; report the last ``count``."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_fixed_rate(url, body, rate, count, warmup))


def stream_ttfb(url: str, body: bytes, streams: int, warmup: int) -> TtfbResult:
    """Time to first body byte and to end of stream, over sequential streams on one connection."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_ttfb(url, body, streams, warmup))


def hold_streams(
    url: str, body: bytes, streams: int, expected_s: float, sample_rss: Callable[[], float], interval_s: float = 0.1
) -> HoldResult:
    """Open ``streams`` streaming requests at once and read them to the end, sampling ``sample_rss``
    every ``interval_s`` meanwhile; the peak sample is the memory it takes to hold them all."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_hold(url, body, streams, expected_s, sample_rss, interval_s))


async def _preflight(url: str, body: bytes, stream: bool) -> str | None:
    timeout = aiohttp.ClientTimeout(total=10)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(url, data=body, headers=HEADERS) as response,
        ):
            raw = await response.read()
    except Exception as exc:  # reported to the user verbatim instead of a traceback
        return f"{type(exc).__name__}: {exc}"
    if response.status != 200:
        return f"HTTP {response.status}: {raw[:300].decode(errors='replace')}"
    if stream:
        if b"data: [DONE]" not in raw or raw.count(b"data: ") < 2:
            return f"not an SSE completion stream: {raw[:300].decode(errors='replace')}"
        return None
    try:
        decoded = msgspec.json.decode(raw)
        choice = decoded["choices"][0]
        # A completion carries `text`; a chat completion its message's `content`.
        text = choice["message"]["content"] if "message" in choice else choice["text"]
    except (msgspec.DecodeError, KeyError, IndexError, TypeError):
        return f"not a completion body: {raw[:300].decode(errors='replace')}"
    if not isinstance(text, str):
        return "completion text is not a string"
    return None


def preflight(url: str, body: bytes, stream: bool) -> str | None:
    """One request to prove a target answers correctly before load is put on it; None if it does."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_preflight(url, body, stream))
