"""What the cache reads of the pipeline's job (gateway/path/attempt.py `Job`) and of its answers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from gateway.cache.entry import Entry
from gateway.cache.policy import Policy
from gateway.limits.admission import Ticket
from gateway.ops.metrics import Record
from providers.base import CallContext
from wire.schema import Completion, CompletionRequest


class JobLike(Protocol):
    """What the cache reads of the pipeline's job (gateway/path/attempt.py `Job`)."""

    req: CompletionRequest
    ctx: CallContext
    ticket: Ticket | None


class Answer(Protocol):
    headers: dict[str, str]


R = TypeVar("R", bound=Answer)
J = TypeVar("J", bound=JobLike)
Make = Callable[..., R]


class Storing(Protocol):
    """What `batch.store_batch` reads and sets of a request's `Lookup` (service.py)."""

    cache: Any  # the `Cache`, which service.py defines
    rec: Record
    policy: Policy | None
    tag: str
    keys: list[bytes]
    prompts: list[Any]
    n: int
    answer: Completion | None
    leading: bool
    result: list[Entry] | None
    waiter: asyncio.Future[Entry | None] | None


__all__ = ["Answer", "J", "JobLike", "Make", "R", "Storing"]
