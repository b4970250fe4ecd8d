"""What the gateway does for a provider that cannot: fan-out of `n`/`best_of`, stop sequences, echo,
guided choice, regex and JSON schema, with the client's patterns and schemas admitted and bounded.

`plan` (planning) bounds the work before any upstream call, `complete` (combine) folds buffered answers,
`stream` (streaming) merges sub-streams, `stops` finds the client's stop sequences. May import limits,
upstream, fleet, ops and the base; never path, resilience, cache, ledger or edge.
"""

from gateway.emulation.combine import complete
from gateway.emulation.planning import Call, Emulation, SubStream, plan, sub_requests
from gateway.emulation.stops import Folded, StopScanner, find_stop
from gateway.emulation.streaming import stream, to_chunks

__all__ = [
    "Call",
    "Emulation",
    "Folded",
    "StopScanner",
    "SubStream",
    "complete",
    "find_stop",
    "plan",
    "stream",
    "sub_requests",
    "to_chunks",
]
