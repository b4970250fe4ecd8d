"""Child-process lifecycle and /proc accounting for the servers under test.

Every server is a child of the bench started in its own session, stopped by its own pid (and
that session's process group, so a gateway that forks workers leaves nothing behind). CPU time
and peak RSS are read from /proc for the whole process tree because ``--workers N`` moves the
work into children that the parent's own counters would not show.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

_CLK_TCK = os.sysconf("SC_CLK_TCK")
# /proc counts CPU in 10 ms ticks; shares over a shorter window are mostly rounding.
MIN_WINDOW_S = 1.0
# The bench talks to loopback only; an inherited http_proxy must never be consulted.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class StartupError(RuntimeError):
    """A server did not become ready; the message carries the tail of its log."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get_status(url: str, timeout: float = 1.0) -> int | None:
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return None


@dataclass
class Service:
    """A running child server."""

    name: str
    argv: list[str]
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes]
    cpu: int | None = None
    log_file: IO[bytes] | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def pids(self) -> list[int]:
        return process_tree(self.proc.pid)

    def pin(self, cpu: int | None) -> None:
        """Move every thread of the tree to one core (None: allow all cores)."""
        cpus = set(range(os.cpu_count() or 1)) if cpu is None else {cpu}
        for pid in self.pids():
            for tid in _threads(pid):
                try:
                    os.sched_setaffinity(tid, cpus)
                except OSError:
                    pass
        self.cpu = cpu

    def cpu_seconds(self) -> float:
        return sum(_cpu_seconds(pid) for pid in self.pids())

    def peak_rss_mib(self) -> float:
        return sum(_status_kib(pid, "VmHWM:") for pid in self.pids()) / 1024.0

    def rss_mib(self, pids: Sequence[int] | None = None) -> float:
        """Current resident memory of the tree (VmRSS): what it holds now, not its high-water mark."""
        return rss_mib(self.pids() if pids is None else pids)

    def stop(self, grace: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=grace)
        # Workers forked by the server share its process group (its own session, see start()).
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None


def start(
    name: str,
    argv: Sequence[str],
    port: int,
    log_dir: Path,
    ready_path: str = "/health",
    timeout: float = 30.0,
    env: dict[str, str] | None = None,
) -> Service:
    """Start ``argv`` and wait until GET ``ready_path`` answers 200, or raise StartupError."""
    log_path = log_dir / f"{name}.log"
    log_file = log_path.open("wb")
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )
    service = Service(name, list(argv), port, log_path, proc, log_file=log_file)
    deadline = time.monotonic() + timeout
    url = service.base_url + ready_path
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            service.stop()
            raise StartupError(f"{name} exited with code {proc.returncode}:\n{service.log_tail()}")
        if http_get_status(url, timeout=0.5) == 200:
            return service
        time.sleep(0.1)
    service.stop()
    raise StartupError(f"{name} not ready on {url} after {timeout:.0f}s:\n{service.log_tail()}")


def process_tree(root: int) -> list[int]:
    """``root`` and all its live descendants, found by scanning /proc for parent pids."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _read_stat(int(entry))
        if stat is not None:
            children.setdefault(int(stat[1]), []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        if _read_stat(pid) is None:
            continue
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def _read_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (index 0 is state, 1 is ppid)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses; everything after the last ')' is fixed.
    return raw[raw.rfind(")") + 2 :].split()


def user_system_seconds(pid: int) -> tuple[float, float]:
    """The process's user and system CPU seconds so far, every thread's; (0, 0) when it has gone."""
    stat = _read_stat(pid)
    if stat is None:
        return 0.0, 0.0
    # utime and stime are fields 14 and 15 of stat(5), i.e. 11 and 12 after the name.
    return int(stat[11]) / _CLK_TCK, int(stat[12]) / _CLK_TCK


def _cpu_seconds(pid: int) -> float:
    return sum(user_system_seconds(pid))


def tree_user_system_seconds(pids: Sequence[int]) -> tuple[float, float]:
    """The user and system CPU seconds of `pids` together (a server and its workers; one gone counts as
    nothing)."""
    times = [user_system_seconds(pid) for pid in pids]
    return sum(u for u, _ in times), sum(s for _, s in times)


def tree_switches(pids: Sequence[int]) -> tuple[int, int]:
    """The context switches of every thread of `pids` so far: (voluntary, involuntary). A voluntary one is a
    thread going to sleep with nothing to do (a loop waiting on its sockets); an involuntary one is the
    kernel taking its core for another process while it had work. A process that has gone counts as nothing."""
    voluntary = involuntary = 0
    for pid in pids:
        for tid in _threads(pid):
            v, i = _status_numbers(
                f"/proc/{pid}/task/{tid}/status", "voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:"
            )
            voluntary, involuntary = voluntary + v, involuntary + i
    return voluntary, involuntary


def rss_mib(pids: Sequence[int]) -> float:
    """Summed VmRSS of ``pids``; a pid that has gone counts as nothing."""
    return sum(_status_kib(pid, "VmRSS:") for pid in pids) / 1024.0


def _status_kib(pid: int, field: str) -> int:
    return _status_numbers(f"/proc/{pid}/status", field)[0]


def _status_numbers(path: str, *fields: str) -> list[int]:
    """The number after each of `fields` in a /proc status file, in order; 0 for one it lacks, and for
    every one when the process or thread has gone."""
    found = dict.fromkeys(fields, 0)
    try:
        for line in Path(path).read_text().splitlines():
            name, _, rest = line.partition("\t")
            if name in found:
                found[name] = int(rest.split()[0])
    except OSError:
        pass
    return list(found.values())


def _threads(pid: int) -> list[int]:
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


class CoreClock:
    """Per-core CPU shares between two snapshots of /proc/stat."""

    def __init__(self) -> None:
        self._start = self._snapshot()
        self._end: dict[str, tuple[int, int, int]] | None = None

    @staticmethod
    def _snapshot() -> dict[str, tuple[int, int, int]]:
        """core -> (all ticks, idle ticks, ticks spent running tasks: user + nice + system)."""
        result: dict[str, tuple[int, int, int]] = {}
        for line in Path("/proc/stat").read_text().splitlines():
            name, *values = line.split()
            if name.startswith("cpu") and name != "cpu":
                ticks = [int(v) for v in values]
                result[name] = (sum(ticks[:8]), ticks[3] + ticks[4], ticks[0] + ticks[1] + ticks[2])
        return result

    def stop(self) -> None:
        self._end = self._snapshot()

    def _shares(self, pick: int, invert: bool) -> dict[str, float]:
        end = self._end if self._end is not None else self._snapshot()
        shares: dict[str, float] = {}
        for name, now in end.items():
            before = self._start.get(name, now)
            span = now[0] - before[0]
            part = now[pick] - before[pick]
            if invert:
                part = span - part
            shares[name] = round(100.0 * part / span, 1) if span else 0.0
        return shares

    def busy_percent(self) -> dict[str, float]:
        """Everything but idle, interrupts included."""
        return self._shares(1, invert=True)

    def task_percent(self) -> dict[str, float]:
        """Time in processes only; softirq work of loopback networking is left out."""
        return self._shares(2, invert=False)


class Window:
    """One measured window: a service's CPU seconds, the wall time, and every core's busy share."""

    def __init__(self, service: Service) -> None:
        self._service = service
        self._cpu0 = service.cpu_seconds()
        self._bench0 = bench_cpu_seconds()
        self._clock = CoreClock()
        self._t0 = time.perf_counter()
        self.cpu_s = 0.0
        self.wall_s = 0.0
        self.busy: dict[str, float] = {}
        self._bench_s = 0.0
        self._tasks: dict[str, float] = {}

    def close(self) -> Window:
        self.cpu_s = self._service.cpu_seconds() - self._cpu0
        self._bench_s = bench_cpu_seconds() - self._bench0
        self.wall_s = time.perf_counter() - self._t0
        self._clock.stop()
        self.busy = self._clock.busy_percent()
        self._tasks = self._clock.task_percent()
        return self

    def other_load_pct(self) -> float | None:
        """CPU, in % of one core, that processes outside the bench used during the window.

        Anything here (another developer's test suite, say) competed with the servers under test,
        so the row is suspect. Task time only: loopback softirq work is not in any process's
        utime+stime and would otherwise count as foreign.
        """
        if self.wall_s < MIN_WINDOW_S:
            return None
        foreign = sum(self._tasks.values()) - 100.0 * self._bench_s / self.wall_s
        return round(max(0.0, foreign), 1)


def bench_cpu_seconds() -> float:
    """CPU seconds of this process, its reaped children (wrk runs) and its live descendants."""
    me = os.getpid()
    stat = _read_stat(me)
    own = 0.0
    if stat is not None:
        # Fields 14-17 of stat(5): utime, stime, and cutime, cstime of waited-for children.
        own = sum(int(v) for v in stat[11:15]) / _CLK_TCK
    return own + sum(_cpu_seconds(pid) for pid in process_tree(me) if pid != me)


def foreign_load_pct(seconds: float) -> float:
    """CPU (% of one core) used by processes outside the bench over the next ``seconds``."""
    bench0, clock, t0 = bench_cpu_seconds(), CoreClock(), time.perf_counter()
    time.sleep(seconds)
    clock.stop()
    own = 100.0 * (bench_cpu_seconds() - bench0) / (time.perf_counter() - t0)
    return max(0.0, sum(clock.task_percent().values()) - own)
