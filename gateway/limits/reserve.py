"""The reserve a batch's lines leave in shared buckets (`batches.quota_share`, docs/batches.md).

A line sees an alias's, a provider's or a deployment's bucket through a share (`Bucket.share`): the same
state as interactive requests charge, of which it may fill only that part, so the rest of each shared
bucket is always left to them. A bucket whose share holds not even one request would never let a line
through: its lines are refused at once (400), and the config's load says so.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import msgspec

from gateway.limits.gcra import TOKEN_KINDS, Bucket
from wire.errors import InvalidRequestError

log = logging.getLogger("gateway")


def shared_view(buckets: Sequence[Bucket], share: float) -> list[Bucket]:
    """`buckets` as a batch line sees them: the same state, of which it may fill `share`."""
    return [msgspec.structs.replace(b, share=share) for b in buckets]


def out_of_reach(buckets: Sequence[Bucket]) -> Bucket | None:
    """The first request-rate or concurrency bucket whose share holds not even one request (a token bucket's
    share is checked against each line's tokens, as its limit is against a request's)."""
    for b in buckets:
        if b.share < 1 and b.kind not in TOKEN_KINDS and b.room < 1:
            return b
    return None


def beyond_share(b: Bucket) -> InvalidRequestError:
    """The refusal of a line that `b` (`out_of_reach`) would never let through."""
    return InvalidRequestError(
        f"The {b.kind} limit of {b.limit} for {b.scope} leaves batch lines less than one request "
        f"(batches.quota_share {b.share:g}), so no line can be sent through it; raise the limit or the share",
        param="model",
        code="exceeds_request_limit",
    )


def warn_out_of_reach(scopes: Sequence[Sequence[Bucket]]) -> None:
    """One warning per scope whose share holds not even one request: every line through it is refused."""
    for buckets in scopes:
        never = out_of_reach(buckets)
        if never is not None:
            log.warning(
                "batches.quota_share %g leaves batch lines less than one request of the %s limit of %d for %s: "
                "its lines are refused (400 exceeds_request_limit)",
                never.share,
                never.kind,
                never.limit,
                never.scope,
            )
