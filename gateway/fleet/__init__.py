"""The fleet wing: a self-hosted provider served by several engine replicas.

It owns what a provider's `replicas:` and `routing:` mean: the replica targets a provider expands into
(`provider@i/model`, one health key, cooldown and circuit breaker each), the per-request choice among
them (round robin, least outstanding, prefix affinity, session affinity, all with bounded loads), the
draining flags and their admin routes, and the background reader of the engines' own load (`/metrics`).

It sits below the request path: it may import gateway.config, wire, providers and lower wings (the
upstream and limits modules), never the path or edge modules (pipeline, endpoint, app). The request path
calls into it through small hooks in routing (expansion), balancer (ordering) and app (admin routes,
the metrics poller's lifetime). Nothing here runs unless a provider lists `replicas:`.
"""
