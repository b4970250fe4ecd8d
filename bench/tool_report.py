"""What a measuring tool of bench/ (profile, cpusplit, redisload) reports: its markdown opens with the command
that ran it and when, and goes to `--out` or to stdout."""

from __future__ import annotations

import sys
import time
from pathlib import Path


def invoked(tool: str, argv: list[str] | None) -> str:
    """ "`python -m bench.TOOL ARGS` on DATE": what a report's first line names; `argv` None: this process's."""
    args = sys.argv[1:] if argv is None else argv
    return f"`python -m bench.{tool} {' '.join(args)}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"


def emit(text: str, out: Path | None, tool: str) -> None:
    """The report to `out`, saying so on stderr, or to stdout when no `--out` was given."""
    if out is None:
        print(text)
        return
    out.write_text(text)
    print(f"[{tool}] wrote {out}", file=sys.stderr)
