"""Driving wrk: a Lua script for the POST body and a machine-readable summary line.

The script's ``done`` hook prints one JSON line with raw microsecond percentiles and error counts, which is
what gets parsed; a ``response`` hook can stop the run at exactly N requests. Why that needs SIGINT:
docs/bench-harness.md.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import msgspec

_MARKER = "BENCH_JSON "
_STOPPED = "BENCH_STOPPED"

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


# Appended for a run where every request carries a prompt of its own: the body with the marked text
# prefixed by this script's nonce and a counter, so no two requests of any run share a prompt.
_VARY = """
local head, tail, n = [==[%(head)s]==], [==[%(tail)s]==], 0
request = function()
  n = n + 1
  return wrk.format(nil, nil, nil, head .. "%(nonce)s-" .. n .. " " .. tail)
end
"""


# Appended for a counted run. Answers already read in the same event-loop pass as the Nth one are
# still counted by wrk, so ``requests`` can exceed N by at most the connection count.
_STOP_AFTER = """
local answered = 0
response = function(status, headers, body)
  answered = answered + 1
  if answered == %(count)d then
    wrk.thread:stop()
    io.stdout:write("%(stopped)s\\n")
    io.stdout:flush()
  end
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


def write_script(
    body: bytes, directory: Path, name: str, stop_after: int | None = None, vary: str | None = None
) -> Path:
    """Write the Lua script; with ``stop_after`` wrk stops by itself after that many answers (use -t1).

    With ``vary`` (a text in the body), each request's copy of that text gets a unique prefix.
    """
    text = body.decode()
    if "]==]" in text:
        raise ValueError("request body would end the Lua long string early")
    path = directory / f"{name}.lua"
    script = _LUA % {"body": text, "marker": _MARKER}
    if stop_after is not None:
        if stop_after < 1:
            raise ValueError("stop_after must be at least 1")
        script += _STOP_AFTER % {"count": stop_after, "stopped": _STOPPED}
    if vary is not None:
        head, found, rest = text.partition(vary)
        if not found:
            raise ValueError(f"{vary!r} is not in the request body")
        script += _VARY % {"head": head, "tail": vary + rest, "nonce": f"{time.time_ns():x}"}
    path.write_text(script)
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
    limit_s = duration_s + timeout_s + 30
    output: list[str] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        watchdog = threading.Timer(limit_s, proc.kill)
        watchdog.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.rstrip("\n") == _STOPPED:
                    # The script reached its count: end wrk's -d sleep now (see the module docstring).
                    proc.send_signal(signal.SIGINT)
                else:
                    output.append(line)
            code = proc.wait()
        except BaseException:
            # Interrupted (SIGTERM to the bench): Popen's exit would otherwise wait out wrk's whole -d.
            proc.kill()
            raise
        finally:
            watchdog.cancel()
    for line in output:
        if line.startswith(_MARKER):
            return msgspec.json.decode(line[len(_MARKER) :].strip(), type=WrkSummary)
    killed = f" (killed after {limit_s:.0f} s)" if code == -signal.SIGKILL else ""
    raise RuntimeError(f"wrk exited {code}{killed} without a summary:\n{''.join(output)}")


def version() -> str:
    binary = find_wrk()
    if binary is None:
        return "missing"
    done = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=10)
    first = (done.stdout or done.stderr).splitlines()
    return first[0].split(" Copyright")[0] if first else "unknown"
