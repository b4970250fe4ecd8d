"""The config blocks of a fleet: `replicas:` and `routing:` on a self-hosted provider (typed, checked at load).

What they mean at run time is the fleet wing's (gateway/fleet); the blocks live here, with the rest of the
typed config, so that the config imports nothing above it.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Final, Literal

import msgspec
from msgspec import Meta

Policy = Literal["round_robin", "least_outstanding", "prefix", "session"]
# Whom a session id (`routing.session_scope`) or a prompt prefix and an engine's prefix cache (a provider's
# `prefix_scope`) is shared among: each key, each team, or every caller.
Scope = Literal["key", "team", "shared"]
# The most replicas one provider lists: each is a target per model, a reader task and a share of the ring.
MAX_REPLICAS: Final = 256


class ReplicaConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    # One engine replica: its base URL (what `base_url` would be for a single server).
    url: str
    # Its share under `round_robin` (a smooth weighted round robin) and of the prefix ring's points.
    weight: Annotated[float, Meta(gt=0, le=100)] = 1.0
    # Start draining: the replica takes no new requests (POST .../undrain to take it back).
    drain: bool = False
    # Requests in flight to this replica at most (over the provider's `max_concurrency`); others wait in the
    # gateway's fair queue (docs/fairness.md).
    max_concurrency: Annotated[int, Meta(ge=1, le=100_000)] | None = None


class RoutingConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    # Which replica serves a request (docs/fleets.md): `round_robin`, `least_outstanding` (fewest requests
    # in flight from this process), `prefix` (requests sharing a prompt prefix go to the same replica, for its
    # prefix cache) or `session` (the same `x-session-id` header, else `user`, sticks to one replica).
    policy: Policy = "round_robin"
    # Prefix policy: a text prompt's leading blocks are hashed, each this many characters.
    block_chars: Annotated[int, Meta(ge=1, le=1_000_000)] = 256
    # Prefix policy: a token prompt's leading blocks are hashed, each this many token ids.
    block_tokens: Annotated[int, Meta(ge=1, le=100_000)] = 16
    # Prefix policy: at most this many leading blocks are hashed (the whole prompt when shorter than one).
    depth: Annotated[int, Meta(ge=1, le=64)] = 4
    # Bounded loads (prefix and session): a replica holding (1 + epsilon) x the mean load (this request
    # counted) is passed over for the next one on the ring; when all are, the least loaded takes it.
    epsilon: Annotated[float, Meta(ge=0, le=100)] = 0.25
    # Read each replica's own load (vLLM's, SGLang's or llama.cpp's Prometheus `/metrics`) in the background
    # and steer new requests away from a replica whose waiting queue is at least `max_waiting`.
    engine_metrics: bool = False
    # How often each replica's `/metrics` is read (in the background, never on the request path). After a read
    # that gives no load, or one charged more than a quarter of `metrics_max_bytes` (its load is used for this
    # interval plus `metrics_timeout_ms`, then unknown), the next waits from its end, twice as long per such
    # read in a row, up to 30 s (or this interval when longer); a good read returns to this pace.
    metrics_interval_ms: Annotated[int, Meta(ge=50, le=600_000)] = 1_000
    # The longest one replica's `/metrics` read may take, connect to last byte; past it the read is dropped
    # and the replica's load is unknown (each replica is read on its own: a slow one delays no other).
    metrics_timeout_ms: Annotated[int, Meta(ge=50, le=60_000)] = 2_000
    # The most bytes of one exposition read, counted as they come off the socket (status line, headers, interim
    # answers, chunk framing and body, a piece of body as at least 1 KiB) and again once inflated (gzip); past
    # it the read stops and the replica's load is unknown. vLLM's is tens of kilobytes.
    metrics_max_bytes: Annotated[int, Meta(ge=4096, le=256 * 1024 * 1024)] = 4 * 1024 * 1024
    # A replica reporting at least this many waiting requests gets new ones only when no other can.
    max_waiting: Annotated[int, Meta(ge=1)] = 8
    # The header that names a session (lower case); the request's `user` field when it is absent.
    session_header: str = "x-session-id"
    # Whose session ids name the same session: `key` (each client key's ids are its own, so one key can neither
    # find nor crowd another's session), `team` (the keys of one team share them; a key without a team is a
    # team of its own) or `shared` (every caller's: the same id is the same session, whoever sends it).
    session_scope: Scope = "key"
    # With Redis: a drain flag stored for a replica URL that no running gateway has listed in this provider's
    # `replicas:` for this long is deleted (each gateway marks the URLs it lists every second), so flags of
    # replicas removed from the config go, while a gateway still listing one, during a rollout, keeps it.
    # At least 3 s: each gateway marks its URLs once a second, and a mark must not lapse between two.
    drain_forget_ms: Annotated[int, Meta(ge=3_000, le=30 * 86_400_000)] = 86_400_000


def replica_names(provider: str, replicas: list[str | ReplicaConfig]) -> list[str]:
    """Each replica's name, the provider part of its targets (`provider@i/model`), in metrics and logs."""
    return [f"{provider}@{i}" for i in range(len(replicas))]


def replica_url(r: str | ReplicaConfig) -> str:
    return r if isinstance(r, str) else r.url


def replica_tag(url: str) -> str:
    """A replica as the state it shares through Redis names it (`provider@<tag>`): by a hash of its URL, not by
    its position in `replicas:`, which a reload may change and another process may list otherwise."""
    return hashlib.blake2b(url.rstrip("/").encode(), digest_size=8).hexdigest()


def replica_weight(r: str | ReplicaConfig) -> float:
    return 1.0 if isinstance(r, str) else r.weight


def replica_drained(r: str | ReplicaConfig) -> bool:
    return False if isinstance(r, str) else r.drain


def replica_cap(r: str | ReplicaConfig, provider_cap: int | None) -> int | None:
    """A replica's own `max_concurrency`, else its provider's (None: no cap, no queue)."""
    own = None if isinstance(r, str) else r.max_concurrency
    return own if own is not None else provider_cap


def fleet_problem(
    name: str,
    replicas: list[str | ReplicaConfig],
    routing: RoutingConfig | None,
    base_url: str | None,
    serves_replicas: bool,
    kind: str,
    deployments: bool = False,
) -> tuple[str, str] | None:
    """The first thing wrong with a provider's `replicas:` / `routing:` blocks, as (YAML path, problem)."""
    where = f"providers.{name}"
    if not replicas:
        if routing is not None:
            return f"{where}.routing", "needs replicas:"
        return None
    if not serves_replicas:
        return f"{where}.replicas", f"kind '{kind}' is not a self-hosted engine that can run as replicas"
    if base_url:
        return f"{where}.base_url", "give either base_url or replicas, not both"
    if deployments:
        # A replica is one engine at one URL with the provider's key: a deployment's own URL or key would not be
        # where, or what, the replicas' requests use.
        return f"{where}.deployments", "give either deployments or replicas, not both"
    seen: set[str] = set()
    for i, r in enumerate(replicas):
        url = replica_url(r).rstrip("/")
        if not url.startswith(("http://", "https://")):
            return f"{where}.replicas[{i}]", f"must start with http:// or https://, got {url!r}"
        if url in seen:
            return f"{where}.replicas[{i}]", "the same URL is listed twice"
        seen.add(url)
    if routing is not None and routing.session_header != routing.session_header.lower():
        return f"{where}.routing.session_header", "must be lower case"
    return None
