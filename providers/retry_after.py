"""Reading a provider's "come back later" hint from response headers, in OpenAI's order of preference."""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Mapping


def retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds to wait: `retry-after-ms`, then `retry-after` as seconds or an HTTP date."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            seconds = float(ms) / 1000.0
        except ValueError:
            seconds = math.nan
        # `inf`/`nan` parse as floats but are no delay (and would break the client's retry-after header).
        if math.isfinite(seconds):
            return max(seconds, 0.0)
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


def should_retry(headers: Mapping[str, str]) -> bool | None:
    """The provider's explicit `x-should-retry: true|false`, if it sent one (OpenAI does)."""
    value = headers.get("x-should-retry")
    if value == "true":
        return True
    if value == "false":
        return False
    return None
