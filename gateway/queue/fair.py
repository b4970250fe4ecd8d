"""The order in which the requests waiting for one server get its next free slot.

Priority classes first (`high`, `normal`, `low`, then `batch`, the Batch API's lines, below every class a
client may ask for: each runs only when no class above it waits). Within a
class the Virtual Token Counter (Sheng et al., OSDI 2024): the next slot goes to the waiting tenant with the
least service (tokens used / weight). A tenant that starts waiting again is lifted to the least service
among those waiting (or the last served one's), so idle time is not banked as credit.

A gateway sees generated tokens only at the end, so a request is charged an estimate at its grant (its
prompt and its tenant's recent answer length, within `max_tokens`) and corrected at its end: upward at once;
downward as credit off the tenant's next charge, so a waiting tenant's service never goes down and is not
overtaken by refunds of requests it has no part in (docs/fairness.md).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Final

PRIORITIES: Final = ("high", "normal", "low", "batch")
# The classes a client may ask for (`x-gateway-priority`, a key's `priority`).
RANK: Final = {"high": 0, "normal": 1, "low": 2}
# A batch's lines (gateway/batches): below any client's class, so a waiting interactive request, whatever its
# key's priority, always gets a free slot before them.
BATCH: Final = 3
# A tenant's expected answer length follows its last answers with this weight per answer (about its last eight).
_LEARN: Final = 0.125
# The most one request is charged for its answer before its usage is known, so one huge max_tokens cannot park
# a tenant.
MAX_CHARGE: Final = 32_768


class Waiter:
    """One request waiting for a slot: whose it is, its share, its class, and the future its slot comes in."""

    __slots__ = ("tenant", "weight", "rank", "most", "future", "since", "prompt")

    def __init__(
        self,
        tenant: str,
        weight: float,
        rank: int,
        most: int,
        future: asyncio.Future[Any] | None,
        since: float,
        prompt: int = 0,
    ) -> None:
        self.tenant = tenant
        self.weight = weight
        self.rank = rank
        self.most = most  # the most it may generate: what its charge at its grant is estimated within
        self.future: asyncio.Future[Any] = future  # type: ignore[assignment]  # set before it is queued
        self.since = since
        self.prompt = prompt  # its prompt's tokens, estimated


class FairOrder:
    """The waiters of one server by class and tenant, and every tenant's weighted service there."""

    __slots__ = (
        "classes",
        "service",
        "credit",
        "lengths",
        "misses",
        "expected",
        "depth",
        "counts",
        "last",
        "turns",
        "turn",
    )

    def __init__(self) -> None:
        # Per class: tenant -> its waiters, oldest first (a dict keeps tenants in arrival order for ties).
        self.classes: tuple[dict[str, deque[Waiter]], ...] = ({}, {}, {}, {})
        # Tenant -> tokens served / weight. Bounded by the tenants there are (configured and runtime keys), as
        # are `credit`, `lengths` and `turns`.
        self.service: dict[str, float] = {}
        # Tenant -> weighted tokens charged beyond what its ended requests used, owed back at its next charge.
        self.credit: dict[str, float] = {}
        # Tenant -> the generated tokens its recent answers here had: the estimate charged at a grant.
        self.lengths: dict[str, float] = {}
        # Tenant -> what the prompt estimate (a token per four bytes) missed of its recent prompts' real tokens,
        # as their answers' usage reported them: added to its charges, so a tenant of steady requests is
        # charged what they use and nothing needs correcting at their end.
        self.misses: dict[str, float] = {}
        # Tenant -> its length and miss as a charge adds them (rounded), kept with them: every grant reads them,
        # and they change only when an answer differs from its charge.
        self.expected: dict[str, tuple[int, int]] = {}
        self.depth = 0
        self.counts = [0, 0, 0, 0]  # waiters per class
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
            # Its credit is settled here, before it is compared with anyone: what lifting takes of it is gone.
            own = self.service.get(tenant, 0.0) - self.credit.pop(tenant, 0.0)
            self.service[tenant] = max(own, floor)
        self.classes[w.rank].setdefault(tenant, deque()).append(w)
        self.depth += 1
        self.counts[w.rank] += 1

    def head(self) -> int | None:
        """The highest class with a waiter (its rank), None when nobody waits."""
        for rank, c in enumerate(self.classes):
            if c:
                return rank
        return None

    def pop(self, most: int = BATCH) -> Waiter | None:
        """The next waiter: of the highest class waiting, the one of its least-served tenant; None when only
        classes ranked below `most` wait."""
        for rank, c in enumerate(self.classes):
            if rank > most:
                return None
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

    def displaced_by(self, tenant: str) -> Waiter | None:
        """With the queue full, whom a newcomer of `tenant` takes the place of: the newest waiter (of the lowest
        class) of the tenant with the most waiting, when that is more than `tenant` would have with the
        newcomer; None when `tenant` is (or would be) the heaviest, and the newcomer is the one refused. So
        one tenant filling the queue cannot keep the others out of it."""
        counts: dict[str, int] = {}
        for c in self.classes:
            for t, q in c.items():
                counts[t] = counts.get(t, 0) + len(q)
        if not counts:
            return None
        heaviest = max(counts, key=counts.__getitem__)
        if counts[heaviest] <= counts.get(tenant, 0) + 1:
            return None
        for c in reversed(self.classes):
            newest = c.get(heaviest)
            if newest:
                return newest[-1]
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

    def charge(self, tenant: str, prompt: int, most: int, weight: float) -> int:
        """A slot went to `tenant` for a request of `prompt` tokens that may generate at most `most`: the tokens
        it is charged (its prompt and its tenant's recent answers' length here, within `most` and `MAX_CHARGE`;
        `most` where the tenant has no answer here yet), less any credit, and its turn stamped. The charge is
        made at the grant, where the latest answers are known, and corrected by `settle` at its end."""
        known = self.expected.get(tenant)
        if known is None:
            tokens = prompt + (most if most < MAX_CHARGE else MAX_CHARGE)
        else:
            generated, miss = known
            if generated > most:
                generated = most
            tokens = prompt + (generated if generated < MAX_CHARGE else MAX_CHARGE)
            tokens += miss if miss > -prompt else -prompt  # max() without its call
        turn = self.turn = self.turn + 1
        self.turns[tenant] = turn
        charge = tokens / weight
        credit = self.credit.get(tenant) if self.credit else None  # none at all while estimates hold
        if credit is not None:
            if credit > charge:
                self.credit[tenant] = credit - charge
                charge = 0.0
            else:
                del self.credit[tenant]
                charge -= credit
        served = self.service.get(tenant, 0.0) + charge
        self.service[tenant] = served
        self.last = served
        return tokens

    def settle(self, tenant: str, charged: int, prompt: int, used: int, weight: float, real: int | None = None) -> None:
        """A request of `tenant` charged `charged` tokens (`prompt` of them for its prompt, as estimated) used
        `used`, `real` of them its prompt's as its answer reported (None: not reported, or not known)."""
        if used > 0:  # an attempt that ended without an answer (failed, lost a hedge, left) says nothing
            if real is not None and 0 <= real <= used:
                miss = real - prompt
                misses = self.misses
                known = misses.get(tenant)
                misses[tenant] = miss if known is None else known + (miss - known) * _LEARN
                generated = used - real
            else:
                generated = used - prompt if used > prompt else 0
            lengths = self.lengths
            length = lengths.get(tenant)
            lengths[tenant] = length = generated if length is None else length + (generated - length) * _LEARN
            miss_known = self.misses.get(tenant)
            self.expected[tenant] = (int(length + 0.5), 0 if miss_known is None else round(miss_known))
        if used > charged:
            self.service[tenant] = self.service.get(tenant, 0.0) + (used - charged) / weight
        elif used < charged:
            self.credit[tenant] = self.credit.get(tenant, 0.0) + (charged - used) / weight

    def drain(self) -> list[Waiter]:
        """Every waiter, in no particular order, leaving the order empty (the gate is being replaced)."""
        out = [w for c in self.classes for q in c.values() for w in q]
        for c in self.classes:
            c.clear()
        self.depth = 0
        self.counts = [0, 0, 0, 0]
        return out
