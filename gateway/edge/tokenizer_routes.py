"""vLLM's tokenizer routes, proxied to the server behind a model.

`/tokenize`, `/detokenize`, `/tokenizer_info`, and the same under the model-scoped base path
(gateway/edge/scoped_routes.py). A tokenizer request is authenticated, authorized and admitted like a
completion (never charged tokens) and makes one upstream call, not retried, holding a slot of its server's
`max_concurrency` while it runs; a client that leaves cancels it. Routes, model resolution and limits:
docs/clients.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Final
from urllib.parse import parse_qs, urlsplit

import msgspec
from litestar.types import HTTPScope, Receive, Send

from gateway.edge.endpoint import Endpoint, Watch, headers_of, read_body, request_id, send_error, send_json
from gateway.edge.scoped_routes import decode_model_field
from gateway.limits.admission import Ticket
from gateway.limits.auth import ClientKey
from gateway.limits.rateheaders import as_text, rate_headers
from gateway.limits.ratelimit import TOKEN_KINDS
from gateway.limits.refusal import refusal
from gateway.ops import accesslog
from gateway.ops.metrics import Metrics, Record
from gateway.path.dialects import OPENAI, decode_error
from gateway.path.pipeline import Pipeline
from gateway.path.request import check_model
from gateway.queue.gate import NO_CAP
from gateway.queue.service import Ask
from gateway.upstream.plan import Route
from gateway.upstream.transport import Response
from providers.base import Adapter, UpstreamRequest, bearer
from providers.tokenizer import (
    ROUTES,
    Call,
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeBody,
    TokenizeChatRequest,
    TokenizeRequest,
    TokenizeResponse,
    TokenizerRoute,
    server_root,
    tokenize_request,
)
from wire.errors import GatewayError, InvalidRequestError, UpstreamError, shown
from wire.messages import text_parts
from wire.schema import decode_body

log = logging.getLogger("gateway")

_METHOD: Final[dict[TokenizerRoute, str]] = {"tokenize": "POST", "detokenize": "POST", "tokenizer_info": "GET"}
# Context sizes learned from the upstreams that do not say it in their tokenize answer, per (root, model).
_LIMITS_CAP: Final = 1024
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
_UNREADABLE: Final = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError)

_decode_tokenize: Final = msgspec.json.Decoder(TokenizeBody).decode
_decode_detokenize: Final = msgspec.json.Decoder(DetokenizeRequest).decode
_encode: Final = msgspec.json.encode

Services = Callable[[HTTPScope], tuple[Pipeline, Metrics | None]]


def _not_available(provider: str, route: TokenizerRoute, hint: str = "") -> GatewayError:
    exc = GatewayError(
        f"Provider '{provider}' has no /{route} route{hint}",
        param="model",
        status=404,
        code="tokenizer_not_available",
        type="invalid_request_error",
    )
    return exc


@contextlib.contextmanager
def _readable(provider: str) -> Iterator[None]:
    """An upstream answer that cannot be read is the upstream's failure (502), not the gateway's."""
    try:
        yield
    except _UNREADABLE:
        raise UpstreamError(
            f"Upstream '{provider}' sent an invalid tokenizer answer", code="invalid_upstream_response"
        ) from None


def _model_missing(route: TokenizerRoute) -> InvalidRequestError:
    how = "add ?model=<model> to the URL" if route == "tokenizer_info" else "send 'model'"
    return InvalidRequestError(
        f"/{route} needs a model: {how}, use the model-scoped path /m/<model>/{route}, or configure "
        "tokenizer.default_model",
        param="model",
        code="missing_required_parameter",
    )


class Tokenizers:
    """The tokenizer endpoints; built once with the app, they find the pipeline serving now per request."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self._limits: dict[tuple[str, str], int] = {}

    def endpoints(self) -> dict[str, Endpoint]:
        """The bare routes at the server root, as vLLM serves them."""
        out: dict[str, Endpoint] = {}
        for route in ROUTES:

            async def endpoint(scope: HTTPScope, receive: Receive, send: Send, _r: TokenizerRoute = route) -> None:
                await self.handle(scope, receive, send, _r, None)

            out[f"/{route}"] = endpoint
        return out

    async def handle(
        self, scope: HTTPScope, receive: Receive, send: Send, route: TokenizerRoute, path_model: str | None
    ) -> None:
        t0 = time.perf_counter()
        headers = headers_of(scope)
        rec = Record(request_id=request_id(headers), dialect="tokenizer", endpoint=route)
        if scope["method"] != _METHOD[route]:
            exc = GatewayError(
                "Method Not Allowed", status=405, type="invalid_request_error", code="method_not_allowed"
            )
            await send_error(send, OPENAI, exc, rec.request_id)
            return
        body = b""
        if route == "tokenizer_info":
            # A GET has no body: the model may come as `?model=`, like the body's field on the other routes.
            query = parse_qs(scope["query_string"].decode("latin-1")).get("model")
            if query:
                body = _encode({"model": query[-1]})
        else:
            try:
                body = await read_body(receive)
            except GatewayError as exc:
                await send_error(send, OPENAI, exc, rec.request_id)
                return
            except asyncio.CancelledError:
                return
        pipeline = self.services(scope)[0]  # after the body is in: a reload meanwhile retired the old one
        pipeline.enter()
        # A client that leaves cancels the upstream call (and its wait for a slot), as on a completion.
        watch = Watch(receive, scope)
        try:
            answer, extra = await watch.run(self._answer(pipeline, route, path_model, body, headers, rec))
            extra["x-request-id"] = rec.request_id
            await send_json(send, 200, answer, extra)
        except GatewayError as exc:
            rec.status, rec.error_code = exc.status, exc.code
            await send_error(send, OPENAI, exc, rec.request_id)
        except asyncio.CancelledError:
            if not watch.gone:
                raise  # not the client leaving: the server's own cancel
            rec.status, rec.error_code = 499, "client_closed_request"
        except Exception:
            log.exception("unhandled error on %s (request %s)", scope["path"], rec.request_id)
            rec.status, rec.error_code = 500, "internal_error"
            await send_error(
                send,
                OPENAI,
                GatewayError("The gateway failed to process the request", code="internal_error"),
                rec.request_id,
            )
        finally:
            watch.stop()
            pipeline.exit()
            if pipeline.log_requests:
                accesslog.write(rec, time.perf_counter() - t0)

    async def _answer(
        self,
        pipeline: Pipeline,
        route: TokenizerRoute,
        path_model: str | None,
        body: bytes,
        headers: dict[str, str],
        rec: Record,
    ) -> tuple[bytes, dict[str, str]]:
        key = pipeline.keys.authenticate(headers)
        if key is not None:
            rec.key, rec.key_label = key.name, key.label
        tok_req: TokenizeRequest | TokenizeChatRequest | None = None
        detok_req: DetokenizeRequest | None = None
        body_model: str | None = None
        try:
            if route == "tokenize":
                caps = pipeline.loaded.config.caps
                tok_req = tokenize_request(
                    decode_body(_decode_tokenize, body), caps.json_depth, caps.chat_messages, caps.chat_content_parts
                )
                _check_chars(tok_req, caps.tokenize_chars)
                body_model = tok_req.model
            elif route == "detokenize":
                detok_req = decode_body(_decode_detokenize, body)
                body_model = detok_req.model
                cap = pipeline.loaded.config.caps.detokenize_tokens
                if len(detok_req.tokens) > cap:
                    raise InvalidRequestError(
                        f"'tokens' holds {len(detok_req.tokens)} token ids; at most {cap} may be sent "
                        "(caps.detokenize_tokens)",
                        param="tokens",
                        code="invalid_value",
                    )
            elif body:
                body_model = decode_model_field(body).model
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise decode_error(exc) from None
        if path_model is not None and body_model and body_model != path_model:
            raise InvalidRequestError(
                f"'model' ({shown(body_model)!r}) disagrees with the model in the path ({shown(path_model)!r})",
                param="model",
                code="model_mismatch",
            )
        # A path's model, even an empty one, is the model: never replaced by the default.
        model = path_model if path_model is not None else body_model or pipeline.loaded.config.tokenizer.default_model
        if not model:
            raise _model_missing(route)
        check_model(model)
        pipeline.keys.authorize(key, model)
        target = self._target(pipeline, model)
        rec.model, rec.provider, rec.target = model, target.provider, target.key
        target.require_available()
        api = target.adapter.tokenizer
        if route not in api.routes:
            raise _not_available(target.provider, route)
        if isinstance(tok_req, TokenizeChatRequest) and not api.chat:
            message = f"Provider '{target.provider}' has no chat form of /tokenize: send 'prompt'"
            raise InvalidRequestError(message, param="messages", code="unsupported_parameter")
        # Who asks, for the fair queue of a server with max_concurrency: a priority the key may not ask for is
        # refused before anything is charged.
        queues = pipeline.queues
        ask = queues.ask_nothing(key, headers) if queues is not None else None
        ticket = await self._admit(pipeline, key, model, target)
        try:
            out_headers = {"x-gateway-provider": target.provider, "x-gateway-model": target.key}
            if ticket is not None:
                out_headers.update(as_text(ticket.headers))
            upstream_model = target.endpoint.model
            if tok_req is not None:
                if isinstance(tok_req, TokenizeChatRequest):
                    call = api.tokenize_chat(tok_req, upstream_model, target.provider)
                    if api.renders:  # the conversation rendered by one call, its text tokenized by another
                        hint = " for a conversation: its server has no route that renders one; send 'prompt'"
                        reply = await self._call(pipeline, target, route, call, rec, ask, hint)
                        with _readable(target.provider):
                            plain = api.read_rendered(reply.body, tok_req)
                        call = api.tokenize(plain, upstream_model, target.provider)
                else:
                    call = api.tokenize(tok_req, upstream_model, target.provider)
                reply = await self._call(pipeline, target, route, call, rec, ask)
                with _readable(target.provider):
                    tokenized = api.read_tokenize(reply.body, tok_req)
                if not tokenized.tokens and (isinstance(tok_req, TokenizeChatRequest) or tok_req.prompt):
                    # Text always makes a token: none means the server did not read the request (llama-server
                    # behind a `vllm` provider ignores vLLM's `prompt`), not an empty tokenization.
                    raise UpstreamError(
                        f"Upstream '{target.provider}' tokenized a non-empty prompt into no tokens",
                        code="invalid_upstream_response",
                    )
                max_len = tokenized.max_model_len
                if max_len is None:
                    max_len = await self._max_model_len(pipeline, target, ask)
                answer = TokenizeResponse(
                    count=len(tokenized.tokens),
                    max_model_len=max_len,
                    tokens=tokenized.tokens,
                    token_strs=tokenized.token_strs,
                )
                return _encode(answer), out_headers
            if detok_req is not None:
                call = api.detokenize(detok_req, upstream_model)
                reply = await self._call(pipeline, target, route, call, rec, ask)
                with _readable(target.provider):
                    prompt = api.read_detokenize(reply.body)
                return _encode(DetokenizeResponse(prompt=prompt)), out_headers
            reply = await self._call(pipeline, target, route, api.tokenizer_info(), rec, ask)
            with _readable(target.provider):
                return api.read_tokenizer_info(reply.body, upstream_model), out_headers
        finally:
            pipeline.admission.settle(ticket, 0)
            if ask is not None and ask.first:
                rec.queue_s = ask.waited

    @staticmethod
    def _target(pipeline: Pipeline, model: str) -> Route:
        group = pipeline.router.aliases.get(model)
        if group is not None:
            return group.routes[0]
        return pipeline.router.resolve(model)

    @staticmethod
    async def _admit(pipeline: Pipeline, key: ClientKey | None, model: str, target: Route) -> Ticket | None:
        """Request-rate and concurrency limits of the key, its team, the alias and the target; no tokens are
        charged."""
        admission = pipeline.admission
        if not admission.applies(key):
            return None
        scopes = admission.own(key)
        scopes += admission.models.get(model, ())
        scopes += admission.providers.get(target.provider, ())
        if target.endpoint.deployment:
            scopes += admission.deployments.get((target.provider, target.endpoint.deployment), ())
        buckets = [b for b in scopes if b.kind not in TOKEN_KINDS]
        if not buckets:
            return None
        decision = await admission.acquire(buckets, 0)
        # The request-rate buckets' headers only: no tokens are charged here.
        headers = rate_headers([s for s in decision.states if s.bucket.kind in ("rps", "rpm")])
        if not decision.allowed:
            team = key.team if key is not None and key.team in admission.teams else None
            left = [s.remaining for s in decision.states]
            raise refusal(team, buckets, left, 0, decision.retry_after_ms, headers)
        return Ticket(buckets, decision.lease, 0, headers)

    @staticmethod
    def _roots(pipeline: Pipeline, target: Route) -> list[tuple[str, Route | None]]:
        """Where the call may go, in turn, each with the route whose server's slot it takes (None: a server the
        config sets no cap for): a replicated provider's replicas neither draining nor cooling first
        (gateway/fleet `side_order`), else the one root."""
        p = pipeline.loaded.providers[target.provider]
        deployment = p.deployments.get(target.endpoint.deployment) if target.endpoint.deployment else None
        if p.tokenizer_url and not (deployment is not None and deployment.base_url):
            # `max_concurrency` counts the calls of one server (scheme, host, port): a tokenizer_url served by
            # another takes none of the base_url server's slots, and one served by a replica takes that one's.
            where = _origin(p.tokenizer_url)
            routes = target.replicas if target.fleet is not None else [target]
            server = next((r for r in routes if _origin(r.endpoint.base_url) == where), None)
            return [(p.tokenizer_url.rstrip("/"), server)]
        if target.fleet is not None:
            cooling = [pipeline.health.local_state(r.key).cooling_ms > 0 for r in target.replicas]
            order = target.fleet.side_order(cooling)
            return [(server_root(target.fleet.urls[i]), target.replicas[i]) for i in order]
        return [(server_root(target.endpoint.base_url), target)]

    async def _send(self, pipeline: Pipeline, target: Route, call: Call, ask: Ask | None) -> Response:
        headers = {"accept": "application/json"}
        if call.body is not None:
            headers["content-type"] = "application/json"
        # The operator's headers, then the credential, as on a completion (providers/base.py request_headers).
        headers.update((k.lower(), v) for k, v in target.endpoint.headers.items())
        headers.update(bearer(target.endpoint))
        timeouts = pipeline.upstream.timeouts_for(target.provider)

        def at(root: str) -> UpstreamRequest:
            return UpstreamRequest(call.method, root + call.path, headers, call.body or b"")

        # Each call holds a slot of the server it goes to while it runs, where that server has max_concurrency
        # (gateway/queue), as a completion's attempt does.
        *others, (last, last_route) = self._roots(pipeline, target)
        for root, route in others:  # these calls change nothing upstream: on a failure the next replica is asked
            slot = ask.take(route) if ask is not None and route is not None else NO_CAP
            if slot is None:
                continue  # that replica is full: the next may have room, the last is waited for
            try:
                with contextlib.suppress(UpstreamError):
                    reply = await pipeline.upstream.send(target.provider, at(root), timeouts, target.key)
                    if reply.status < 500:
                        return reply
            finally:
                slot.done(0)
        slot = NO_CAP
        if ask is not None and last_route is not None:
            found = ask.take(last_route)
            if found is None:
                found, timeouts = await ask.wait(last_route, timeouts, None)
            slot = found
        try:
            return await pipeline.upstream.send(target.provider, at(last), timeouts, target.key)
        except UpstreamError as exc:
            raise pipeline.scrub.error(exc) from None
        finally:
            slot.done(0)

    async def _call(
        self,
        pipeline: Pipeline,
        target: Route,
        route: TokenizerRoute,
        call: Call,
        rec: Record,
        ask: Ask | None,
        hint: str = "",
    ) -> Response:
        started = time.perf_counter()
        rec.attempts = 1
        try:
            reply = await self._send(pipeline, target, call, ask)
        finally:
            rec.upstream_s = time.perf_counter() - started
        if reply.status < 400:
            return reply
        if reply.status in (404, 405) and _no_such_route(reply.body):
            if route == "tokenizer_info":
                hint = " (vLLM serves it only when started with --enable-tokenizer-info-endpoint)"
            raise _not_available(target.provider, route, hint)
        adapter = target.adapter
        if not isinstance(adapter, Adapter):  # an in-process provider has no tokenizer routes to call
            raise _not_available(target.provider, route)
        exc = adapter.map_error(reply.status, reply.headers, reply.body, target.provider)
        raise pipeline.scrub.error(exc)

    async def _max_model_len(self, pipeline: Pipeline, target: Route, ask: Ask | None) -> int:
        """The context size from the server's own info route, asked once per upstream model; 0 when unknown."""
        api = target.adapter.tokenizer
        if api.limits is None:
            return 0
        cache_key = (self._roots(pipeline, target)[0][0], target.endpoint.model)
        known = self._limits.get(cache_key)
        if known is not None:
            return known
        try:
            reply = await self._send(pipeline, target, api.limits, ask)
            found = api.read_limits(reply.body) if reply.status < 400 else None
        except (GatewayError, *_UNREADABLE):
            found = None
        if found is None:
            return 0  # not remembered: the next call asks again
        if len(self._limits) >= _LIMITS_CAP:
            self._limits.clear()
        self._limits[cache_key] = found
        return found


def _origin(url: str) -> tuple[str, str, int | None]:
    """The server a URL names: its scheme, host and port, the port a scheme's default when left out."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:  # the config's URL check refuses such a port at load; no server to share then
        port = None
    return scheme, (parts.hostname or "").lower(), port or _DEFAULT_PORTS.get(scheme)


def _check_chars(req: TokenizeRequest | TokenizeChatRequest, cap: int) -> None:
    """A 400 naming the field when the text to tokenize passes `caps.tokenize_chars`: the upstream tokenizes
    all of it, and nothing else bounds it but the body."""
    if isinstance(req, TokenizeRequest):
        field, chars = "prompt", len(req.prompt)
    else:
        field, chars = "messages", sum(len(text_parts(m.content, "") or "") for m in req.messages)
    if chars > cap:
        raise InvalidRequestError(
            f"'{field}' holds {chars} characters of text; at most {cap} may be tokenized in one request "
            "(caps.tokenize_chars)",
            param=field,
            code="invalid_value",
        )


def _no_such_route(body: bytes) -> bool:
    """A 404/405 that says the path does not exist (FastAPI's `{"detail": "Not Found"}`, axum's and
    llama.cpp's plain text), as opposed to one about the request, such as vLLM's unknown model."""
    text = body.strip()
    return (
        not text
        or text in (b'{"detail":"Not Found"}', b'{"detail": "Not Found"}', b"Not Found")
        # llama-server's handler for any path it does not serve (tools/server/server-http.cpp).
        or (text.startswith(b'{"error":') and b'"message":"File Not Found"' in text)
        or (text.startswith(b'{"detail":"Method Not Allowed"'))
    )


__all__ = ["Tokenizers"]
