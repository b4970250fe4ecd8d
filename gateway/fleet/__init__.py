"""A self-hosted provider served by several engine replicas: what its `replicas:` and `routing:` mean.

Owns the per-request choice among a provider's replicas (`Fleet.choose`: round robin, least outstanding,
prefix or session affinity, bounded loads, draining replicas left out), the hashes tying a prefix or a
session to a replica, the tenant scopes keying them and the engines' prefix-cache salt derived from them,
the drain flags (shared through Redis) and the background reader of the engines' own `/metrics`, the one
socket outside upstream (never a completion). The config blocks are
`gateway.config.fleet`; a `Route` carries its replicas, the balancer orders them, the edge serves the
drain routes (gateway/edge/drain.py). Nothing here runs unless a provider lists `replicas:`.

May import ops and the base (config, ids, state); never upstream, limits, emulation, resilience, path or
edge.
"""
