"""The gateway: the HTTP app, the request path, limits, health and operations around the provider adapters.

One sub-package (a wing) per concern; `LAYERS` orders them top to bottom. A module imports its own wing
and the layers below it, never one above or a sibling of its layer (tests/unit/test_import_boundaries.py
checks every import, and that there is no import cycle). A new concern gets a wing of its own in this
list; each wing's `__init__` says what it owns. docs/architecture.md draws the picture.
"""

from typing import Final

LAYERS: Final[tuple[tuple[str, ...], ...]] = (
    ("gateway.__main__",),  # the command line: serve, check-config, docs
    ("gateway.edge",),  # the HTTP face: app, endpoints, tokenizer routes, rendering, status page, model listing
    ("gateway.batches",),  # the Batch API: files, batches and lines in the ledger's database, the runner
    ("gateway.path",),  # the request path: dialects, request folding, routing, pipeline, attempt, relay
    # failover, balancer, health, evidence | emulation, patterns, schemas | the response cache | the ledger
    ("gateway.resilience", "gateway.emulation", "gateway.cache", "gateway.ledger"),
    ("gateway.queue",),  # the fair wait queue of servers with max_concurrency: gates, slots, fair order
    ("gateway.limits",),  # keys, admission, rate limits, token estimates, usage
    ("gateway.upstream",),  # transports (h1, httpx), the upstream client, framing, scrubbing, plan values
    ("gateway.fleet",),  # replicas of a self-hosted engine: the policies, drain flags, engine load
    ("gateway.ops",),  # metrics, tracing, access log, reload, serving, .env file, the config-doc generator
    ("gateway.server",),  # the HTTP/1.1 protocol uvicorn runs per connection: parsing, keep-alive, answers
    ("gateway.config",),  # the typed config
    ("gateway.state", "gateway.ids"),  # the shared state (Redis or in-process), unique ids
    ("gateway.grace",),  # a wait past its time is given the loop's next read of its sockets before it fails
)
