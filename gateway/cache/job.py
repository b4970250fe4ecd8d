"""What the cache reads of the pipeline's job (gateway/path/attempt.py `Job`) and of its answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from gateway.limits.admission import Ticket
from providers.base import CallContext
from wire.schema import CompletionRequest


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

__all__ = ["Answer", "J", "JobLike", "Make", "R"]
