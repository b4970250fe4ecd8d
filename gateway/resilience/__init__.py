"""Surviving bad upstreams: the failover loop (retries, fallbacks, hedges), the balancer and target health
(cooldowns, shared through the state).

May import limits, upstream, ops and the base; never path or edge (a plan's value types live in
`gateway.upstream.plan`).
"""
