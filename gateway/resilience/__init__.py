"""Surviving bad upstreams: the failover loop (retries, fallbacks, hedges), the balancer, target health
(cooldowns, shared through the state) and the evidence window that decides whether a failure cools one.

May import queue (an attempt its server's queue sent elsewhere), limits, upstream, fleet, ops and the base;
never emulation, cache, ledger, path or edge (a plan's value types live in `gateway.upstream.plan`).
"""
