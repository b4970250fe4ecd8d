"""The Litestar application: routes per dialect, the request-body limit, lifespan of shared clients.

The completion routes are raw ASGI handlers (gateway/edge/endpoint.py) that decode the body themselves: one
msgspec pass into the union request, with errors rendered in the dialect's own shape rather than
Litestar's generic validation error. The other routes are ordinary Litestar handlers. Both kinds render
errors with the one renderer (gateway/edge/render.py), and `Front` enforces the one body limit for all.
"""

from __future__ import annotations

import gc
import hashlib
import hmac
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final

from litestar import Litestar, Request, Response, get
from litestar.datastructures import State
from litestar.enums import ScopeType
from litestar.exceptions import HTTPException
from litestar.types import ControllerRouterHandler, HTTPScope, Receive, ReceiveMessage, Scope, Send

from gateway.batches.service import Batches
from gateway.config import LoadedConfig, started
from gateway.edge import admin_role
from gateway.edge.batch_admin import routes as batch_admin_routes
from gateway.edge.batch_routes import routes as batch_routes
from gateway.edge.discovery import Discovery
from gateway.edge.endpoint import Endpoint, Services, completion_endpoint, headers_of, request_id, send_error
from gateway.edge.ledger_routes import routes as ledger_routes
from gateway.edge.render import error_response
from gateway.edge.scoped_routes import SCOPED_PREFIX, Scoped
from gateway.edge.status import ROUTES as STATUS_ROUTES
from gateway.edge.tokenizer_routes import Tokenizers
from gateway.fleet import metered
from gateway.fleet.engine import EngineReader, watched
from gateway.fleet.shared import DrainSync
from gateway.ledger.service import LedgerService, Pinned
from gateway.ops import accesslog, cores, stopsignal
from gateway.ops.metrics import CONTENT_TYPE, Metrics
from gateway.ops.orphans import end_with_supervisor
from gateway.ops.reload import Reloader
from gateway.path.dialects import OPENAI, PAIS, SGP, USAGE_LAST, Dialect
from gateway.path.operation import CHAT
from gateway.path.pipeline import Pipeline
from gateway.upstream.httpx_transport import tls_context
from wire.errors import AuthenticationError, GatewayError, InvalidRequestError
from wire.schema import ModelCard, ModelList, encode

log = logging.getLogger("gateway")

JSON = "application/json"
FILES: Final = "/v1/files"
_MULTIPART_SLACK: Final = 64 * 1024  # a multipart upload's boundaries and part headers around the file
# GET /v1/models answers kept encoded, one per client key (a bound, should keys be many).
_MODEL_PAGES: Final = 64
# Net allocations of GC-tracked objects before a young collection (CPython's default: 700); see `lifespan`.
_YOUNG_COLLECTION_AT: Final = 10_000
# A route's dialect decides its error shape, its own defaults and bounds on the request, and where a stream's
# usage goes; the request and Completion types are the same everywhere.
DIALECT_ROUTES: dict[str, Dialect] = {
    "/v1/completions": OPENAI,
    "/inference/v1/completions": USAGE_LAST,
    "/v4/beta/completions": SGP,
    "/api/v1/compatibility/openai/v1/completions": PAIS,
}
# The chat routes: the same pipeline, keys, routing and error shapes as the completion route of their dialect.
CHAT_ROUTES: dict[str, Dialect] = {
    "/v1/chat/completions": OPENAI,
    "/inference/v1/chat/completions": USAGE_LAST,
    "/v4/beta/chat/completions": SGP,
    "/api/v1/compatibility/openai/v1/chat/completions": PAIS,
}
# The error shape of every route that has a dialect of its own, including the answers Litestar or the body
# limit give before the endpoint runs; any other path speaks OpenAI's.
ROUTE_DIALECTS: dict[str, Dialect] = {**DIALECT_ROUTES, **CHAT_ROUTES}


def _pipeline(request: Request[Any, Any, Any]) -> Pipeline:
    pipeline: Pipeline = request.app.state.pipeline
    return pipeline


def _services_of(state: State) -> Services:
    """What the raw endpoints read the pipeline in force (and the metrics) from, once per request."""
    items = _items(state)

    def services(scope: HTTPScope) -> tuple[Pipeline, Metrics | None]:
        return items["pipeline"], items["metrics"]

    return services


def _items(state: State) -> Mapping[str, Any]:
    """The dict behind the app's `State` when it has one (read without a Python call per item), else the
    `State` itself: a reload's `state.pipeline = ...` writes that dict."""
    items = getattr(state, "_state", None)
    return items if isinstance(items, dict) else state


@get("/v1/models")
async def list_models(request: Request[Any, Any, Any]) -> Response[bytes]:
    pipeline = _pipeline(request)
    try:
        key = pipeline.keys.authenticate(headers_of(request.scope))
    except GatewayError as exc:
        return error_response(OPENAI, exc)
    # What upstreams serve, as the background refresher last heard it (gateway/edge/discovery.py): never awaited here.
    discovery: Discovery = request.app.state.discovery
    listed = pipeline.router.model_ids(discovery.models, discovery.unreachable)
    # The page a key sees changes only with the listing (memoized per published value and per config): with
    # thousands of discovered ids, matching and encoding them on every call cost tens of milliseconds. Kept per
    # key identity: two teams' keys share a name, and a key made again under a revoked one's name is another key.
    pages: dict[str | None, tuple[list[tuple[str, str]], bytes]] = request.app.state.model_pages
    who = key.ident if key is not None else None
    page = pages.get(who)
    if page is None or page[0] is not listed:
        cards = [ModelCard(id=m, owned_by=owner) for m, owner in listed if key is None or key.models.match(m)]
        if len(pages) >= _MODEL_PAGES:
            pages.clear()
        page = pages[who] = (listed, encode(ModelList(data=cards)))
    return Response(page[1], media_type=JSON)


def _metrics_refused(request: Request[Any, Any, Any]) -> Response[bytes] | None:
    """A 401 unless `metrics.key` is empty or presented as `Authorization: Bearer <key>`.

    Digests of equal length compared in constant time, so the timing says nothing of how much of a
    wrong key was right. A key whose `${VAR}` is unset keeps the route closed: a missing secret must
    not open what the operator meant to close.
    """
    loaded = _pipeline(request).loaded
    expected = loaded.config.metrics.key
    unset = bool(loaded.missing_for("metrics.key"))
    if not expected and not unset:
        return None
    scheme, _, token = headers_of(request.scope).get("authorization", "").partition(" ")
    token = token.strip()
    if (
        not unset
        and scheme.lower() == "bearer"
        and token
        and hmac.compare_digest(hashlib.sha256(token.encode()).digest(), hashlib.sha256(expected.encode()).digest())
    ):
        return None
    exc = AuthenticationError(
        "Missing or incorrect metrics key: send 'Authorization: Bearer <metrics key>'",
        code="invalid_api_key",
        headers={"www-authenticate": "Bearer"},
    )
    return error_response(OPENAI, exc)


@get("/metrics")
async def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    refused = _metrics_refused(request)
    if refused is not None:
        return refused
    collected: Metrics = request.app.state.metrics
    return Response(collected.render(), media_type=CONTENT_TYPE)


@get("/health")
async def health() -> Response[bytes]:
    return Response(b'{"status":"ok"}', media_type=JSON)


@get("/ready")
async def ready(request: Request[Any, Any, Any]) -> Response[bytes]:
    shared = _pipeline(request).shared
    body: dict[str, str] = {"status": "ready", "redis": "disabled"}
    if shared.configured:
        body["redis"] = "ok" if await shared.ping() else "unreachable"
    ledger: LedgerService | None = request.app.state.ledger
    if ledger is not None:
        # The writer could not write, or the last call (a key poll every keys_poll_ms) had no answer. The
        # cause names the database and quotes its driver: that is for the log and /admin/status, not for
        # whoever can reach this unauthenticated route.
        body["ledger"] = "ok" if ledger.ledger.trouble is None else "unavailable"
    if body["redis"] == "unreachable" or body.get("ledger", "ok") != "ok":
        # Still serving (in-process state, spilled rows), but not what ops configured: say so to the orchestrator.
        body["status"] = "degraded"
        return Response(encode(body), status_code=503, media_type=JSON)
    return Response(encode(body), media_type=JSON)


def _one_charset(response: Response[Any]) -> Response[Any]:
    # Litestar appends `; charset=utf-8` to every text/ media type, also to one that names its charset
    # already (the Prometheus exposition's, the usage CSV's): such a type is sent as it is, its charset once.
    media = response.media_type
    if isinstance(media, str) and "charset=" in media.lower() and "content-type" not in response.headers:
        response.headers["content-type"] = media
    return response


def _http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    dialect = ROUTE_DIALECTS.get(request.url.path, OPENAI)
    kinds = {404: ("not_found_error", "not_found"), 405: ("invalid_request_error", "method_not_allowed")}
    other = (
        ("invalid_request_error", "invalid_request") if exc.status_code < 500 else ("server_error", "internal_error")
    )
    kind, code = kinds.get(exc.status_code, other)
    return error_response(dialect, GatewayError(str(exc.detail), status=exc.status_code, code=code, type=kind))


def _gateway_error(request: Request[Any, Any, Any], exc: GatewayError) -> Response[bytes]:
    # A GatewayError a Litestar route lets through (the body limit's 413 from `Front`'s receive, say).
    return error_response(ROUTE_DIALECTS.get(request.url.path, OPENAI), exc)


def _unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    # Never a traceback or an internal message to the client; the log keeps the detail.
    log.exception("unhandled error on %s", request.url.path)
    dialect = ROUTE_DIALECTS.get(request.url.path, OPENAI)
    return error_response(
        dialect, GatewayError("The gateway failed to process the request", status=500, code="internal_error")
    )


def create_app(loaded: LoadedConfig) -> Front:
    collected = Metrics()
    # The ledger (docs/ledger.md), one per process; every pipeline, a reload's too, books into it.
    ledger = LedgerService(loaded, collected) if loaded.config.ledger.url else None
    pinned = Pinned(loaded, collected)

    def build(config: LoadedConfig) -> Pipeline:
        built = Pipeline(config, metrics=collected)
        if ledger is not None:
            ledger.install(built)
        pinned.check(config)  # a reload's `ledger.*` changes: one WARNING, counted
        if reloading:  # `serve` said it at start, once for all workers; a reload says it again
            log.info("config reload: %s", built.keys.describe())
        return built

    reloading = False

    pipeline = build(loaded)
    reloading = True
    # The Batch API (docs/batches.md): its files, batches and lines live in the ledger's database.
    batches = Batches(loaded, lambda: app.state.pipeline, collected) if ledger is not None else None
    discovery = Discovery(lambda: app.state.pipeline)  # follows reloads: the pipeline serving now
    # Replicated providers' engine load (gateway/fleet/engine.py): off unless `routing.engine_metrics`.
    engines = EngineReader(
        lambda: watched(app.state.pipeline.router.fleets, app.state.pipeline.loaded.providers),
        collected.engine_failed,
        # The provider's CA bundle, client certificate and proxy, as its completions use them.
        lambda p: metered.pool(tls_context(p), p.proxy),
    )
    drains = DrainSync(lambda: (app.state.pipeline.shared, app.state.pipeline.router.fleets))  # with Redis only

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        # Everything built so far (Litestar, the config, pools, tables) lives as long as the process:
        # moving it out of the collector's reach keeps full collections from stalling requests.
        gc.collect()
        gc.freeze()
        # Requests that resume together (the rate limits' script replies of one tick, answered at once) allocate
        # their next phase together: at CPython's 700 allocations, nearly every such wave ran a young collection
        # that walked every request in flight. Requests free what they allocate, so a higher mark costs memory
        # only for the rare cycle.
        gc.set_threshold(_YOUNG_COLLECTION_AT, *gc.get_threshold()[1:])
        if loaded.config.server.pin_workers:
            cores.pin_worker()  # before the ledger and the batches start their threads: they inherit the core
        if ledger is not None:
            await ledger.start()
        unhook = None
        if batches is not None:
            await batches.start()
            # Its lines stop at the stop signal, not once the server has drained: one grace for both.
            unhook = stopsignal.on_stop(batches.runner.drain)
        reloader = Reloader(app.state, loaded.source, build)
        app.state.reloader = reloader
        reloader.start()
        discovery.start()
        engines.start()
        drains.start()
        try:
            yield
        finally:
            await drains.stop()
            await engines.stop()
            await discovery.stop()
            await reloader.stop()
            if unhook is not None:
                unhook()
            if batches is not None:
                await batches.close()  # its lines in flight are cancelled: the next runner sends them again
            await app.state.pipeline.close()
            if ledger is not None:
                await ledger.close()  # after the requests: every answered one is queued by now
            accesslog.SINK.flush()
            collected.tally.flush()  # counts gathered since the last second reach the series (and their files)

    handlers: list[ControllerRouterHandler] = [list_models, metrics, health, ready, *STATUS_ROUTES]
    # Without a ledger: 404s that say the Batch API needs one.
    handlers += [*batch_routes(), *batch_admin_routes(admin_role.identify)]
    if ledger is not None:
        handlers += ledger_routes(admin_role.identify, admin_role.render)
    app = Litestar(
        route_handlers=handlers,
        lifespan=[lifespan],
        exception_handlers={HTTPException: _http_exception, GatewayError: _gateway_error, Exception: _unexpected},
        after_request=_one_charset,
        debug=False,
        logging_config=None,
        openapi_config=None,
        request_max_body_size=None,  # `Front` enforces caps.request_body_bytes for every route
    )
    app.state.pipeline = pipeline
    app.state.metrics = collected
    app.state.discovery = discovery
    app.state.ledger = ledger
    app.state.batches = batches
    app.state.model_pages = {}
    _services = _services_of(app.state)
    fast = {path: completion_endpoint(path, dialect, _services) for path, dialect in DIALECT_ROUTES.items()}
    fast |= {path: completion_endpoint(path, dialect, _services, CHAT) for path, dialect in CHAT_ROUTES.items()}
    # vLLM's tokenizer routes at the root, and the model-scoped base path /m/{model}/... (docs/clients.md).
    tokenizers = Tokenizers(_services)
    fast.update(tokenizers.endpoints())
    scoped = Scoped(
        _services,
        completion_endpoint(SCOPED_PREFIX + "{model}/v1/completions", OPENAI, _services),
        completion_endpoint(SCOPED_PREFIX + "{model}/v1/chat/completions", OPENAI, _services, CHAT),
        tokenizers.handle,
    )
    return Front(app, fast, scoped)


def too_large(limit: int) -> InvalidRequestError:
    return InvalidRequestError(f"The request body is larger than {limit} bytes", status=413, code="request_too_large")


class _Capped:
    """A `receive` that raises the 413 once a body without a declared length passes the limit."""

    __slots__ = ("left", "limit", "receive")

    def __init__(self, receive: Receive, limit: int) -> None:
        self.receive = receive
        self.limit = limit
        self.left = limit

    async def __call__(self) -> ReceiveMessage:
        message = await self.receive()
        if message["type"] == "http.request":
            self.left -= len(message.get("body", b""))
            if self.left < 0:
                raise too_large(self.limit)
        return message


class Front:
    """The ASGI app the server runs: the completion paths go straight to their raw endpoints, the rest
    (and the lifespan) to Litestar; every HTTP request passes the one body limit first.

    Litestar's router and exception middleware wrap every `send` of every request; on the completion
    paths that was about 8 % of a saturated worker. Those endpoints already handle their own errors,
    methods and disconnects (gateway/edge/endpoint.py), so they gain nothing from the wrapping.

    The limit (`caps.request_body_bytes`, read per request so a reload applies) lives here so that no
    route can miss it: a declared length over it is answered at once, before a byte of the body is read,
    in the path's dialect; a body without one (chunked) is counted as it arrives, and the receive that
    passes the limit raises the same 413 inside the route, which renders it like its other errors. A
    declared length within the limit needs no counting: the server's parser ends the body there.
    """

    def __init__(self, litestar: Litestar, fast: dict[str, Endpoint], scoped: Endpoint | None = None) -> None:
        self.litestar = litestar
        self.items = _items(litestar.state)  # the pipeline in force, read on every request
        self.fast = fast
        self.scoped = scoped  # every path under /m/ (gateway/edge/scoped_routes.py)

    @property
    def state(self) -> State:
        return self.litestar.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == ScopeType.HTTP:
            config = self.items["pipeline"].loaded.config
            limit: int = config.caps.request_body_bytes
            if scope["path"] == FILES:  # an upload of a batch's input file: its own, larger bound
                limit = max(limit, config.batches.max_file_bytes + _MULTIPART_SLACK)
            declared: int | None = None
            for name, value in scope["headers"]:  # the declared length (a loop here, not a call: every request)
                if name == b"content-length":
                    declared = int(value) if value.isdigit() else None
                    break
            if declared is None:
                receive = _Capped(receive, limit)
            elif declared > limit:
                headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
                dialect = ROUTE_DIALECTS.get(scope["path"], OPENAI)
                await send_error(send, dialect, too_large(limit), request_id(headers))
                return
            endpoint = self.fast.get(scope["path"])
            if endpoint is None and self.scoped is not None and scope["path"].startswith(SCOPED_PREFIX):
                endpoint = self.scoped
            if endpoint is not None:
                scope["app"] = self.litestar  # as Litestar sets it for the routes it serves
                await endpoint(scope, receive, send)
                return
        await self.litestar(scope, receive, send)


def app_from_env() -> Front:
    """Factory for `uvicorn --factory` workers: the CLI validated the config before starting them."""
    end_with_supervisor()
    return create_app(started.for_worker())
