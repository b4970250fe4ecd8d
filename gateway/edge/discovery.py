"""Model discovery: what each upstream says it serves, for GET /v1/models.

A self-hosted server serves whatever it was started with, so a background task asks each upstream with no
`models:` for its own list, once per `discovery.ttl_ms`; the request path only reads the last published
lists and never waits for an upstream. Refreshes, per-process lists and which ids are kept:
docs/clients.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

import msgspec

from gateway.config import LoadedConfig, ProviderConfig, replica_url
from gateway.path.request import check_model
from gateway.upstream.client import Upstream
from gateway.upstream.transport import Timeouts
from providers import REGISTRY
from providers.base import Adapter, Endpoint
from wire.errors import GatewayError, UpstreamConnectError, UpstreamUnreachableError
from wire.upstream import UpstreamRequest

if TYPE_CHECKING:
    from gateway.path.pipeline import Pipeline

log = logging.getLogger("gateway")  # the logger gateway.upstream.scrub filters

# How often the task looks for a reloaded config while no refresh is due.
_CONFIG_CHECK_S: Final = 1.0
NOTHING: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType({})
# A listing's own body cap: room for `discovery.max_models` cards of up to this many bytes each (a vLLM
# card with its permission block is about 500), plus the envelope. Past it the transport stops reading and
# nothing is decoded: a listing of millions of ids would otherwise be read and decoded in full, up to
# `caps.upstream_body_bytes`, in every worker, at every refresh.
LISTING_BYTES_PER_MODEL: Final = 1024
LISTING_SLACK_BYTES: Final = 64 * 1024


def listing_cap(max_models: int, upstream_body_bytes: int) -> int:
    """The most bytes of one listing that are read (never more than the transport's own cap)."""
    return min(max_models * LISTING_BYTES_PER_MODEL + LISTING_SLACK_BYTES, upstream_body_bytes)


class _Card(msgspec.Struct):
    id: str | None = None  # OpenAI's list shape
    name: str | None = None  # Ollama's /api/tags
    model: str | None = None  # newer Ollama, llama.cpp's Ollama-style `models`


class _Listing(msgspec.Struct):
    data: list[_Card] | None = None
    models: list[_Card] | None = None


# `{"object": "list", "data": [...]}`, Ollama's `{"models": [...]}`, or a bare array (Together).
_decode_listing = msgspec.json.Decoder(_Listing | list[_Card]).decode


class NotAListing(ValueError):
    """The answer is not a model list (its message names no upstream text)."""


def listed_ids(body: bytes, provider: str, deployments: Collection[str], limit: int) -> tuple[list[str], int]:
    """The callable `provider/<id>` strings in a listing body, in its order, at most `limit`, and how
    many entries were left out (not callable, or past the limit; of a long listing, of those read).
    Raises NotAListing."""
    out: list[tuple[list[str], int]] = []
    for _ in _steps(body, provider, deployments, limit, out):
        pass
    return out[0]


async def read_listing(body: bytes, provider: str, deployments: Collection[str], limit: int) -> tuple[list[str], int]:
    """`listed_ids`, giving the event loop its turn between steps of a few milliseconds each."""
    out: list[tuple[list[str], int]] = []
    for _ in _steps(body, provider, deployments, limit, out):
        await asyncio.sleep(0)
    return out[0]


def _steps(
    body: bytes, provider: str, deployments: Collection[str], limit: int, out: list[tuple[list[str], int]]
) -> Iterator[None]:
    """The work of `listed_ids`, in steps; its result is appended to `out`. A long body is decoded by
    prefixes, each about twice the last, until one holds `limit` callable ids or `SCAN_FACTOR` x `limit`
    entries: a listing just under its byte cap may hold millions of tiny entries, and decoding them all at
    once would hold the event loop (and /health) for a large part of a second."""
    picked = _Picked(provider, deployments, limit)
    for prefix in _prefixes(body):
        try:
            decoded = _decode_listing(prefix)
        except (msgspec.DecodeError, UnicodeDecodeError):
            decoded = None  # cut inside a card, a nested list or a string: a longer prefix, or the whole body
        found = None if decoded is None else _cards(decoded)
        if found is not None:
            yield from picked.take(found)
            if picked.enough:
                out.append(picked.result(len(found)))
                return
        yield
    try:
        decoded = _decode_listing(body)
    except msgspec.DecodeError as exc:  # msgspec names the JSON path and types, never the values
        raise NotAListing(f"the answer is not a model list ({exc})") from None
    except UnicodeDecodeError:  # its text would quote the upstream's bytes
        raise NotAListing("the answer is not a model list (invalid UTF-8)") from None
    cards = _cards(decoded)
    if cards is None:
        raise NotAListing("the answer is not a model list (no `data` or `models`)")
    picked = _Picked(provider, deployments, limit)  # the whole may differ from a prefix (a repeated key)
    yield from picked.take(cards)
    out.append(picked.result(len(cards)))


class _Picked:
    """The ids kept so far from a listing's first entries; `take` goes on where the last prefix ended."""

    def __init__(self, provider: str, deployments: Collection[str], limit: int) -> None:
        self.provider = provider
        self.deployments = deployments
        self.limit = limit
        self.ids: dict[str, None] = {}
        self.left_out = 0
        self.seen = 0

    @property
    def enough(self) -> bool:
        return len(self.ids) >= self.limit or self.seen >= SCAN_FACTOR * self.limit

    def take(self, cards: list[_Card]) -> Iterator[None]:
        """Look at the entries after the ones seen, until enough; a step every `_STEP_CARDS` entries."""
        for card in itertools.islice(cards, self.seen, None):
            if self.enough:
                return
            self.seen += 1
            raw = card.id or card.name or card.model
            if not raw or not callable_id(self.provider, raw, self.deployments):
                self.left_out += 1
            else:
                self.ids[f"{self.provider}/{raw}"] = None
            if self.seen % _STEP_CARDS == 0:
                yield

    def result(self, read: int) -> tuple[list[str], int]:
        return list(self.ids), self.left_out + read - self.seen


# How many entries of a long listing may be read without finding `max_models` callable ids.
SCAN_FACTOR: Final = 4
# Below this a listing is decoded whole (a millisecond or two at most); above, by doubling prefixes.
_WHOLE_BYTES: Final = 64 * 1024
# Between two entries of a list of objects (JSON allows whitespace around the comma).
_BETWEEN: Final = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_LEADING: Final = re.compile(rb"[ \t\r\n]*")
# Entries checked per step (a few milliseconds).
_STEP_CARDS: Final = 1024


def _prefixes(body: bytes) -> Iterator[bytes]:
    """Ever longer prefixes of a long listing, each cut after an entry and closed as the listing opened
    (`]` for a bare array, `]}` for an object). A cut that is not between two entries of the listing
    itself (inside an entry, a string, another key's list) fails to decode or holds no `data`/`models`,
    and only a longer prefix or the whole body is tried: a prefix never says what the whole does not."""
    lead = _LEADING.match(body)
    start = lead.end() if lead is not None else 0
    closer = b"]" if body[start : start + 1] == b"[" else b"]}"
    end = _WHOLE_BYTES
    while end < len(body):
        m = _BETWEEN.search(body, end)
        if m is None:
            return
        yield body[: m.start() + 1] + closer
        end = 2 * (m.start() + 1)


def _cards(decoded: _Listing | list[_Card]) -> list[_Card] | None:
    return decoded if isinstance(decoded, list) else decoded.data if decoded.data is not None else decoded.models


def callable_id(provider: str, model: str, deployments: Collection[str]) -> bool:
    """Whether a client sending `provider/model` would reach this model of this provider."""
    try:
        check_model(f"{provider}/{model}")
    except GatewayError:
        return False
    head, sep, last = model.rpartition("/")
    return not (sep and head and last in deployments)


def listing_requests(name: str, p: ProviderConfig) -> tuple[UpstreamRequest, ...]:
    """The GETs that list a provider's models: one per replica of a replicated provider (in `replicas:`
    order), else one; none when the kind has no listing the gateway reads or no base URL of its own."""
    if not p.replicas:
        one = listing_request(name, p)
        return () if one is None else (one,)
    found = (listing_request(name, p, replica_url(r)) for r in p.replicas)
    return tuple(req for req in found if req is not None)


def listing_request(name: str, p: ProviderConfig, replica: str | None = None) -> UpstreamRequest | None:
    """The GET that lists a provider's models (at `replica`, one of its replicas' URLs, if given), with its
    credential as its completions carry it; None when the kind has no listing the gateway reads or the
    provider has no base URL of its own."""
    # Each adapter says where its server lists models (`model_listing`). Self-hosted servers list exactly
    # what they serve, all of it callable. Hosted catalogs (OpenAI, Together, Fireworks, DeepSeek, Mistral)
    # also list chat-only, embedding and image models that a completions call refuses, so they are asked
    # only when a provider sets `discover: true`.
    adapter = REGISTRY[p.kind]()
    found = adapter.model_listing
    if found is None or not isinstance(adapter, Adapter):
        return None
    base = (replica or p.base_url or getattr(adapter, "default_base_url", None) or "").rstrip("/")
    if not base:
        return None  # only deployments have URLs: each serves its own model, named by the config
    endpoint = Endpoint(provider=name, model="", base_url=base, api_key=p.api_key or None, headers=p.headers)
    auth = adapter.auth_headers(endpoint)
    # The precedence of providers.base.request_headers: ours, then the operator's, then the credential.
    headers = {"accept": "application/json"}
    headers.update((k.lower(), v) for k, v in p.headers.items())
    headers.update((k.lower(), v) for k, v in auth.items())
    return UpstreamRequest(method="GET", url=base + found[0], headers=headers, body=b"")


def wanted(p: ProviderConfig) -> bool:
    found = REGISTRY[p.kind].model_listing
    return found is not None and (found[1] if p.discover is None else p.discover)


class _Source:
    """One provider's listing: where it is asked (each replica's URL for a replicated provider), when
    next, and the last good answer."""

    def __init__(
        self, name: str, requests: tuple[UpstreamRequest, ...], deployments: frozenset[str], due: float
    ) -> None:
        self.name = name
        self.requests = requests
        self.deployments = deployments
        self.due = due
        self.ids: tuple[str, ...] = ()
        self.failing = False
        self.partial = False
        # Set while its last refresh found nobody listening (refused, no DNS, TLS): it cannot be called.
        self.unreachable: str | None = None

    def same_upstream(self, other: _Source) -> bool:
        same = [(a.url, a.headers) == (b.url, b.headers) for a, b in zip(self.requests, other.requests, strict=False)]
        return len(self.requests) == len(other.requests) and all(same) and self.deployments == other.deployments


class Discovery:
    """The refresher and the lists it publishes; one per process, started and stopped with the app."""

    def __init__(self, current: Callable[[], Pipeline], *, clock: Callable[[], float] = time.monotonic) -> None:
        # The pipeline serving now: a reload replaces it, and the refresher follows its config.
        self._current = current
        self._clock = clock
        # Provider -> its callable `provider/<id>` strings. Replaced whole, never changed in place, so the
        # request path reads it without a lock; the router memoizes the listing per published value.
        self.models: Mapping[str, tuple[str, ...]] = NOTHING
        # Provider -> why nothing can reach it now; its models leave GET /v1/models until it answers again.
        self.unreachable: Mapping[str, str] = MappingProxyType({})
        self._loaded: LoadedConfig | None = None
        self._sources: dict[str, _Source] = {}
        self._upstream: Upstream | None = None
        self._timeouts = Timeouts(5.0, 5.0, 5.0)
        self._ttl = 60.0
        self._limit = 10_000
        self._cap = listing_cap(self._limit, 64 * 1024 * 1024)
        self._gate = asyncio.Semaphore(4)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._upstream is not None:
            await self._upstream.close()
            self._upstream = None

    async def _run(self) -> None:
        while True:
            try:
                pipeline = self._current()
                if pipeline.loaded is not self._loaded:
                    await self._adopt(pipeline)
                now = self._clock()
                due = [s for s in self._sources.values() if s.due <= now]
                if due:
                    await asyncio.gather(*(self._refresh(s) for s in due))
                nxt = min((s.due for s in self._sources.values()), default=now + _CONFIG_CHECK_S)
                wait = nxt - self._clock()
            except Exception:
                log.exception("model discovery failed; retrying")  # a bug: keep serving the last lists
                wait = _CONFIG_CHECK_S
            await asyncio.sleep(min(max(wait, 0.0), _CONFIG_CHECK_S))

    async def _adopt(self, pipeline: Pipeline) -> None:
        """Follow a (re)loaded config: which providers to ask, how, and with which limits."""
        loaded = pipeline.loaded
        cfg = loaded.config.discovery
        unavailable = pipeline.router.unavailable_providers() if cfg.enabled else {}
        now = self._clock()
        sources: dict[str, _Source] = {}
        for name, p in loaded.providers.items():
            # An unavailable provider cannot be called, so nothing of it is listed (its key variable is unset).
            if not cfg.enabled or not wanted(p) or name in unavailable:
                continue
            reqs = listing_requests(name, p)
            if not reqs:
                continue
            src = _Source(name, reqs, frozenset(p.deployments), now)
            old = self._sources.get(name)
            # Same URL, same credentials, same deployments: its last list and its schedule stand.
            sources[name] = old if old is not None and old.same_upstream(src) else src
        if self._upstream is not None:
            await self._upstream.close()
        subset = {name: loaded.providers[name] for name in sources}
        self._cap = listing_cap(cfg.max_models, loaded.config.caps.upstream_body_bytes)
        caps = msgspec.structs.replace(loaded.config.caps, upstream_body_bytes=self._cap)
        own = msgspec.structs.replace(
            loaded, providers=subset, config=msgspec.structs.replace(loaded.config, caps=caps)
        )
        self._upstream = Upstream(own) if subset else None
        seconds = cfg.timeout_ms / 1000
        self._timeouts = Timeouts(seconds, seconds, seconds)
        self._ttl = cfg.ttl_ms / 1000
        self._limit = cfg.max_models
        self._gate = asyncio.Semaphore(cfg.concurrency)
        self._sources = sources
        self._loaded = loaded
        self._publish()

    async def _refresh(self, src: _Source) -> None:
        async with self._gate:
            try:
                ids, left_out = await self._first_answer(src)
            except (GatewayError, NotAListing) as exc:
                if isinstance(exc, UpstreamUnreachableError):
                    # No URL: it may carry credentials, and the reason is shown on the status page.
                    self._mark(src, f"Provider '{src.name}' is unreachable: {_cause(exc)}")
                self._failed(src, exc.message if isinstance(exc, GatewayError) else str(exc))
                return
            except Exception as exc:  # whatever one upstream sends, the others are still refreshed
                self._failed(src, f"unexpected {type(exc).__name__}")
                return
            finally:
                src.due = self._clock() + self._ttl
        if src.failing:
            log.info("model discovery: provider %r answers again (%d models)", src.name, len(ids))
            src.failing = False
        self._mark(src, None)
        if left_out and not src.partial:
            log.warning(
                "model discovery: provider %r listed models a client could not call, or more than "
                "discovery.max_models (%d); kept %d, left out %d of the entries read (a long listing is read "
                "only until it gives max_models ids or 4 x max_models entries)",
                src.name,
                self._limit,
                len(ids),
                left_out,
            )
        src.partial = bool(left_out)
        if tuple(ids) != src.ids and self._sources.get(src.name) is src:
            src.ids = tuple(ids)
            self._publish()

    def _order(self, src: _Source) -> list[UpstreamRequest]:
        """Whom to ask, in turn: a replicated provider's replicas neither draining (config or admin route) nor
        cooling (as this process sees them) first, then the cooling ones (gateway/fleet `side_order`)."""
        pipeline = self._current()
        fleet = pipeline.router.fleets.get(src.name)
        if fleet is None or fleet.size != len(src.requests):
            return list(src.requests)
        local = pipeline.health.local
        cooling = [local.cooling_under(f"{identity}/") for identity in fleet.ids]
        return [src.requests[i] for i in fleet.side_order(cooling)]

    async def _first_answer(self, src: _Source) -> tuple[list[str], int]:
        """The first listing any replica gives. Raises a failure that is not "nobody listening" if there was
        one, else the last: the provider is unreachable only when no replica of it was."""
        failure: Exception | None = None
        for req in self._order(src):
            try:
                return await self._fetch(src, req)
            except Exception as exc:  # whatever one replica does, the next is asked
                if failure is None or isinstance(failure, UpstreamUnreachableError):
                    failure = exc
        assert failure is not None  # a source has at least one request
        try:
            raise failure
        finally:
            failure = None  # the traceback holds this frame: no cycle through it back to the exception

    async def _fetch(self, src: _Source, req: UpstreamRequest) -> tuple[list[str], int]:
        upstream = self._upstream
        assert upstream is not None  # a source exists only with its transport
        try:
            try:
                resp = await upstream.send(src.name, req, self._timeouts)
            except UpstreamConnectError:
                # A listing is idempotent: once more at once, for a pooled connection the server had closed.
                resp = await upstream.send(src.name, req, self._timeouts)
        except GatewayError as exc:
            if exc.code != "upstream_answer_too_large" or "body" not in exc.message:
                raise
            raise NotAListing(
                f"the listing is larger than {self._cap} bytes (discovery.max_models x "
                f"{LISTING_BYTES_PER_MODEL} + {LISTING_SLACK_BYTES}); nothing of it was read further"
            ) from None
        if resp.status != 200:
            raise NotAListing(f"the upstream answered HTTP {resp.status}")
        return await read_listing(resp.body, src.name, src.deployments, self._limit)

    def _failed(self, src: _Source, reason: str) -> None:
        if not src.failing:
            # A server that never listed a model may just not be up yet (the shipped config's vLLM on a
            # laptop): INFO. One whose models are now gone from GET /v1/models is news: WARNING.
            kept = (
                "its models are left out of GET /v1/models and shown unavailable until it answers"
                if src.unreachable
                else f"GET /v1/models keeps its last good list ({len(src.ids)} models)"
            )
            log.log(
                logging.WARNING if src.ids else logging.INFO,
                "model discovery: provider %r failed: %s; %s; asking again every %g s",
                src.name,
                reason,
                kept,
                self._ttl,
            )
            src.failing = True

    def _mark(self, src: _Source, unreachable: str | None) -> None:
        if src.unreachable != unreachable:
            src.unreachable = unreachable
            if self._sources.get(src.name) is src:
                self._publish()

    def _publish(self) -> None:
        self.models = MappingProxyType({name: s.ids for name, s in self._sources.items() if s.ids})
        self.unreachable = MappingProxyType(
            {name: s.unreachable for name, s in self._sources.items() if s.unreachable is not None}
        )


def _cause(exc: GatewayError) -> str:
    """What the message says after "Upstream '<target>' could not be reached: " (the target is no model here)."""
    _, sep, rest = exc.message.partition("could not be reached: ")
    return rest if sep else exc.message
