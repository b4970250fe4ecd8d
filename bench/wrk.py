"""Driving wrk: a Lua script for the POST body and a machine-readable summary line.

wrk's human output rounds latencies and mixes units; the script's ``done`` hook prints one JSON
line with raw microsecond percentiles and error counts instead, which is what gets parsed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import msgspec

_MARKER = "BENCH_JSON "

_LUA = """
wrk.method = "POST"
wrk.body = [==[%(body)s]==]
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer bench-key"

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '%(marker)s{"requests":%%d,"duration_us":%%d,"bytes":%%d,"connect":%%d,"read":%%d,' ..
    '"write":%%d,"status":%%d,"timeout":%%d,"mean_us":%%.1f,"p50_us":%%d,"p90_us":%%d,' ..
    '"p99_us":%%d,"max_us":%%d}\\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency.mean, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max))
end
"""


class WrkSummary(msgspec.Struct):
    """The figures wrk's ``done`` hook reports; latencies in microseconds."""

    requests: int
    duration_us: int
    bytes: int
    connect: int
    read: int
    write: int
    status: int
    timeout: int
    mean_us: float
    p50_us: int
    p90_us: int
    p99_us: int
    max_us: int

    @property
    def errors(self) -> int:
        # wrk counts a non-2xx/3xx answer in "status" and still counts it as a request.
        return self.connect + self.read + self.write + self.status + self.timeout

    @property
    def rps(self) -> float:
        return self.requests / (self.duration_us / 1e6) if self.duration_us else 0.0


def find_wrk() -> str | None:
    return shutil.which("wrk")


def write_script(body: bytes, directory: Path, name: str) -> Path:
    text = body.decode()
    if "]==]" in text:
        raise ValueError("request body would end the Lua long string early")
    path = directory / f"{name}.lua"
    path.write_text(_LUA % {"body": text, "marker": _MARKER})
    return path


def run(
    url: str,
    script: Path,
    connections: int,
    duration_s: float,
    threads: int = 1,
    timeout_s: float = 5.0,
) -> WrkSummary:
    """Run one bounded wrk load and return its summary; raises RuntimeError if wrk fails."""
    binary = find_wrk()
    if binary is None:
        raise FileNotFoundError("wrk not found")
    argv = [
        binary,
        f"-t{threads}",
        f"-c{connections}",
        f"-d{max(1, round(duration_s))}s",
        f"--timeout={timeout_s:g}s",
        "--latency",
        "-s",
        str(script),
        url,
    ]
    # wrk stops on its own after -d; the extra margin only guards against a hung wrk.
    done = subprocess.run(argv, capture_output=True, text=True, timeout=duration_s + timeout_s + 30)
    for line in done.stdout.splitlines():
        if line.startswith(_MARKER):
            return msgspec.json.decode(line[len(_MARKER) :], type=WrkSummary)
    raise RuntimeError(f"wrk exited {done.returncode} without a summary:\n{done.stdout}\n{done.stderr}")


def version() -> str:
    binary = find_wrk()
    if binary is None:
        return "missing"
    done = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=10)
    first = (done.stdout or done.stderr).splitlines()
    return first[0].split(" Copyright")[0] if first else "unknown"
