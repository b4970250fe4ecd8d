"""A worker process ends with the server process that started it.

`serve --workers N` runs N workers under a supervisor (uvicorn's or Granian's). A supervisor killed without
stopping them (SIGKILL, the OOM killer) would leave them serving the port on their own, on the config they
started with, beside whatever is started next on it, and nothing would ever stop them. Each worker asks the
kernel for SIGTERM when its parent dies (Linux's PR_SET_PDEATHSIG), which drains it as `docker stop` would.
The supervisors start their workers from their main thread, whose end is the process's.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from typing import Final

_PR_SET_PDEATHSIG: Final = 1


def end_with_supervisor() -> bool:
    """In a worker a supervisor started: SIGTERM to this process when the supervisor dies (at once if it
    already has). False where there is no supervisor (one worker: the server is this process) or no way to
    ask (not Linux)."""
    parent = multiprocessing.parent_process()
    if parent is None or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent.pid:  # it died before the kernel was asked
        os.kill(os.getpid(), signal.SIGTERM)
    return True
