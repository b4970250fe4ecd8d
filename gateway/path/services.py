"""What the attempts of every request use, built once per pipeline: the upstream client, health, bounds."""

from __future__ import annotations

from gateway.config import CapsConfig
from gateway.resilience.health import Health
from gateway.upstream.client import Upstream


class Services:
    """What attempts use, built once per pipeline: the upstream client, health (quota headers), bounds."""

    __slots__ = ("upstream", "health", "caps", "guided_retries", "ignores_n")

    def __init__(self, upstream: Upstream, health: Health, caps: CapsConfig, guided_retries: int) -> None:
        self.upstream = upstream
        self.health = health
        self.caps = caps
        self.guided_retries = guided_retries
        # Targets seen answering fewer choices than `n` asked for (llama-cpp-python's server): a later
        # request with n > 1 fails there before its first byte, as an unstreamed one fails after the answer.
        self.ignores_n: set[str] = set()
