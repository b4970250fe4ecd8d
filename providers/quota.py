"""Reading what an upstream says is left of its quota, from the headers of its successful answers.

When a counter reaches zero the gateway cools the target until the counter's reset (shared through
Redis). One reader per header format; each adapter lists the ones its provider sends (`quota_headers`).
The formats and which providers send them: docs/provider-notes.md#quota.
"""

from __future__ import annotations

import datetime as dt
import functools
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import re2

# (headers, now) -> seconds until the exhausted counter resets, or None when none is exhausted.
QuotaReader = Callable[[Mapping[str, str], float | None], float | None]

# The header value is the upstream's text (up to `caps.upstream_header_bytes`): on RE2, linear in it. On
# Python's `re` a run of digits without a unit costs its length squared (64 KiB: minutes of the loop).
_DURATION: Final[Any] = re2.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_MISTRAL_WINDOWS: Final = {"req-10-second": 10.0, "tokens-minute": 60.0, "tokens-month": 30 * 86400.0}
ANTHROPIC_LIMITS: Final = ("requests", "tokens", "input-tokens", "output-tokens")
# An exhausted counter without a usable reset: a short wait rather than none.
_UNKNOWN_RESET_S: Final = 1.0


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


def rfc3339(value: str) -> float | None:
    """An RFC 3339 timestamp as a Unix time (no zone: UTC), or None when it is not one."""
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def zero(headers: Mapping[str, str], name: str) -> bool:
    value = headers.get(name)
    if value is None:
        return False
    try:
        return float(value) <= 0
    except ValueError:
        return False


def _longest(waits: list[float]) -> float | None:
    positive = [w for w in waits if w > 0]
    return max(positive) if positive else None


def _duration_reset(headers: Mapping[str, str], name: str) -> float:
    reset = headers.get(name)
    wait = duration_s(reset) if reset else None
    return wait if wait is not None else _UNKNOWN_RESET_S


def openai_counters(headers: Mapping[str, str], now: float | None = None) -> float | None:
    # Read on every answer, and almost always neither counter is at zero: no comprehension, no `_longest`.
    waits: list[float] = []
    if zero(headers, "x-ratelimit-remaining-requests"):
        waits.append(_duration_reset(headers, "x-ratelimit-reset-requests"))
    if zero(headers, "x-ratelimit-remaining-tokens"):
        waits.append(_duration_reset(headers, "x-ratelimit-reset-tokens"))
    return _longest(waits) if waits else None


def single_counter(headers: Mapping[str, str], now: float | None = None) -> float | None:
    if not zero(headers, "x-ratelimit-remaining"):
        return None
    return _longest([_duration_reset(headers, "x-ratelimit-reset")])


def anthropic_resets(headers: Mapping[str, str]) -> list[tuple[float | None, bool]]:
    """Each Anthropic limit that sends a reset or a remaining count: (its reset as Unix time, exhausted)."""
    out: list[tuple[float | None, bool]] = []
    for limit in ANTHROPIC_LIMITS:
        reset = headers.get(f"anthropic-ratelimit-{limit}-reset")
        exhausted = zero(headers, f"anthropic-ratelimit-{limit}-remaining")
        if reset or exhausted:
            out.append((rfc3339(reset) if reset else None, exhausted))
    return out


def anthropic_counters(headers: Mapping[str, str], now: float | None = None) -> float | None:
    now = time.time() if now is None else now
    return _longest(
        [
            max(at - now, 0.0) if at is not None else _UNKNOWN_RESET_S
            for at, exhausted in anthropic_resets(headers)
            if exhausted
        ]
    )


def mistral_windows(headers: Mapping[str, str], now: float | None = None) -> float | None:
    return _longest([s for window, s in _MISTRAL_WINDOWS.items() if zero(headers, f"x-ratelimit-remaining-{window}")])


EVERY_FORMAT: Final[tuple[QuotaReader, ...]] = (openai_counters, single_counter, anthropic_counters, mistral_windows)


def exhausted_for(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds until an exhausted counter of any known format resets; None when nothing is exhausted (or unknown)."""
    now = time.time() if now is None else now
    return _longest([w for read in EVERY_FORMAT if (w := read(headers, now)) is not None])


# The headers each reader needs one of to find a counter at zero: an answer that has none of a provider's
# (a server that sends no counters) is read no further, without a call per reader.
_NEEDS: Final[dict[QuotaReader, tuple[str, ...]]] = {
    openai_counters: ("x-ratelimit-remaining-requests", "x-ratelimit-remaining-tokens"),
    single_counter: ("x-ratelimit-remaining",),
    anthropic_counters: tuple(f"anthropic-ratelimit-{limit}-remaining" for limit in ANTHROPIC_LIMITS),
    mistral_windows: tuple(f"x-ratelimit-remaining-{window}" for window in _MISTRAL_WINDOWS),
}


@functools.cache
def counter_names(readers: tuple[QuotaReader, ...]) -> tuple[str, ...] | None:
    """Every header `readers` may find a counter at zero in; None when one of them is not known here."""
    names: list[str] = []
    for read in readers:
        needs = _NEEDS.get(read)
        if needs is None:
            return None
        names += needs
    return tuple(names)
