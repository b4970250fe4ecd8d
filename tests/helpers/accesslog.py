"""The access log as a test reads it: every JSON line the sink writes, decoded, while a test listens."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gateway.ops import accesslog


class Lines:
    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.raw: list[bytes] = []  # the lines as written, for a test of their exact text

    def __call__(self, line: bytes) -> None:
        self.lines.append(json.loads(line))
        self.raw.append(line)


@contextmanager
def listening() -> Iterator[Lines]:
    lines = Lines()
    accesslog.SINK.listeners.append(lines)
    try:
        yield lines
    finally:
        accesslog.SINK.listeners.remove(lines)
