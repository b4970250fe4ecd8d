"""`server.pin_workers`: each worker process, with every thread it starts, kept on a core of its own.

A worker's helper threads (the ledger's writer above all) take the interpreter's lock in turn with its
event loop; on another, busy core such a thread can be preempted while it holds the lock, and the loop
waits for it (docs/performance.md#the-ledger). Pinned, a worker and its threads share one core.

Cores are claimed, not counted: each worker takes the first core it may run on whose claim file, in the
directory `serve` makes (`CLAIMS_ENV`), no other worker holds locked. The lock lasts as long as the
worker, so a replacement for a dead one takes the core it freed; a worker that finds every core claimed
(more workers than cores) runs unpinned and says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
from collections.abc import Iterable

log = logging.getLogger("gateway")

# Where the workers of one `serve` claim their cores; set by `serve` before any worker starts.
CLAIMS_ENV = "GATEWAY_CORE_CLAIMS"

# The claim held by this process, (its file, the core): the file stays open (and locked) for the process's life.
_held: list[tuple[int, int]] = []


def claims_dir() -> str:
    """A new directory for one `serve`'s claims (the caller removes it when it exits)."""
    return tempfile.mkdtemp(prefix="gateway-cores-")


def claim(directory: str, cores: Iterable[int]) -> int | None:
    """The first of `cores` no other process holds in `directory`, now held by this one (the one it holds
    already, when it has claimed before: an app started twice in one process); None when all are held."""
    if _held:
        return _held[0][1]
    for core in cores:
        fd = os.open(os.path.join(directory, f"core-{core}"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        _held.append((fd, core))
        return core
    return None


def pin_worker() -> int | None:
    """In a worker at start-up, before it starts helper threads: claim a core and move every thread there.
    The core, or None when the platform cannot pin or every core is claimed (one WARNING line each)."""
    if not (hasattr(os, "sched_setaffinity") and os.path.isdir("/proc/self/task")):
        log.warning("server.pin_workers: this platform cannot pin a process to a core; the worker is not pinned")
        return None
    allowed = sorted(os.sched_getaffinity(0))
    directory = os.environ.get(CLAIMS_ENV)
    # Not started by `serve` (an embedded server): one process, with no sibling to share the cores with.
    core = claim(directory, allowed) if directory is not None and os.path.isdir(directory) else allowed[0]
    if core is None:
        log.warning(
            "server.pin_workers: every one of the %d cores this process may use is held by another worker; "
            "this worker (pid %d) is not pinned",
            len(allowed),
            os.getpid(),
        )
        return None
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended since the listing
            os.sched_setaffinity(int(tid), {core})
    log.info("worker (pid %d) pinned to core %d", os.getpid(), core)
    return core
