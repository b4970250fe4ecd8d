"""What ties a request to a replica: its prompt prefix or its session, hashed the same in every process.

The hash is blake2b of bytes taken from the request alone (never Python's salted `hash`), keyed by whom its
scope makes the request one of (gateway/fleet/tenancy.py; unkeyed when shared), so every gateway process, with
no coordination, maps the same tenant's prefix to the same point of the same ring.
"""

from __future__ import annotations

import bisect
import hashlib
import struct
from collections.abc import Mapping, Sequence
from typing import Final

from wire.chat import ChatRequest
from wire.messages import UserMessage, render
from wire.schema import CompletionRequest

# Ring points per unit of replica weight: enough that equal replicas get close to equal shares of keys.
POINTS_PER_WEIGHT: Final = 160
# The most points one ring holds (256 replicas of weight 1): past it every replica's points are scaled down
# alike, shares kept, so that placing them (at every config load, on the event loop) stays a fraction of a second.
MAX_POINTS: Final = 40_960
_SPAN: Final = 1 << 64


def digest(data: bytes, owner: bytes = b"") -> int:
    # An empty key is blake2b unkeyed: a shared scope hashes as before scopes were.
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, key=owner).digest(), "big")


def prefix_key(
    prompt: str | Sequence[object], block_chars: int, block_tokens: int, depth: int, owner: bytes = b""
) -> int:
    """The hash of the prompt's leading blocks: up to `depth` whole blocks (the whole prompt when it is
    shorter than one), of characters or of token ids, keyed by `owner` (the scope's digest; empty: shared by
    every caller). A batch is keyed by its first prompt."""
    first: object = prompt
    if not isinstance(prompt, str) and prompt and not isinstance(prompt[0], int):
        first = prompt[0]
    if isinstance(first, str):
        n = min(depth, len(first) // block_chars)
        text = first[: n * block_chars] if n else first
        return digest(b"t" + text.encode("utf-8", "surrogatepass"), owner)
    ids = [t for t in first if isinstance(t, int)] if isinstance(first, list | tuple) else []
    n = min(depth, len(ids) // block_tokens)
    head = ids[: n * block_tokens] if n else ids
    return digest(b"i" + struct.pack(f">{len(head)}q", *head), owner)


def prefix_of(req: CompletionRequest) -> str | Sequence[object]:
    """What a request's prefix key is taken from: its prompt; for a chat, its conversation up to its first
    user message. Every later turn of the conversation starts with that text, so its key, and its replica,
    stay the same as the conversation grows (the whole conversation's leading blocks would change with each
    turn until it is `depth` blocks long)."""
    if type(req) is not ChatRequest:
        return req.prompt
    messages = req.messages
    for i, m in enumerate(messages):
        if type(m) is UserMessage:
            return render(messages[: i + 1]) if i + 1 < len(messages) else req.prompt
    return req.prompt


def session_key(session: str, owner: bytes = b"") -> int:
    """The ring point of a session id, keyed by `owner` (the digest of a key's or team's identity; empty:
    shared by every caller)."""
    return digest(b"s" + session.encode("utf-8", "surrogatepass"), owner)


class Ring:
    """A consistent-hash ring over replicas, points placed by each replica's URL (stable across config order)."""

    __slots__ = ("mine",)

    def __init__(self, urls: Sequence[str], weights: Sequence[float]) -> None:
        scale = min(1.0, MAX_POINTS / max(1.0, POINTS_PER_WEIGHT * sum(weights)))
        # Each replica's own points, sorted: a key's replicas in ring order are found by one bisection per
        # replica, however unequal the weights (walking the points would pass every point of a heavy replica
        # before reaching a light one: a million steps per request for a large weighted fleet).
        self.mine = [
            sorted(
                digest(f"{url.rstrip('/')}#{v}".encode()) for v in range(max(1, round(POINTS_PER_WEIGHT * w * scale)))
            )
            for url, w in zip(urls, weights, strict=True)
        ]

    def walk(self, key: int) -> list[int]:
        """Every replica once, in the order met going clockwise from `key` (a point at `key` met first)."""

        def ahead(i: int) -> int:
            points = self.mine[i]
            j = bisect.bisect_left(points, key)
            return points[j] - key if j < len(points) else points[0] + _SPAN - key

        return sorted(range(len(self.mine)), key=ahead)


def session_of(req: CompletionRequest, headers: Mapping[str, str], header: str) -> str | None:
    return headers.get(header) or req.user or None
