"""Reading what an upstream says is left of its quota, from the headers of its successful answers.

When a counter reaches zero, the next request would be refused: the gateway cools the target until
the counter's reset (shared through Redis), so no replica sends it more until then. Formats:

    OpenAI, Fireworks, Azure   x-ratelimit-remaining-{requests,tokens}, x-ratelimit-reset-{requests,tokens}
                               as durations ("20ms", "1s", "6m0s")
    Together                   x-ratelimit-remaining, x-ratelimit-reset (seconds)
    Anthropic                  anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-remaining
                               and -reset (RFC 3339 timestamps)
    Mistral                    x-ratelimit-remaining-{req-10-second,tokens-minute,tokens-month}; the window
                               is in the name (no reset header)
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Mapping
from typing import Final

_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_MISTRAL_WINDOWS: Final = {"req-10-second": 10.0, "tokens-minute": 60.0, "tokens-month": 30 * 86400.0}
_ANTHROPIC_KINDS: Final = ("requests", "tokens", "input-tokens", "output-tokens")


def duration_s(value: str) -> float | None:
    """OpenAI's reset format ("6m0s", "20ms", "1.5s"), or plain seconds."""
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    parts = _DURATION.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        return None
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def _rfc3339_in(value: str, now: float) -> float | None:
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return max(when.timestamp() - now, 0.0)


def _zero(headers: Mapping[str, str], name: str) -> bool:
    value = headers.get(name)
    if value is None:
        return False
    try:
        return float(value) <= 0
    except ValueError:
        return False


def exhausted_for(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds until the upstream's exhausted counter resets; None when nothing is exhausted (or unknown)."""
    now = time.time() if now is None else now
    waits: list[float] = []
    for kind in ("requests", "tokens"):
        if _zero(headers, f"x-ratelimit-remaining-{kind}"):
            reset = headers.get(f"x-ratelimit-reset-{kind}")
            wait = duration_s(reset) if reset else None
            waits.append(wait if wait is not None else 1.0)
    if _zero(headers, "x-ratelimit-remaining"):
        reset = headers.get("x-ratelimit-reset")
        wait = duration_s(reset) if reset else None
        waits.append(wait if wait is not None else 1.0)
    for kind in _ANTHROPIC_KINDS:
        if _zero(headers, f"anthropic-ratelimit-{kind}-remaining"):
            reset = headers.get(f"anthropic-ratelimit-{kind}-reset")
            wait = _rfc3339_in(reset, now) if reset else None
            waits.append(wait if wait is not None else 1.0)
    for window, seconds in _MISTRAL_WINDOWS.items():
        if _zero(headers, f"x-ratelimit-remaining-{window}"):
            waits.append(seconds)
    positive = [w for w in waits if w > 0]
    return max(positive) if positive else None
