"""One structured JSON line per request, on the `gateway.access` logger.

Fields: ts, request_id, dialect, key (the key's name, never its secret), model, provider, target,
status, latency_ms, upstream_ms, attempts, prompt_tokens, completion_tokens, stream, error (code).
The prompt and the completion text appear only when the config sets `logging.prompts: true`.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import msgspec

from gateway.metrics import Record

log = logging.getLogger("gateway.access")
_encode = msgspec.json.Encoder().encode


class JSONLines(logging.Handler):
    """Writes the record's message (already a JSON object) as one line, nothing around it."""

    def __init__(self, stream: Any = None) -> None:
        super().__init__()
        self.stream = stream or sys.stderr

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.stream.write(record.getMessage() + "\n")
            self.stream.flush()
        except Exception:  # noqa: BLE001 - logging must never take a request down
            self.handleError(record)


def configure() -> None:
    """Access lines go out as bare JSON lines, not through the root logger's text format."""
    if not any(isinstance(h, JSONLines) for h in log.handlers):
        log.addHandler(JSONLines())
    log.propagate = False
    log.setLevel(logging.INFO)


def line(rec: Record, elapsed_s: float) -> bytes:
    entry: dict[str, Any] = {
        "ts": round(time.time(), 3),
        "request_id": rec.request_id,
        "dialect": rec.dialect,
        "key": rec.key,
        "model": rec.model,
        "provider": rec.provider or None,
        "target": rec.target or None,
        "status": rec.status,
        "latency_ms": round(elapsed_s * 1000, 3),
        "upstream_ms": round(rec.upstream_s * 1000, 3),
        "attempts": rec.attempts,
        "prompt_tokens": rec.usage.prompt_tokens if rec.usage else None,
        "completion_tokens": rec.usage.completion_tokens if rec.usage else None,
        "stream": rec.stream,
        "error": rec.error_code,
    }
    if rec.prompt is not None:
        entry["prompt"] = rec.prompt
        entry["completion"] = rec.completion
    return _encode(entry)


def write(rec: Record, elapsed_s: float) -> None:
    if log.isEnabledFor(logging.INFO):
        log.info("%s", line(rec, elapsed_s).decode())
