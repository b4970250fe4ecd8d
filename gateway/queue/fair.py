"""The order in which the requests waiting for one server get its next free slot.

Priority classes first: a `high` request always before a `normal` one, a `normal` before a `low` one (so
`low` runs only when nothing else waits). Within a class the Virtual Token Counter (Sheng et al., "Fairness
in Serving Large Language Models", OSDI 2024): each tenant's service is the tokens (prompt plus generated)
its requests used, divided by its weight, and the next slot goes to the waiting tenant with the least. A
tenant that starts waiting again is lifted to the least service among those already waiting (or to the last
served one's, when nobody waits), so time spent idle is not banked as credit.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Final

PRIORITIES: Final = ("high", "normal", "low")
RANK: Final = {"high": 0, "normal": 1, "low": 2}


class Waiter:
    """One request waiting for a slot: whose it is, its share, its class, and the future its slot comes in."""

    __slots__ = ("tenant", "weight", "rank", "cost", "future", "since")

    def __init__(
        self, tenant: str, weight: float, rank: int, cost: int, future: asyncio.Future[Any] | None, since: float
    ) -> None:
        self.tenant = tenant
        self.weight = weight
        self.rank = rank
        self.cost = cost  # the tokens charged when it gets its slot (an estimate, corrected at its end)
        self.future: asyncio.Future[Any] = future  # type: ignore[assignment]  # set before it is queued
        self.since = since


class FairOrder:
    """The waiters of one server by class and tenant, and every tenant's weighted service there."""

    __slots__ = ("classes", "service", "depth", "counts", "last", "turns", "turn")

    def __init__(self) -> None:
        # Per class: tenant -> its waiters, oldest first (a dict keeps tenants in arrival order for ties).
        self.classes: tuple[dict[str, deque[Waiter]], ...] = ({}, {}, {})
        # Tenant -> tokens served / weight. Bounded by the tenants there are (configured and runtime keys).
        self.service: dict[str, float] = {}
        self.depth = 0
        self.counts = [0, 0, 0]  # waiters per class
        self.last = 0.0  # the service of the tenant served last: the floor for a tenant nobody waits beside
        # Tenant -> the grant it last had: between equal services, the tenant served longest ago goes first
        # (a tenant that just started waiting, lifted to the others' service, does not queue behind them).
        self.turns: dict[str, int] = {}
        self.turn = 0

    def waiting(self, tenant: str) -> bool:
        return any(tenant in c for c in self.classes)

    def push(self, w: Waiter) -> None:
        tenant = w.tenant
        if not self.waiting(tenant):
            floor = min((self.service[t] for c in self.classes for t in c), default=self.last)
            self.service[tenant] = max(self.service.get(tenant, 0.0), floor)
        self.classes[w.rank].setdefault(tenant, deque()).append(w)
        self.depth += 1
        self.counts[w.rank] += 1

    def pop(self) -> Waiter | None:
        """The next waiter: of the highest class waiting, the one of its least-served tenant."""
        for rank, c in enumerate(self.classes):
            if c:
                service, turns = self.service, self.turns
                tenant = min(c, key=lambda t: (service.get(t, 0.0), turns.get(t, 0)))
                queue = c[tenant]
                w = queue.popleft()
                if not queue:
                    del c[tenant]
                self.depth -= 1
                self.counts[rank] -= 1
                return w
        return None

    def remove(self, w: Waiter) -> bool:
        """Take out a waiter that stopped waiting (its client left, its time ran out)."""
        c = self.classes[w.rank]
        queue = c.get(w.tenant)
        if queue is None:
            return False
        try:
            queue.remove(w)
        except ValueError:
            return False
        if not queue:
            del c[w.tenant]
        self.depth -= 1
        self.counts[w.rank] -= 1
        return True

    def grant(self, tenant: str, tokens: float, weight: float) -> None:
        """A slot went to `tenant`: charged its estimate, and stamped with its turn."""
        turn = self.turn = self.turn + 1
        self.turns[tenant] = turn
        served = self.service.get(tenant, 0.0) + tokens / weight  # `charge`, inline: every request passes here
        self.service[tenant] = served
        self.last = served

    def charge(self, tenant: str, tokens: float, weight: float) -> None:
        served = self.service.get(tenant, 0.0) + tokens / weight
        self.service[tenant] = served
        self.last = served

    def drain(self) -> list[Waiter]:
        """Every waiter, in no particular order, leaving the order empty (the gate is being replaced)."""
        out = [w for c in self.classes for q in c.values() for w in q]
        for c in self.classes:
            c.clear()
        self.depth = 0
        self.counts = [0, 0, 0]
        return out
