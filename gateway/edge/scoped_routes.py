"""The model-scoped base path `/m/{model}/...`, for clients that derive every URL from one base URL.

lm-evaluation-harness cuts `/v1/completions` off its `base_url` to find vLLM's tokenizer routes, and may
send no `model`. Under `/m/{model}/` the completion and chat routes get the path's model filled in, the
tokenizer routes (gateway/edge/tokenizer_routes.py) take it as theirs, and `GET .../v1/models` lists it
alone. Grammar and rules: docs/clients.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final

import msgspec
from litestar.types import HTTPRequestEvent, HTTPScope, Receive, ReceiveMessage, Send

from gateway.edge.endpoint import Endpoint, Services, headers_of, read_body, request_id, send_error, send_json
from gateway.path.dialects import OPENAI
from gateway.path.request import check_model
from gateway.path.routing import Router
from providers.tokenizer import TokenizerRoute
from wire.errors import GatewayError, InvalidRequestError, shown
from wire.schema import ModelCard, ModelList, decode_body, encode

SCOPED_PREFIX: Final = "/m/"
COMPLETIONS_SUFFIX: Final = "/v1/completions"
CHAT_SUFFIX: Final = "/v1/chat/completions"
MODELS_SUFFIX: Final = "/v1/models"
_SUFFIXES: Final[tuple[tuple[str, TokenizerRoute], ...]] = (
    ("/tokenize", "tokenize"),
    ("/detokenize", "detokenize"),
    ("/tokenizer_info", "tokenizer_info"),
)

_encode: Final = msgspec.json.encode

# A tokenizer route's handler: the route, and the model in the path (None on the bare routes).
TokenizerEndpoint = Callable[[HTTPScope, Receive, Send, TokenizerRoute, str | None], Awaitable[None]]


class ModelField(msgspec.Struct):
    model: str | None = None


decode_model_field: Final = msgspec.json.Decoder(ModelField).decode


def split_scoped(path: str) -> tuple[str, TokenizerRoute | None] | None:
    """(model, tokenizer route) for a path under `/m/`, the route None for the completion route; None when
    the path ends in none of the known suffixes."""
    rest = path[len(SCOPED_PREFIX) :]
    if rest.endswith(COMPLETIONS_SUFFIX):
        return rest[: -len(COMPLETIONS_SUFFIX)], None
    for suffix, route in _SUFFIXES:
        if rest.endswith(suffix):
            return rest[: -len(suffix)], route
    return None


def with_model(body: bytes, model: str) -> bytes:
    """A completion body for the model in the path: `model` filled in when absent or null, kept when it is
    the same string, refused when it names another model."""
    try:
        given = decode_body(decode_model_field, body).model
    except (msgspec.DecodeError, msgspec.ValidationError):
        # Not a JSON object, invalid UTF-8, too deep, or a `model` that is not a string: the pipeline says so
        # in its words, as for /v1/completions.
        return body
    if given == model:
        return body
    if given:
        raise InvalidRequestError(
            f"'model' ({shown(given)!r}) disagrees with the model in the path ({shown(model)!r}): omit it or send the "
            "same",
            param="model",
            code="model_mismatch",
        )
    try:
        full = decode_body(msgspec.json.decode, body)
    except msgspec.DecodeError:
        return body
    full["model"] = model
    return _encode(full)


def one_model(router: Router, model: str) -> bytes:
    """The model list of `/m/{model}/`: that model, as `GET /v1/models` lists it, when a request to it can be
    served now (a provider whose key variable is unset serves nothing); an unknown model is a 404."""
    plan = router.plan(model)
    routes = [r for group in plan.groups for r in group.routes]
    if all(r.unavailable is not None for r in routes):
        return encode(ModelList(data=[]))
    owner = "gateway" if model in router.aliases else routes[0].provider
    return encode(ModelList(data=[ModelCard(id=model, owned_by=owner)]))


class Scoped:
    """Everything under `/m/`: the completion and chat routes and the tokenizer routes, for the model in the
    path; built once with the app, it finds the pipeline serving now per request."""

    def __init__(self, services: Services, completions: Endpoint, chat: Endpoint, tokenizer: TokenizerEndpoint) -> None:
        self.services = services
        self.completions = completions
        self.chat = chat
        self.tokenizer = tokenizer

    async def __call__(self, scope: HTTPScope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        serve = self.completions
        if path.endswith(MODELS_SUFFIX):
            await self._listing(scope, send, path[len(SCOPED_PREFIX) : -len(MODELS_SUFFIX)])
            return
        if path.endswith(CHAT_SUFFIX):
            found: tuple[str, TokenizerRoute | None] | None = (path[len(SCOPED_PREFIX) : -len(CHAT_SUFFIX)], None)
            serve = self.chat
        else:
            found = split_scoped(path)
        if found is None:
            exc = GatewayError("Not Found", status=404, type="not_found_error", code="not_found")
            await send_error(send, OPENAI, exc)
            return
        model, route = found
        if route is not None:
            await self.tokenizer(scope, receive, send, route, model)
            return
        headers = headers_of(scope)
        try:
            # Who asks before anything of what they ask is read, as on every other route.
            self.services(scope)[0].keys.authenticate(headers)
            check_model(model)
        except GatewayError as exc:
            await send_error(send, OPENAI, exc)
            return
        if scope["method"] != "POST":
            await serve(scope, receive, send)  # it answers the 405 itself
            return
        try:
            body = with_model(await read_body(receive), model)
        except GatewayError as exc:
            await send_error(send, OPENAI, exc)
            return
        except asyncio.CancelledError:
            return  # the client left while sending its body
        sent = False

        async def replay() -> ReceiveMessage:
            # The body once, then the client's own messages (its disconnect among them).
            nonlocal sent
            if not sent:
                sent = True
                first: HTTPRequestEvent = {"type": "http.request", "body": body, "more_body": False}
                return first
            return await receive()

        await serve(scope, replay, send)

    async def _listing(self, scope: HTTPScope, send: Send, model: str) -> None:
        # A client given `.../m/<model>/v1` as its base URL asks there what it may send (the SDKs'
        # `models.list()`, a benchmark without a model name, a readiness probe): no upstream is asked.
        headers = headers_of(scope)
        rid = request_id(headers)
        try:
            if scope["method"] != "GET":
                raise GatewayError(
                    "Method Not Allowed", status=405, type="invalid_request_error", code="method_not_allowed"
                )
            pipeline = self.services(scope)[0]
            key = pipeline.keys.authenticate(headers)
            check_model(model)
            pipeline.keys.authorize(key, model)
            body = one_model(pipeline.router, model)
        except GatewayError as exc:
            await send_error(send, OPENAI, exc, rid)
            return
        await send_json(send, 200, body, {"x-request-id": rid})


__all__ = ["SCOPED_PREFIX", "ModelField", "Scoped", "decode_model_field", "one_model", "split_scoped", "with_model"]
