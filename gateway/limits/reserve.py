"""The reserve a batch's lines leave in shared buckets (`batches.quota_share`, docs/batches.md).

A line sees an alias's, a provider's or a deployment's bucket through a share (`Bucket.share`): the same
state as interactive requests charge, of which it may fill only that part, so the rest of each shared
bucket is always left to them. A share too small to hold one request still holds one (`Bucket.ceiling`,
`Bucket.room`): lines go through one at a time, each only while the bucket is otherwise empty, so a batch
always goes on; the config's load says which buckets do that.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from fractions import Fraction

import msgspec

from gateway.limits.gcra import TOKEN_KINDS, Bucket

log = logging.getLogger("gateway")


def shared_view(buckets: Sequence[Bucket], share: float) -> list[Bucket]:
    """`buckets` as a batch line sees them: the same state, of which it may fill `share`."""
    return [msgspec.structs.replace(b, share=share) for b in buckets]


def one_at_a_time(buckets: Sequence[Bucket]) -> Bucket | None:
    """The first request-rate or concurrency bucket whose share is less than one request, which lets lines
    through one at a time (a token bucket's share is checked against each line's tokens, as its limit is
    against a request's)."""
    for b in buckets:
        if b.share < 1 and b.kind not in TOKEN_KINDS and Fraction(repr(b.share)) * b.limit < 1:
            return b
    return None


def warn_one_at_a_time(scopes: Sequence[Sequence[Bucket]]) -> None:
    """One warning per scope whose share holds less than one request: its lines crawl, one at a time."""
    for buckets in scopes:
        slow = one_at_a_time(buckets)
        if slow is not None:
            log.warning(
                "batches.quota_share %g leaves batch lines less than one request of the %s limit of %d for %s: "
                "its lines go one at a time, each only while nothing else holds that bucket",
                slow.share,
                slow.kind,
                slow.limit,
                slow.scope,
            )
