"""The x-ratelimit headers of an admission: OpenAI's names, per label its tightest bucket, encoded once.

Read straight off the script's reply (or a decision's bucket states), so an answer's headers cost no
lookup of a value new on every answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from gateway.limits.gcra import Bucket, BucketState


def duration(ms: int) -> str:
    """OpenAI's reset format: `20ms`, `1.5s`, `6m0s`."""
    if ms < 1000:
        return f"{max(ms, 0)}ms"
    if ms < 60_000:
        return f"{ms / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    minutes, rest = divmod(ms, 60_000)
    return f"{minutes}m{rest // 1000}s"


_REQUEST_KINDS: Final = ("rps", "rpm")
_TOKEN_KINDS: Final = ("tpm", "tpd")
_REQUEST_NAMES: Final = (
    b"x-ratelimit-limit-requests",
    b"x-ratelimit-remaining-requests",
    b"x-ratelimit-reset-requests",
)
_TOKEN_NAMES: Final = (b"x-ratelimit-limit-tokens", b"x-ratelimit-remaining-tokens", b"x-ratelimit-reset-tokens")
# The x-ratelimit headers as the endpoint sends them (names and values encoded): made from the script's reply
# straight into bytes, they cost no encoding, no merge and no lookup of a value new on every answer.
Lines = list[tuple[bytes, bytes]]
# Per header label: its three names, then its buckets' places in a script reply (remaining, then reset) with
# their limits as header values, the first bucket's apart (most labels have one bucket).
Label = tuple[bytes, bytes, bytes, int, bytes, tuple[tuple[int, bytes], ...]]
# A reset under a second as `duration` writes it, for the resets most replies carry.
_MS: Final = tuple(b"%dms" % ms for ms in range(1000))


def labels_of(buckets: Sequence[Bucket]) -> tuple[Label, ...]:
    """What `reply_headers` reads of a set of buckets, worked out once per set."""
    labels: list[Label] = []
    for kinds, names in ((_REQUEST_KINDS, _REQUEST_NAMES), (_TOKEN_KINDS, _TOKEN_NAMES)):
        rows = [(2 + 2 * i, b"%d" % b.limit) for i, b in enumerate(buckets) if b.kind in kinds]
        if rows:
            labels.append((*names, *rows[0], tuple(rows[1:])))
    return tuple(labels)


def reply_headers(out: Sequence[int], labels: tuple[Label, ...]) -> Lines:
    """The x-ratelimit headers of a script reply `out`: per label, its tightest bucket's (the least
    remaining, then the longest reset, the first of equals)."""
    headers: Lines = []
    for limit_name, remaining_name, reset_name, at, limit, others in labels:
        remaining, reset = out[at], out[at + 1]
        for j, other in others:
            if out[j] < remaining or (out[j] == remaining and out[j + 1] > reset):
                limit, remaining, reset = other, out[j], out[j + 1]
        # GCRA's reset: when the bucket is full again (all of this scope's units available).
        headers += (
            (limit_name, limit),
            (remaining_name, b"%d" % remaining),
            (reset_name, _MS[reset] if 0 <= reset < 1000 else duration(reset).encode()),
        )
    return headers


def rate_headers(states: list[BucketState], labels: tuple[Label, ...] | None = None) -> Lines:
    """The x-ratelimit headers of a decision's bucket states, as `reply_headers` reads them off a reply;
    `labels`: their buckets' (`labels_of`), when the caller has them worked out already."""
    out = [0, 0]
    for s in states:
        out += (s.remaining, s.reset_ms)
    return reply_headers(out, labels_of([s.bucket for s in states]) if labels is None else labels)


def as_text(headers: Lines) -> dict[str, str]:
    """Encoded headers as text, for what builds its headers as text (an error's, a route off the hot path)."""
    return {name.decode("ascii"): value.decode("ascii") for name, value in headers}
