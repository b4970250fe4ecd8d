"""The fair wait queue in front of servers with `max_concurrency` (docs/fairness.md).

`fair` orders the requests waiting for one server (priority classes, then the Virtual Token Counter among
tenants); `gate` holds one server's slots (per process, or leases in Redis shared by every replica) and its
waiters; `service` builds the gates from the config, says which gate an attempt passes and who asks.

Sits below the request path (which calls it once per attempt) and above limits, whose concurrency leases
hold a slot across processes.

May import limits, upstream, fleet, ops and the base; never resilience, emulation, cache, ledger, path or edge.
"""
