"""Prometheus metrics, correct with several workers.

With one process the values live in this process's registry. `python -m gateway serve --workers N`
sets `PROMETHEUS_MULTIPROC_DIR` before starting the workers, so prometheus_client keeps every
worker's values in files there and `GET /metrics`, whichever worker answers, reads them all.

Label values come from the config, never from what a client sends: a route key is any string after
a configured provider's name, so `model` and `target` keep only the names the config declares (see
`ModelLabels`) and fold every other one into its provider's `other` bucket. A flood of random model
names therefore adds no series: the number of series is bounded by the config.
"""

from __future__ import annotations

import asyncio
import os
import re
from bisect import bisect_left
from typing import Any, Final, NamedTuple

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.config import LoadedConfig, replica_names
from wire.schema import Usage

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_OVERHEAD = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
_GLOB: Final = re.compile(r"[*?\[]")
UNKNOWN: Final = "unknown"  # a model that did not resolve (no alias, no configured provider)
_MEMO_MAX: Final = 1024
OTHER: Final = "other"  # `<provider>/other[/<deployment>]`: every model name the config does not declare


class ModelLabels:
    """The `model` and `target` label values (and usage rows) one config allows.

    Kept exactly: alias names, the models alias targets and fallbacks name, each provider's declared
    `models:` (also on each of its deployments), and exact (glob-free) `prices:` keys and key and team
    `models:` entries. Any other `provider/name[/deployment]` becomes `provider/other[/deployment]`; a string
    with no configured provider becomes `unknown`. So the values are bounded by the config, whatever clients send.
    """

    def __init__(self, loaded: LoadedConfig | None = None) -> None:
        self.known: set[str] = set()
        self.deployments: dict[str, frozenset[str]] = {}
        self._memo: dict[str, str] = {}
        if loaded is None:
            return
        cfg = loaded.config
        for alias in cfg.models:
            self.known.add(alias.name)
            self.known.update(t.model for t in alias.targets)
            self.known.update(alias.fallbacks)
            self.known.update(alias.context_window_fallbacks)
        for name, p in loaded.providers.items():
            self.deployments[name] = frozenset(p.deployments)
            self.known.update(f"{name}/{m}" for m in p.models)
            for replica in replica_names(name, p.replicas):  # each replica's targets are labelled as it
                self.deployments[replica] = frozenset(p.deployments)
                self.known.update(f"{replica}/{m}" for m in p.models)
        exact = [*cfg.prices, *(m for k in cfg.keys for m in k.models)]
        exact += [m for t in cfg.teams.values() for m in t.models]
        self.known.update(m for m in exact if not _GLOB.search(m))

    def fold(self, model: str) -> str:
        # Also called on the ledger's writer thread (its rollups): each operation on the memo is atomic, and
        # an entry lost to a race is only computed again.
        if model in self.known:
            return model
        # Undeclared names (every direct `vendor/model` a config does not list) are remembered, in a memo
        # emptied when full so that client-chosen names cannot grow it.
        folded = self._memo.get(model)
        if folded is None:
            if len(self._memo) >= _MEMO_MAX:
                self._memo.clear()
            folded = self._memo[model] = self._fold(model)
        return folded

    def _fold(self, model: str) -> str:
        provider, _, rest = model.partition("/")
        deployments = self.deployments.get(provider)
        if deployments is None or not rest:
            return UNKNOWN
        head, sep, last = rest.rpartition("/")
        if sep and last in deployments:
            # A declared model on a declared deployment is as bounded as the config itself.
            return model if f"{provider}/{head}" in self.known else f"{provider}/{OTHER}/{last}"
        return f"{provider}/{OTHER}"


class Lost(msgspec.Struct):
    """An upstream call of a request that did not serve it (a hedge that lost, or a call cut when the client
    left during a hedge): paid for at its own target, booked beside the request (docs/ledger.md)."""

    provider: str
    target: str
    prompt_tokens: int
    completion_tokens: int
    cost_pico: int = 0  # priced by the usage booking, at its own target


class Record(msgspec.Struct):
    """What one request did, filled in by the pipeline and read when the answer (or stream) ends."""

    request_id: str
    dialect: str
    endpoint: str = "completions"  # which endpoint served it: completions or chat (a tokenizer route: its name)
    key: str | None = None  # the key's name: what the ledger books and its team's views show
    # The key as the operator tells it apart (`ClientKey.label`: `team/name` for a team's runtime key): the
    # access log's `key` and the cost metric's.
    key_label: str | None = None
    # The key's identity (`ClientKey.ident`) and its team when the request ran: what the ledger books.
    key_id: str = ""
    team: str = ""
    model: str = "unknown"
    # The target that served the request or, when none did, the last one that failed (then `failed` is set).
    provider: str = ""
    target: str = ""
    # A resumed stream's parts streamed by targets before `target` (which finished it): (target, prompt
    # tokens, completion tokens) each, priced at its own target.
    parts: list[tuple[str, int, int]] | None = None
    # Calls made for it whose answers it did not use (hedges that lost): booked and priced each at its own target.
    lost: list[Lost] | None = None
    failed: bool = False
    attempts: int = 0
    fallback: bool = False  # served by one of the alias's fallbacks rather than its own targets
    status: int = 200
    stream: bool = False
    usage: Usage | None = None
    # The upstream reported none (a stream without usage): `usage` is the gateway's estimate.
    usage_estimated: bool = False
    # Time spent inside the failover loop (upstream calls and retry waits); a stream: to its first event.
    upstream_s: float = 0.0
    # Time waiting for slots of servers with max_concurrency (gateway/queue); None: no such server asked.
    queue_s: float | None = None
    error_code: str | None = None
    cause: str | None = None  # why the upstream failed (wire.errors.CAUSES, `http_<status>`)
    prompt: str | None = None  # only when the config turns prompt logging on
    completion: str | None = None
    cached: bool = False  # answered from the response cache (gateway/cache): no upstream call, no cost
    cache_outcome: str | None = None  # the cache's x-gateway-cache (hit, miss, coalesced, bypass) when consulted
    # `model` folded into its label value (`ModelLabels.fold`), by whichever of the usage booking and the
    # metrics reads it first: folding twice per request was a measurable share of the request's own work.
    label: str | None = None
    # A budget reservation made at admission, settled when the request ends (gateway/ledger/budgets.py).
    hold: object | None = None
    # Its cost in picodollars, priced once by the usage booking (0: not served, or cached) and read by the ledger.
    cost_pico: int = 0
    # The batch a line of which this request is (gateway/batches): its access-log entry and span carry it.
    batch_id: str | None = None


class Observed:
    """A histogram series' observations since the tally's last flush: their sum and their count per bucket,
    added to the series at the flush (`inc`, as `Tally.flush` calls it). A histogram's own `observe` takes
    five calls and two locks per value; with one process nobody reads the series between two flushes."""

    __slots__ = ("bounds", "counts", "series", "sum")

    def __init__(self, series: Histogram) -> None:
        self.series = series
        self.bounds: tuple[float, ...] = tuple(series._upper_bounds)  # the last is +Inf
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0

    def add(self, amount: float, tally: Tally) -> None:
        pending = tally.pending
        if not pending:
            tally.arm()
        pending[self] = 0.0
        self.sum += amount
        # The first bucket whose bound is at least `amount`, as `Histogram.observe` finds it.
        self.counts[bisect_left(self.bounds, amount)] += 1

    def inc(self, _: float) -> None:
        series, counts = self.series, self.counts
        series._sum.inc(self.sum)
        for i, n in enumerate(counts):
            if n:
                series._buckets[i].inc(n)
                counts[i] = 0
        self.sum = 0.0


class _Children(NamedTuple):
    requests: Counter
    latency: Observed
    upstream: Observed
    ttft: Observed
    prompt_tokens: Counter
    completion_tokens: Counter


class Tally:
    """Counter increments gathered in the process and added to their series at most `FLUSH_S` later (and
    before every render): a series bumped on every request would pay a lock and four calls each time."""

    FLUSH_S: Final = 1.0

    def __init__(self) -> None:
        self.pending: dict[Any, float] = {}  # a labelled series (its child) -> what it has yet to be added
        self._timer: asyncio.TimerHandle | None = None

    def add(self, child: Any, amount: float = 1.0) -> None:
        pending = self.pending
        if not pending:
            self.arm()
        pending[child] = pending.get(child, 0.0) + amount

    def arm(self) -> None:
        """Flush within `FLUSH_S`: called by whoever adds to `pending` while it is empty."""
        if self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop (a script or a test): added at the next `flush` (every render flushes)
            self._timer = loop.call_later(self.FLUSH_S, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self.pending = self.pending, {}
        for child, amount in pending.items():
            child.inc(amount)


class _InFlight:
    """The in-flight gauge's write at a flush of the tally (with several workers): the process's count then."""

    __slots__ = ("metrics",)

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def inc(self, _: float) -> None:
        self.metrics.in_flight.set(self.metrics.active)


class Metrics:
    def __init__(self) -> None:
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "gateway_requests",
            "Requests by endpoint (completions, chat) and outcome",
            ["endpoint", "dialect", "model", "provider", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "gateway_request_duration_seconds",
            "End-to-end latency (streams: until the last byte)",
            ["endpoint", "dialect", "provider", "stream"],
            buckets=_LATENCY,
            registry=r,
        )
        self.upstream = Histogram(
            "gateway_upstream_duration_seconds",
            "Time in upstream calls and retry waits (streams: until the first event)",
            ["provider", "stream"],
            buckets=_LATENCY,
            registry=r,
        )
        self.overhead = Histogram(
            "gateway_overhead_seconds",
            "Non-streaming latency the gateway adds: end-to-end minus upstream time",
            buckets=_OVERHEAD,
            registry=r,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Streams: from the request to the first event from the upstream",
            ["provider"],
            buckets=_LATENCY,
            registry=r,
        )
        self.tokens = Counter("gateway_tokens", "Tokens", ["kind", "model", "provider"], registry=r)
        # Booked by gateway/limits/usage.py at the configured prices; `key` is a configured key name (or anonymous).
        self.cost = Counter("gateway_cost_usd", "Spend in USD at the configured prices", ["model", "key"], registry=r)
        self.retries = Counter(
            "gateway_retries", "Upstream calls beyond the first for a request", ["model"], registry=r
        )
        self.fallbacks = Counter(
            "gateway_fallbacks", "Requests served by a target other than their first choice", ["model"], registry=r
        )
        self.cooldowns = Counter("gateway_cooldowns", "Targets cooled down", ["target", "cause"], registry=r)
        # Fleets with `routing.engine_metrics`: reads of a replica's /metrics that gave no load (gateway/fleet).
        self.engine_unreadable = Counter(
            "gateway_engine_metrics_unreadable",
            "Reads of a replica's own metrics that gave no load, by replica and cause",
            ["replica", "cause"],
            registry=r,
        )
        self.rate_limited = Counter(
            "gateway_rate_limited", "Requests refused by a rate limit or budget", ["code", "model"], registry=r
        )
        # Requests that failed because an upstream did, under the target that failed last and why.
        self.failures = Counter(
            "gateway_upstream_failures",
            "Requests failed by an upstream, by the target that failed and the cause",
            ["provider", "target", "cause"],
            registry=r,
        )
        # The response cache (gateway/cache): lookups by result, bytes stored, memory-store evictions.
        self.cache_requests = Counter(
            "gateway_cache", "Cache lookups by result (hit, miss, coalesced, bypass)", ["result", "model"], registry=r
        )
        self.cache_stored_bytes = Counter(
            "gateway_cache_stored_bytes", "Bytes of answers stored in the cache", ["model"], registry=r
        )
        self.cache_evictions = Counter(
            "gateway_cache_evictions", "Entries the memory store evicted to stay within max_bytes", registry=r
        )
        self.cache_redis_not_entries = Counter(
            "gateway_cache_redis_not_entries",
            "Redis values read as cache entries that were not entries (each served as a miss)",
            registry=r,
        )
        # The fair queue of servers with max_concurrency (gateway/queue): waiting, waits, refusals, service.
        self.queue_waiting = Gauge(
            "gateway_queue_waiting",
            "Requests waiting for a slot, by server and priority",
            ["target", "priority"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.queue_wait = Histogram(
            "gateway_queue_wait_seconds",
            "Time a request waited for a slot (only requests that waited)",
            ["target", "priority"],
            buckets=_LATENCY,
            registry=r,
        )
        self.queue_rejected = Counter(
            "gateway_queue_rejected",
            "Requests refused by a server's queue (queue_full, queue_timeout, deadline) or sent elsewhere (spilled)",
            ["target", "reason"],
            registry=r,
        )
        self.queue_service = Counter(
            "gateway_queue_service_tokens",
            "Tokens (prompt and generated) served by capped servers, per server and tenant",
            ["target", "tenant"],
            registry=r,
        )
        self._overhead = Observed(self.overhead)
        # Counts added in batches: requests, tokens, latencies, the cache's and the queue's. With several
        # workers the files other workers read are written at the flush, or at once by an idle worker.
        self.tally = Tally()
        self.in_flight = Gauge("gateway_in_flight", "Requests being served", multiprocess_mode="livesum", registry=r)
        # Requests being served by this process, read when the gauge is collected. With several workers each
        # worker writes it to its file instead: when it leaves or reaches 0 (`started`, `observe`), and at every
        # flush of the tally in between, so a busy fleet's sum may be a second old and an idle one's is exact.
        self.active = 0
        if not self.multiprocess:
            self.in_flight.set_function(lambda: self.active)
        self._in_flight = _InFlight(self)
        # The config in force decides the label values (`bind`); until one is bound, every model folds.
        self.labels = ModelLabels()
        # Bounded like the label values themselves (see the module docstring).
        self._cache: dict[tuple[str, str, str, str, int, bool], _Children] = {}

    def bind(self, labels: ModelLabels) -> None:
        """Fold labels by this config's names from now on (a reload binds the new config's)."""
        self.labels = labels

    def engine_failed(self, replica: str, cause: str) -> None:
        self.engine_unreadable.labels(replica, cause).inc()

    def cooldown(self, target: str, cause: str) -> None:
        self.cooldowns.labels(self.labels.fold(target), cause).inc()

    def _children(self, endpoint: str, dialect: str, model: str, provider: str, status: int, stream: bool) -> _Children:
        """The labelled series one kind of request touches, looked up once per label set rather than through
        `labels()` (argument checks and a lock) five times per request."""
        key = (endpoint, dialect, model, provider, status, stream)
        kids = self._cache.get(key)
        if kids is None:
            flag = "true" if stream else "false"
            kids = self._cache[key] = _Children(
                requests=self.requests.labels(endpoint, dialect, model, provider, str(status)),
                # Every series of a label set gets its own `Observed`, even one shared with another label
                # set (two entries with the same provider share `upstream`): both add to the same series.
                latency=Observed(self.latency.labels(endpoint, dialect, provider, flag)),
                upstream=Observed(self.upstream.labels(provider, flag)),
                ttft=Observed(self.ttft.labels(provider)),
                prompt_tokens=self.tokens.labels("prompt", model, provider),
                completion_tokens=self.tokens.labels("completion", model, provider),
            )
        return kids

    def started(self) -> None:
        """A request is being served (`ended` when it is answered)."""
        self.active += 1
        if self.multiprocess:
            pending = self.tally.pending
            if not pending:
                self.tally.arm()
            pending[self._in_flight] = 0.0
            if self.active == 1:
                self.in_flight.set(1)

    def ended(self) -> None:
        self.active -= 1
        if self.multiprocess and not self.active:
            self.in_flight.set(0)

    def observe(self, rec: Record, elapsed_s: float) -> None:
        model = rec.label
        if model is None:
            model = rec.label = self.labels.fold(rec.model)
        labels = (rec.endpoint, rec.dialect, model, rec.provider or "none", rec.status, rec.stream)
        kids = self._cache.get(labels)  # `_children`'s probe, inlined: its call only for a new label set
        if kids is None:
            kids = self._children(*labels)
        usage = rec.usage
        tally = self.tally
        pending = tally.pending  # Tally.add, inlined: a counter's `inc` is four calls and a lock
        if not pending:
            tally.arm()
        pending[kids.requests] = pending.get(kids.requests, 0.0) + 1.0
        if usage is not None:
            pending[kids.prompt_tokens] = pending.get(kids.prompt_tokens, 0.0) + usage.prompt_tokens
            pending[kids.completion_tokens] = pending.get(kids.completion_tokens, 0.0) + usage.completion_tokens
        lost = rec.lost
        if lost is not None:  # hedges that lost: their tokens were spent too, at their own provider
            for call in lost:
                prompt_series = self.tokens.labels("prompt", model, call.provider)
                completion_series = self.tokens.labels("completion", model, call.provider)
                pending[prompt_series] = pending.get(prompt_series, 0.0) + call.prompt_tokens
                pending[completion_series] = pending.get(completion_series, 0.0) + call.completion_tokens
        kids.latency.add(elapsed_s, tally)
        if rec.provider and not rec.cached:  # a cached answer had no upstream time
            kids.upstream.add(rec.upstream_s, tally)
            if rec.stream and not rec.failed:
                kids.ttft.add(rec.upstream_s, tally)
            elif rec.status == 200:
                self._overhead.add(max(elapsed_s - rec.upstream_s, 0.0), tally)
        if rec.attempts > 1:
            self.retries.labels(model).inc(rec.attempts - 1)
        if rec.fallback:
            self.fallbacks.labels(model).inc()
        if rec.status == 429 and rec.error_code in ("rate_limit_exceeded", "budget_exceeded", "provider_quota"):
            self.rate_limited.labels(rec.error_code, model).inc()
        elif rec.cause is not None and rec.provider:
            self.failures.labels(rec.provider, self.labels.fold(rec.target), rec.cause).inc()
        if self.multiprocess and not self.active:
            # Another worker's render reads this one's files and cannot flush its tally: a worker with
            # nothing in flight writes what it gathered at once, so an idle fleet's counts are exact.
            tally.flush()

    def render(self) -> bytes:
        self.tally.flush()
        if self.multiprocess:
            registry = CollectorRegistry()
            MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            return generate_latest(registry)
        return generate_latest(self.registry)
