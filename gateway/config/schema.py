"""The config's typed blocks: every key the YAML may hold, its type, bounds and default.

The comment above a field is its meaning in docs/config.md (gateway/ops/configdoc.py reads it). Loading a
file, resolving `${VAR}` references and the checks across blocks: gateway/config/loading.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

from gateway.config.caps import CapsConfig
from gateway.config.fleet import MAX_REPLICAS, ReplicaConfig, RoutingConfig, Scope
from gateway.config.queue import QueueConfig
from wire.schema import MAX_LOGPROBS

ParamPolicy = Literal["error", "drop"]


class Strict(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    pass


# A budget in USD: a billion at most (larger, or `.inf`, is refused where it is given). Spend counts in 64-bit
# picodollars, which stop at about $9.2 million: a budget above that may never be reached (docs/ledger.md).
BudgetUsd = Annotated[float, Meta(ge=0, le=1e9)]
# A key's or a team's share of a saturated server. At least a thousandth: the fair queue charges tokens / weight,
# and a weight near zero (5e-324) charges infinity, which lifts every tenant after it to an infinite service and
# so ends the weighted order for all of them (docs/fairness.md).
WEIGHT_MIN: Final = 0.001
FairWeight = Annotated[float, Meta(ge=WEIGHT_MIN, le=10_000)]


class ServerConfig(Strict, frozen=True):
    host: str = "127.0.0.1"
    port: Annotated[int, Meta(ge=0, le=65535)] = 8080
    workers: Annotated[int, Meta(ge=1, le=64)] = 1
    # On SIGTERM: stop accepting, let open requests and streams finish for up to this long, then cancel them.
    shutdown_grace_ms: Annotated[int, Meta(gt=0)] = 30_000
    # Each worker and every thread it starts on a core of its own (Linux), for hosts whose cores are all busy.
    pin_workers: bool = False


class RedisConfig(Strict, frozen=True):
    # Empty: state lives in process memory, which is only correct for a single process. One node
    # (redis://, rediss://, unix://), a Cluster (redis+cluster://h:p,h:p) or Sentinel
    # (redis+sentinel://h:p,h:p/service); options the gateway cannot honour are refused at load.
    url: str = ""
    # Rate limits while Redis is unreachable: keep serving on per-process limits, or refuse (503).
    on_failure: Literal["fail_open", "fail_closed"] = "fail_open"
    # How old a replica's copy of the shared target health (cooldowns, in-flight counts, latencies) may be
    # before it reads Redis again; its own changes are seen at once. 0: read on every request. A request
    # that finds the copy past three quarters of this age starts the read without waiting for it.
    refresh_ms: Annotated[int, Meta(ge=0, le=10_000)] = 250
    # How long a concurrency lease, and a target's shared in-flight count, outlive a replica that died holding
    # them (killed mid-request). A running request renews both every third of this, so a stream of any
    # length keeps its slot and its count.
    lease_ttl_ms: Annotated[int, Meta(ge=1_000, le=86_400_000)] = 600_000


# A rate at most this (a trillion per period): more limits nothing, and a number past a float's range would fail
# every request of the key at admission.
RATE_MAX: Final = 10**12
# The longest a request may wait for room (a day): a client has long gone by then, and a larger wait would only
# hold its connection and its queue slot.
QUEUE_MAX_MS: Final = 86_400_000


class LimitsConfig(Strict, frozen=True):
    rps: Annotated[int, Meta(ge=1, le=RATE_MAX)] | None = None
    rpm: Annotated[int, Meta(ge=1, le=RATE_MAX)] | None = None
    tpm: Annotated[int, Meta(ge=1, le=RATE_MAX)] | None = None
    tpd: Annotated[int, Meta(ge=1, le=RATE_MAX)] | None = None
    concurrent: Annotated[int, Meta(ge=1, le=RATE_MAX)] | None = None
    # Wait up to this long for room instead of answering 429 at once.
    max_queue_ms: Annotated[int, Meta(ge=0, le=QUEUE_MAX_MS)] = 0


class TimeoutsConfig(Strict, frozen=True):
    connect_ms: Annotated[int, Meta(gt=0)] = 5_000
    first_byte_ms: Annotated[int, Meta(gt=0)] = 120_000
    total_ms: Annotated[int, Meta(gt=0)] = 600_000
    # A stream's time since its last event that carried anything for the client, looked at when a keep-alive or
    # an ignored event comes (silence alone is `first_byte_ms`'s). Unset: `first_byte_ms`, so keep-alives buy a
    # stream no more time than silence would.
    stream_idle_ms: Annotated[int, Meta(gt=0)] | None = None


class LoggingConfig(Strict, frozen=True):
    # One JSON line per request, to stderr (gateway/ops/accesslog.py).
    requests: bool = True
    # Include the prompt and the completion text in that line (off: they may hold personal data).
    prompts: bool = False


class RetriesConfig(Strict, frozen=True):
    # Upstream calls per request, across all of its targets and fallbacks (1 = no retry).
    attempts: Annotated[int, Meta(ge=1, le=20)] = 3
    initial_backoff_ms: Annotated[int, Meta(ge=0)] = 250
    max_backoff_ms: Annotated[int, Meta(ge=0)] = 8_000
    # No retry starts once its wait would carry the request past this much time since it arrived.
    budget_ms: Annotated[int, Meta(gt=0)] = 30_000
    # Retries of the SAME target (after its Retry-After, else backoff) before the request moves on, for a
    # transient failure: a 5xx, a dropped connection, a 429 whose wait fits the budget. So the answer comes
    # from the model asked for when it can. Timeouts, unreachable targets, exhausted quotas, a 404 and
    # context-window errors always move on at once. 0: every failure moves on at once (docs/resilience.md).
    # Unset: an alias's targets each take their provider's value, else the global one, else 1.
    same_target: Annotated[int, Meta(ge=0, le=10)] | None = None


def same_target_of(*blocks: RetriesConfig | None) -> int:
    """The first `same_target` set among these `retries` blocks (most specific first); 1 when none is."""
    return next((b.same_target for b in blocks if b is not None and b.same_target is not None), 1)


class CooldownConfig(Strict, frozen=True):
    base_ms: Annotated[int, Meta(gt=0)] = 1_000
    # Also the longest a target stays off after an outage ends (its probe follows the cooldown at once).
    max_ms: Annotated[int, Meta(gt=0)] = 20_000
    # A 5xx or a timeout may be the request's own doing (an input the upstream cannot take): it cools the
    # target only once this many distinct requests failed on it within `window_ms`, at least `failure_ratio`
    # of those it answered, and of every client key's own requests to it.
    min_requests: Annotated[int, Meta(ge=1)] = 3
    failure_ratio: Annotated[float, Meta(gt=0, le=1)] = 0.5
    window_ms: Annotated[int, Meta(gt=0)] = 10_000


Strategy = Literal["weighted", "ordered", "least-busy", "latency"]
Priority = Literal["high", "normal", "low"]


class KeyConfig(Strict, frozen=True):
    name: str
    key: str
    # Glob patterns over the model string the client sends (`openai/*`, `fast`); `*` stops at `/`, `**`
    # crosses it (gateway/limits/globs.py), so the default allows every model.
    models: list[str] = msgspec.field(default_factory=lambda: ["**"])
    limits: LimitsConfig | None = None
    # Rate limits of this key's batch lines in place of `batches.limits` (the same buckets of their own, never
    # its `limits`): a big evaluation team's key may send more, a small one's less. `{}`: none for this key.
    # Unset: `batches.limits`.
    batch_limits: LimitsConfig | None = None
    # USD per UTC day (gateway/limits/usage.py): at or over it, requests answer 429 `budget_exceeded`. 0 blocks the key.
    max_cost_per_day: BudgetUsd | None = None
    # USD per UTC calendar month: at or over it, requests answer 429 `budget_exceeded` until the 1st (without a
    # ledger checked against the month's booked spend, docs/operations.md; with one reserved, docs/ledger.md).
    max_cost_per_month: BudgetUsd | None = None
    # A team groups keys in the ledger's rows, rollups and reports, and shares its `teams:` budgets and rate
    # limits. It must be declared under `teams:` (`{}` when it only groups), so a misspelt team is refused rather
    # than budgetless.
    team: str | None = None
    # This key's share of a saturated server against the other keys waiting (`queue.fair_by: key`; docs/fairness.md).
    weight: FairWeight = 1.0
    # The priority of a request without an `x-gateway-priority` header; unset: the team's, else `normal`.
    priority: Priority | None = None
    # The highest priority this key may ask for; unset: the team's, else `normal` (a higher ask is a 403).
    max_priority: Priority | None = None


class TeamConfig(Strict, frozen=True):
    # USD per UTC day for all the team's keys together: at or over it, each of them answers 429 `budget_exceeded`
    # (with or without a ledger, as a key's own budgets: docs/operations.md, docs/ledger.md).
    max_cost_per_day: BudgetUsd | None = None
    # USD per UTC calendar month for all the team's keys together.
    max_cost_per_month: BudgetUsd | None = None
    # Rate limits for all the team's keys together (YAML and runtime keys alike), checked with each key's own
    # in the same admission: over them, any of its keys answers 429 naming the team (`x-gateway-team`). Batch
    # lines count too, filling at most `batches.quota_share` of each (docs/ratelimits.md#team-limits). Unset: none.
    limits: LimitsConfig | None = None
    # The team's share of a saturated server against the other teams waiting (`queue.fair_by: team`).
    weight: FairWeight = 1.0
    # The `priority` of the team's keys that set none.
    priority: Priority | None = None
    # The `max_priority` of the team's keys that set none.
    max_priority: Priority | None = None
    # Globs every key of the team is held to, in a key's `models` syntax: a request may name a model only when its
    # key's `models` and these both match it (docs/security.md#team-models). `**`: no ceiling.
    models: list[str] = msgspec.field(default_factory=lambda: ["**"])
    # Runtime keys the team may hold (not revoked; an expired one until it is) and make in any 24 hours, when its
    # admin makes one more: past either, a 409 `too_many_keys` (the operator's admin key is not held to it). Each
    # key in force is held in every replica's memory with batch quotas of its own, and a revoked one stays in the
    # ledger (docs/security.md#admin-roles).
    max_keys: Annotated[int, Meta(ge=0, le=1_000_000)] = 1_000
    # Bytes of files (uploads and batch results) all the team's keys (YAML and runtime) may keep at once, over and
    # above each key's `batches.max_key_bytes`: past it, an upload of any of them is a 409 naming it (a batch's
    # results are stored whole even past it; docs/batches.md#a-teams-storage).
    # As one key's by default, so making more keys buys a team no more of the ledger's disk.
    max_batch_bytes: Annotated[int, Meta(ge=1024, le=1 << 40)] = 10 * 1024 * 1024 * 1024
    # Files (uploads and batch results) all the team's keys may keep at once, over and above each key's
    # `batches.max_files`: past it, an upload is a 409. As one key's by default.
    max_batch_files: Annotated[int, Meta(ge=1, le=100_000)] = 1_000
    # This team's own admin key (normally a `${VAR}`, as `admin.key`): it makes, lists, rotates and revokes the
    # team's runtime keys, reads the team's usage and status (the status page too) and lists and cancels its keys'
    # batches, nothing else (docs/security.md#admin-roles). Empty or unset: the team has no admin of its own.
    admin_key: str = ""


class LedgerConfig(Strict, frozen=True):
    # Where every answered request is booked (docs/ledger.md): `sqlite:///<path>` (a file, relative to the
    # working directory; `sqlite:////abs/path` for an absolute one) or `postgresql://...`; empty: no ledger.
    # `ledger.*` is read at start: a reload that changes it keeps the running ledger and logs a WARNING.
    url: str = ""
    # The writer commits a batch every `flush_ms`, or sooner once `batch_rows` rows wait.
    flush_ms: Annotated[int, Meta(ge=10, le=60_000)] = 1_000
    # Rows that wake the writer before `flush_ms` has passed; at most `queue_rows`.
    batch_rows: Annotated[int, Meta(ge=1, le=100_000)] = 500
    # Rows waiting in memory at most (a kill -9 loses at most these); beyond it rows are counted and dropped.
    queue_rows: Annotated[int, Meta(ge=1, le=10_000_000)] = 100_000
    # While the database is down, batches go to this file (default: beside a SQLite file, else the
    # working directory); they are replayed, once, when it answers again.
    spill_dir: str = ""
    # Each process's spill file's size at most; rows beyond it (or that it cannot take: a disk full) are counted
    # (gateway_ledger_spill_lost_rows) and logged once per outage.
    spill_bytes: Annotated[int, Meta(ge=4096)] = 256 * 1024 * 1024
    # How often each replica reads the runtime keys' version (a new, rotated or revoked key applies within it).
    keys_poll_ms: Annotated[int, Meta(ge=50, le=2_000)] = 500
    # Rows older than this many days are removed in bounded batches; unset: kept for ever. At most a century
    # (the cut-off must be a calendar date).
    retention_days: Annotated[int, Meta(ge=1, le=36_500)] | None = None
    # How long the gateway waits for the database (a lock, a stalled server) before it counts as unavailable:
    # the admin routes answer 503 with Retry-After, budgets count from what is known, rows are spilled.
    timeout_ms: Annotated[int, Meta(ge=100, le=60_000)] = 2_000


class BatchesConfig(Strict, frozen=True):
    """The Batch API (docs/batches.md): needs `ledger:`, whose database holds files, batches and lines."""

    # Lines one gateway process has in flight at once, over every batch it runs.
    concurrency: Annotated[int, Meta(ge=1, le=10_000)] = 32
    # Lines one input file may hold; a batch over a longer file fails at validation, naming the first line over.
    max_lines: Annotated[int, Meta(ge=1, le=1_000_000)] = 50_000
    # Bytes one uploaded file may hold (the upload is refused with 413 beyond it; a batch of a file stored
    # before a reload lowered it fails at validation, naming the first line over).
    max_file_bytes: Annotated[int, Meta(ge=1024, le=1024 * 1024 * 1024)] = 100 * 1024 * 1024
    # Files one key may keep at once (uploads and batch results); one more is refused with 409.
    max_files: Annotated[int, Meta(ge=1, le=100_000)] = 1_000
    # Bytes of files (uploads and batch results) one key may keep at once (the ledger's disk is every tenant's):
    # past it an upload is refused with 409; a batch's results are stored whole even past it.
    max_key_bytes: Annotated[int, Meta(ge=1024, le=1 << 40)] = 10 * 1024 * 1024 * 1024
    # Batches one key may have not ended yet (each holds a copy of its file's lines); one more is refused with 409.
    max_batches: Annotated[int, Meta(ge=1, le=100_000)] = 100
    # How long a process holds a batch without renewing its lease; after it, another process takes it over
    # (on PostgreSQL the server also ends a Batch API session idle in a transaction this long: a stalled one).
    lease_ms: Annotated[int, Meta(ge=1_000, le=3_600_000)] = 30_000
    # How often each process looks for batches to run (new, or whose runner's lease ran out).
    poll_ms: Annotated[int, Meta(ge=50, le=60_000)] = 1_000
    # Files and finished batches older than this many days are deleted, with their lines.
    retain_days: Annotated[int, Meta(ge=1, le=3_650)] = 30
    # Rate limits of each key's batch lines, in buckets of their own: a key's `limits` are its interactive
    # traffic's, and its lines never count toward them. A line over these waits and is sent again, never
    # refused for them. Unset: none (a key's lines are bounded by `concurrency` per process and its budgets).
    limits: LimitsConfig | None = None
    # The part of each shared bucket (the rates, tokens and `concurrent` of `models[].limits`, of a team's,
    # and of a provider's or deployment's `limits`) that batch lines may fill: a line is sent only while the
    # bucket, with it, holds at most this share of its burst, so the rest is always left to interactive
    # requests. A share of less than one request holds one: lines go one at a time, each while the bucket is
    # otherwise empty. A line refused by it waits and is sent again. 1: lines may take the whole bucket.
    quota_share: Annotated[float, Meta(gt=0, le=1)] = 0.5


class PriceConfig(Strict, frozen=True):
    """USD per million tokens, for usage accounting and budgets: 0 to 1,000,000 (a dollar a token)."""

    prompt_per_1m: Annotated[float, Meta(ge=0, le=1_000_000)] = 0.0
    completion_per_1m: Annotated[float, Meta(ge=0, le=1_000_000)] = 0.0


class AdminConfig(Strict, frozen=True):
    # The admin key for /admin/* (normally `${GATEWAY_ADMIN_KEY}`); empty or unset: the admin routes answer 404.
    key: str = ""


class MetricsConfig(Strict, frozen=True):
    # When set (normally `${GATEWAY_METRICS_KEY}`), GET /metrics answers only `Authorization: Bearer <key>`.
    key: str = ""


class TracingConfig(Strict, frozen=True):
    # OpenTelemetry traces over OTLP/HTTP (the `otel` extra); the OTEL_* variables configure the exporter, and
    # OTEL_TRACES_EXPORTER=otlp turns tracing on without this key (docs/observability.md).
    enabled: bool = False
    # What a client's `traceparent` does. `join`: the request's span is its child, so the client's trace id
    # and sampled flag go upstream (flag 00: the gateway records no span). `link`: the request starts a new
    # trace, sampled by the gateway's own sampler, whose span links to the client's; upstream gets only the
    # gateway's trace (docs/observability.md).
    client_context: Literal["join", "link"] = "join"


Transport = Literal["auto", "h1", "httpx"]


class DiscoveryConfig(Strict, frozen=True):
    """GET /v1/models lists what upstreams say they serve, refreshed in the background (docs/clients.md)."""

    enabled: bool = True
    # How often each provider's list is asked for again; a failed refresh keeps the last good list.
    ttl_ms: Annotated[int, Meta(ge=100)] = 60_000
    # One listing request, connect to last byte.
    timeout_ms: Annotated[int, Meta(gt=0)] = 5_000
    # Providers asked at the same time.
    concurrency: Annotated[int, Meta(ge=1, le=64)] = 4
    # Model ids kept per provider; an upstream answering more is cut here.
    max_models: Annotated[int, Meta(ge=1, le=100_000)] = 10_000


class DeploymentConfig(Strict, frozen=True):
    base_url: str | None = None
    api_key: str | None = None
    api_version: str | None = None
    # The upstream's own name for it (Azure deployment id) when it differs from the config key.
    name: str | None = None
    limits: LimitsConfig | None = None


class ProviderConfig(Strict, frozen=True):
    # A key of providers/registry.py REGISTRY; checked when the file is loaded (`_check_kind`).
    kind: str
    api_key: str | None = None
    base_url: str | None = None
    api_version: str | None = None
    deployments: dict[str, DeploymentConfig] = msgspec.field(default_factory=dict)
    # Advertised in GET /v1/models; routing does not require a model to be listed.
    models: list[str] = msgspec.field(default_factory=list)
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    # For providers that require a token limit (Anthropic): used when the request gives none.
    default_max_tokens: Annotated[int, Meta(ge=1)] | None = None
    # The largest logprobs count this server returns, when it differs from its kind's default (vLLM's
    # `--max-logprobs`, 20 by default; TGI's `--max-top-n-tokens`, 5): larger counts are refused naming it.
    # Up to MAX_LOGPROBS, the absolute bound every request is decoded with.
    max_logprobs: Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)] | None = None
    # The most choices (`n`) this server makes from one prompt in one call: a larger `n` is fanned out, one call
    # per choice. For llama-server (kind llamacpp), setting it is what sends `n` at all (its `--parallel` slots
    # bound it; a build from before late 2025 ignores `n`): unset, every choice is a call of its own there.
    max_n: Annotated[int, Meta(ge=1, le=4096)] | None = None
    # AWS region (`us-east-1`) for kind bedrock: the endpoint host and the SigV4 credential scope.
    # Empty is allowed here so an unset `${VAR}` does not fail the load; such a provider refuses requests.
    # `\Z`, not `$` (msgspec searches; `$` also matches before a final newline), and ASCII digits, not `\d`:
    # the region goes into a host name.
    region: Annotated[str, Meta(pattern=r"\A(?:[a-z]{2}(?:-[a-z]+)+-[0-9]+)?\Z")] | None = None
    unsupported_params: ParamPolicy | None = None
    timeouts: TimeoutsConfig | None = None
    retries: RetriesConfig | None = None
    # The upstream's own quota, enforced by the gateway so replicas stop before the upstream refuses.
    limits: LimitsConfig | None = None
    # Requests in flight to each of this provider's servers (its base_url, or each of its replicas) at most;
    # more wait in the gateway's fair queue (`queue:`, docs/fairness.md). Unset: no cap, no queue.
    max_concurrency: Annotated[int, Meta(ge=1, le=100_000)] | None = None
    # Per-pool connection cap; keep-alive connections are reused across requests.
    max_connections: Annotated[int, Meta(ge=1)] = 256
    # The upstream HTTP client: `h1` (the fast built-in HTTP/1.1 client), `httpx`, or `auto` (h1 unless
    # a proxy, a CA bundle, a client certificate or HTTP/2 below needs httpx).
    transport: Transport = "auto"
    # An HTTP(S) proxy URL for this provider; unset: HTTPS_PROXY / HTTP_PROXY / NO_PROXY from the environment.
    proxy: str | None = None
    # PEM file of CA certificates trusted for this provider instead of the system store.
    ca_bundle: str | None = None
    # mTLS: PEM client certificate and its key (the key may be in the certificate file).
    client_cert: str | None = None
    client_key: str | None = None
    http2: bool = False
    # Root URL of the server's tokenizer routes (/tokenize, /detokenize, /tokenizer_info) when they are not
    # where they usually are: `base_url` without a trailing `/v1` (docs/clients.md).
    tokenizer_url: str | None = None
    # Ask the upstream which models it serves, for GET /v1/models (gateway/edge/discovery.py). Unset: the kind's
    # default, on for self-hosted servers (docs/config.md lists the kinds), off for hosted catalogs.
    discover: bool | None = None
    # A self-hosted engine run as several replicas serving the same models, instead of one base_url: URLs,
    # or {url, weight, drain, max_concurrency}. Each is its own target (`<provider>@<i>`, i from 0 in list
    # order); at most 256; docs/fleets.md.
    replicas: Annotated[list[str | ReplicaConfig], Meta(max_length=MAX_REPLICAS)] = msgspec.field(default_factory=list)
    # Which replica serves each request (needs replicas:); unset: round robin.
    routing: RoutingConfig | None = None
    # Whose prompt prefixes share this provider's engine prefix caches (docs/fleets.md): `key` (each client key's
    # are its own: an engine that takes a prefix-cache salt, vLLM's and SGLang's `cache_salt`, is sent one derived
    # from the calling key's identity on every request, a client's own salt combined with it, so no key reads
    # another's cache entries; with `replicas:` and `routing.policy: prefix`, a prompt's prefix is also hashed
    # with that identity, so it does not follow another key's onto a replica), `team` (the keys of one team
    # share them; a key without a team is a team of its own) or `shared` (every caller's: a client's own
    # `cache_salt` goes as it is sent, and the same prefix goes to the same replica whoever sends it).
    # A single `base_url` is salted as every replica is.
    prefix_scope: Scope = "key"
    # This provider's targets' response cache, over the top-level `cache` (an alias's own block wins).
    cache: CacheConfig | None = None


class TargetConfig(Strict, frozen=True):
    model: str
    weight: Annotated[float, Meta(gt=0)] = 1.0


class AliasConfig(Strict, frozen=True):
    name: str
    targets: Annotated[list[TargetConfig], Meta(min_length=1)]
    strategy: Strategy = "weighted"
    # Other aliases or vendor/model strings, tried in order after every target has failed.
    fallbacks: list[str] = msgspec.field(default_factory=list)
    # Larger-context models to go to when a target answers that the prompt does not fit.
    context_window_fallbacks: list[str] = msgspec.field(default_factory=list)
    resume_streams: bool = False
    hedge_after_ms: Annotated[int, Meta(gt=0)] | None = None
    retries: RetriesConfig | None = None
    timeouts: TimeoutsConfig | None = None
    limits: LimitsConfig | None = None
    # This alias's response cache, over its provider's and the top-level `cache`.
    cache: CacheConfig | None = None


class CacheConfig(Strict, frozen=True):
    """The response cache (docs/cache.md): top level, per provider (`providers.<name>.cache`) or per alias
    (`models[].cache`); the most specific block wins whole."""

    # off | deterministic (only answers sampling cannot change: `temperature: 0`, a `seed`, or `max_tokens: 0`)
    # | always (every cacheable request).
    mode: Literal["off", "deterministic", "always"] = "off"
    # How long an entry serves, in seconds.
    ttl_s: Annotated[int, Meta(ge=1, le=365 * 86400)] = 3600
    # memory: per process, an LRU bounded by the top-level `max_bytes`; redis: the configured `redis.url`,
    # shared by replicas (without a `redis.url`, memory).
    store: Literal["memory", "redis"] = "memory"
    # The memory store's bound, over its entries' counted bytes and keys (docs/cache.md; the top-level block's
    # value sizes the one store of a process); evictions counted.
    max_bytes: Annotated[int, Meta(ge=1024)] = 256 * 1024 * 1024
    # An answer counting more than this (its client JSON, or its encoding) is not stored; a Redis value larger
    # than this is read as a miss. For the memory store, at most the top-level `max_bytes`.
    max_entry_bytes: Annotated[int, Meta(ge=1024)] = 4 * 1024 * 1024
    # key: an entry serves only the client key that stored it; shared: every key (one key reads what another
    # paid for).
    scope: Literal["key", "shared"] = "key"


class TokenizerConfig(Strict, frozen=True):
    # The model (an alias or vendor/model) of a bare /tokenize, /detokenize or /tokenizer_info request that
    # names none, as lm-eval's remote tokenizer never does; empty: such a request is a 400 naming `model`.
    default_model: str = ""


class GatewayConfig(Strict, frozen=True):
    server: ServerConfig = ServerConfig()
    redis: RedisConfig = RedisConfig()
    unsupported_params: ParamPolicy = "error"
    logging: LoggingConfig = LoggingConfig()
    # Re-asks after an emulated guided_* answer fails validation, before answering 502.
    guided_retries: Annotated[int, Meta(ge=0, le=10)] = 2
    timeouts: TimeoutsConfig = TimeoutsConfig()
    retries: RetriesConfig = RetriesConfig()
    cooldown: CooldownConfig = CooldownConfig()
    keys: list[KeyConfig] = msgspec.field(default_factory=list)
    # Requests without a client key, when no key is in force (no `keys:`, no runtime key in the ledger):
    # `auto` serves them while no client key was ever configured (the ledger has never held a runtime key:
    # revoking the last one keeps the gateway closed); `open` serves them whenever no key is in force;
    # `closed` never does (a ledger-managed gateway closed from its first second).
    keyless: Literal["auto", "open", "closed"] = "auto"
    providers: dict[str, Any] = msgspec.field(default_factory=dict)
    models: list[AliasConfig] = msgspec.field(default_factory=list)
    # Model string (exact, or a glob) -> price; see docs/operations.md for how a request's price is found.
    prices: dict[str, PriceConfig] = msgspec.field(default_factory=dict)
    admin: AdminConfig = AdminConfig()
    metrics: MetricsConfig = MetricsConfig()
    tracing: TracingConfig = TracingConfig()
    caps: CapsConfig = CapsConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    discovery: DiscoveryConfig = DiscoveryConfig()
    cache: CacheConfig = CacheConfig()
    ledger: LedgerConfig = LedgerConfig()
    batches: BatchesConfig = BatchesConfig()
    # Budgets, rate limits, model ceilings and admins shared by the keys that name the team (`keys[].team`); every
    # team a key names is declared here.
    teams: dict[str, TeamConfig] = msgspec.field(default_factory=dict)
    # The fair wait queue of servers with `max_concurrency` (docs/fairness.md).
    queue: QueueConfig = QueueConfig()
