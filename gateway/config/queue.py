"""The config block of the fair wait queue: `queue:` (typed, checked at load).

What it means at run time is the queue wing's (gateway/queue, docs/fairness.md); the block lives here, with the
rest of the typed config, so that the config imports nothing above it.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta


class QueueWaitConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The longest wait of each priority class, over `queue.max_wait_ms`."""

    # The longest a `high` request waits; unset: `queue.max_wait_ms`.
    high: Annotated[int, Meta(ge=0, le=86_400_000)] | None = None
    # The longest a `normal` request waits; unset: `queue.max_wait_ms`.
    normal: Annotated[int, Meta(ge=0, le=86_400_000)] | None = None
    # The longest a `low` request waits (background work may wait longer); unset: `queue.max_wait_ms`.
    low: Annotated[int, Meta(ge=0, le=86_400_000)] | None = None
    # The longest a batch's line waits (it is then put back and sent again later, docs/batches.md); unset:
    # `low`'s, else `queue.max_wait_ms`.
    batch: Annotated[int, Meta(ge=0, le=86_400_000)] | None = None


class QueueConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The wait queue in front of servers with `max_concurrency` (docs/fairness.md); unused without one."""

    # The longest a request waits for a slot: past it, a 429 `queue_timeout` with Retry-After. The request's
    # own deadline (`timeout`, `inference_timeout`) counts its time in the queue too.
    max_wait_ms: Annotated[int, Meta(ge=0, le=86_400_000)] = 30_000
    # Per priority class: `{low: 600000}` lets background work wait longer.
    max_wait_by_priority: QueueWaitConfig = QueueWaitConfig()
    # Requests waiting for one server at most; one more is a 429 `queue_full` at once.
    max_depth: Annotated[int, Meta(ge=1, le=1_000_000)] = 1000
    # Who a saturated server's capacity is shared between: each client key, or each team (`keys[].team`;
    # keys without a team are each their own tenant).
    fair_by: Literal["key", "team"] = "key"
    # The share of each server's slots `low` requests and batch lines may hold at once (together): the rest
    # stay free for `normal` and `high` arrivals, which then start without waiting for one of them to end.
    # 1: they may fill the server when nothing else waits. At least one slot is always theirs.
    low_share: Annotated[float, Meta(gt=0, le=1)] = 1.0
    # The reserve holds while `normal` or `high` requests asked for the server within this time; after a
    # quiet spell `low` and batch lines may fill the server again, and the first interactive request waits for
    # a slot to free.
    low_share_hold_ms: Annotated[int, Meta(ge=1, le=3_600_000)] = 2_000
