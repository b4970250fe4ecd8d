"""Reading a provider's "come back later" hint from response headers, in OpenAI's order of preference."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping


def retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds to wait: `retry-after-ms`, then `retry-after` as seconds or an HTTP date."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(float(ms) / 1000.0, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
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
