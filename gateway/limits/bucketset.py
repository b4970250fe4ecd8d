"""A call's buckets, compiled once: what charging them needs that is the same on every call.

A gateway charges the same few sets of buckets over and over (a key's, with an alias's or a provider's),
so each set's Redis keys, periods, which of its buckets count tokens, and the constant bytes of its
script command are worked out the first time the set is seen, and only the lease and the costs are
written per call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from gateway.limits.gcra import TOKEN_KINDS, Bucket, spec
from gateway.limits.scriptchannel import Part, bulk

_NO_LEASE = bulk(b"")
# A Part made in C: the named tuple's own constructor is a Python function, a frame on every request.
_part: Final = tuple.__new__


def _cost(cost: float) -> bytes:
    # An int is the common case (every acquire); a float cost is written as the script has always read it.
    if type(cost) is int:
        digits = b"%d" % cost
    else:
        digits = b"%d" % cost if cost == int(cost) else repr(cost).encode()
    return b"$%d\r\n%b\r\n" % (len(digits), digits)


# The costs most calls carry (a request's 1, a token count that fits), written once.
_COSTS: Final = {n: _cost(n) for n in range(4096)}


class BucketSet:
    """`buckets` in order, with their `specs` (for the in-process arithmetic), `token_mask` (which ones a
    call's token count charges; the others take its request count), the concurrency buckets and the token
    buckets among them, and the script command (`command`) built from per-mode constant parts. A set with a
    bucket seen through a share (`Bucket.share`) acquires in the script's "share" mode."""

    __slots__ = (
        "_acquire",
        "_heads",
        "_prefix",
        "_sha",
        "buckets",
        "concurrent",
        "leased",
        "shared",
        "specs",
        "token_buckets",
        "token_mask",
        "tokens_only",
    )

    def __init__(self, buckets: Sequence[Bucket], prefix: str = "", sha: bytes = b"") -> None:
        self.buckets = tuple(buckets)
        self.specs = tuple(spec(b) for b in self.buckets)
        self.shared = any(b.share < 1 for b in self.buckets)  # acquired in "share" mode
        self.token_mask = tuple(b.kind in TOKEN_KINDS for b in self.buckets)
        self.token_buckets = tuple(b for b in self.buckets if b.kind in TOKEN_KINDS)
        self.concurrent = tuple(b for b in self.buckets if b.kind == "concurrent")
        self.leased = bool(self.concurrent)  # an acquire takes a lease, which needs an id
        self._prefix = prefix
        self._sha = sha
        self._heads: dict[str, tuple[bytes, bytes, bytes, tuple[bytes, ...]]] = {}
        self._acquire: tuple[bytes, bytes, int, tuple[bytes, ...]] | None = None
        # Its token buckets as a set of their own (what a settlement charges), compiled with it; None: none.
        self.tokens_only: BucketSet | None = None
        if self.token_buckets:
            whole = len(self.token_buckets) == len(self.buckets)
            self.tokens_only = self if whole else BucketSet(self.token_buckets, prefix, sha)

    def costs(self, tokens: int, requests: int) -> list[int]:
        return [tokens if t else requests for t in self.token_mask]

    def _head(self, mode: str) -> tuple[bytes, bytes, bytes, tuple[bytes, ...]]:
        # EVALSHA sha numkeys key... mode lease (kind limit period_ms cost)... : all but the lease and costs,
        # as the command's head through the key count, the keys, and the mode.
        n = len(self.buckets)
        single = b"*%d\r\n" % (3 + n + 2 + 4 * n) + bulk(b"EVALSHA") + bulk(self._sha) + bulk(b"%d" % n)
        keys = b"".join(bulk((self._prefix + b.redis_key).encode()) for b in self.buckets)
        if mode == "acquire" and self.shared:
            # The script's "share" mode: a rate bucket's ceiling in place of its kind, a concurrency bucket's
            # leases this view may find held as its limit (what the specs carry).
            per = tuple(
                bulk(b"concurrent" if s.kind == "concurrent" else b"%d" % s.cap)
                + bulk(b"%d" % s.limit)
                + bulk(b"%d" % s.period_ms)
                for s in self.specs
            )
            found = self._heads[mode] = (single, keys, bulk(b"share"), per)
            return found
        per = tuple(bulk(b.kind.encode()) + bulk(b"%d" % b.limit) + bulk(b"%d" % b.period_ms) for b in self.buckets)
        found = self._heads[mode] = (single, keys, bulk(mode.encode()), per)
        return found

    def part(self, mode: str, lease: str, costs: Sequence[float]) -> Part:
        """The script call for `mode` on these buckets, which the channel may merge with others."""
        single, keys, head, per = self._heads.get(mode) or self._head(mode)
        parts = [head, bulk(lease.encode()) if lease else _NO_LEASE]
        cached = _COSTS.get
        for static, cost in zip(per, costs, strict=True):
            parts.append(static)
            parts.append(cached(cost) or _cost(cost))  # type: ignore[call-overload]
        return Part(single, keys, len(per), b"".join(parts))

    def acquire_part(self, tokens: int) -> Part:
        """`part("acquire", "", costs(tokens, 1))`, the request path's call, from its constant segments: the
        arguments are those segments joined by the token count, the one thing that changes call to call."""
        single, keys, n, segments = self._acquire or self._acquire_segments()
        return _part(Part, (single, keys, n, (_COSTS.get(tokens) or _cost(tokens)).join(segments)))

    def _acquire_segments(self) -> tuple[bytes, bytes, int, tuple[bytes, ...]]:
        single, keys, head, per = self._heads.get("acquire") or self._head("acquire")
        segments: list[bytes] = []
        current = head + _NO_LEASE
        for static, token in zip(per, self.token_mask, strict=True):
            current += static
            if token:  # the token count goes here
                segments.append(current)
                current = b""
            else:
                current += _COSTS[1]
        segments.append(current)
        found = self._acquire = (single, keys, len(per), tuple(segments))
        return found

    def command(self, mode: str, lease: str, costs: Sequence[float]) -> bytes:
        """The script call for `mode` on these buckets, alone, as RESP bytes."""
        return self.part(mode, lease, costs).command()
