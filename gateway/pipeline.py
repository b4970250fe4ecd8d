"""One completion request, end to end: authenticate, decode, route, translate, call, normalize.

This is the request path, so it is kept flat: one JSON decode of the client body, one encode of the
upstream body, one decode of the upstream answer and one encode of the client answer. Streams are
relayed event by event; nothing buffers a whole stream.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Mapping
from typing import Final

import msgspec

from gateway.auth import KeyRing
from gateway.config import LoadedConfig
from gateway.dialects import Dialect, decode_error
from gateway.errors import GatewayError, UpstreamError
from gateway.framing import DONE, NDJSONDecoder, SSEDecoder, sse_event
from gateway.request import normalize
from gateway.routing import Route, Router
from gateway.schema import Completion, CompletionRequest, Usage, decode_request, encode
from gateway.upstream import Stream, Upstream
from providers.base import Adapter, CallContext, LocalAdapter, map_params, prompt_form

_ID_BYTES: Final = 12


def _completion_id() -> str:
    return "cmpl-" + os.urandom(_ID_BYTES).hex()


class Result(msgspec.Struct):
    """A finished answer (`body`) or an open stream (`stream`), plus headers for the client."""

    headers: dict[str, str]
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None


class Pipeline:
    def __init__(self, loaded: LoadedConfig) -> None:
        self.loaded = loaded
        self.router = Router(loaded)
        self.keys = KeyRing(loaded)
        self.upstream = Upstream(loaded)

    async def close(self) -> None:
        await self.upstream.close()

    async def complete(self, raw: bytes, headers: Mapping[str, str], dialect: Dialect) -> Result:
        key = self.keys.authenticate(headers)
        try:
            req = decode_request(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise decode_error(exc) from None
        normalize(req)
        self.keys.authorize(key, req.model)
        route = self.router.resolve(req.model)
        self.router.check_available(route)
        adapter = route.adapter
        adapter.check(req, route.provider)
        params, dropped = map_params(req, adapter.params, route.provider, route.drop_unsupported)
        ctx = CallContext(
            id=_completion_id(),
            created=int(time.time()),
            model=req.model,
            prompts=_text_prompts(req),
            n=req.n or 1,
            echo=bool(req.echo),
        )
        out_headers = {"x-gateway-provider": route.provider}
        if dropped:
            out_headers["x-gateway-dropped-params"] = ",".join(dropped)
        if isinstance(adapter, LocalAdapter):
            if req.stream:
                chunks = adapter.stream(req, route.endpoint, ctx)
                # Pull the first chunk here so a failure before any byte is a normal error response.
                first = await anext(chunks)
                return Result(out_headers, stream=self._relay_local(first, chunks, req))
            completion = await adapter.complete(req, route.endpoint, ctx)
            return Result(out_headers, body=encode(completion))
        return await self._call(adapter, route, req, params, ctx, out_headers)

    async def _call(
        self,
        adapter: Adapter,
        route: Route,
        req: CompletionRequest,
        params: dict[str, object],
        ctx: CallContext,
        out_headers: dict[str, str],
    ) -> Result:
        upstream_req = adapter.build_request(req, route.endpoint, params)
        timeouts = self.upstream.timeouts_for(route.provider)
        if isinstance(req.inference_timeout, float | int):
            timeouts = timeouts.capped(float(req.inference_timeout))
        if not req.stream:
            resp = await self.upstream.send(route.provider, upstream_req, timeouts)
            if resp.status >= 400:
                raise adapter.map_error(resp.status, resp.headers, resp.body, route.provider)
            try:
                completion = adapter.parse_response(resp.body, ctx)
            except (msgspec.DecodeError, msgspec.ValidationError):
                raise UpstreamError(f"Upstream '{route.provider}' sent an invalid response body") from None
            return Result(out_headers, body=encode(completion))
        stream = await self.upstream.open_stream(route.provider, upstream_req, timeouts)
        if stream.status >= 400:
            async with stream:
                body = await stream.read_all()
            raise adapter.map_error(stream.status, stream.headers, body, route.provider)
        return Result(out_headers, stream=self._relay(adapter, stream, req, ctx))

    async def _relay(
        self, adapter: Adapter, stream: Stream, req: CompletionRequest, ctx: CallContext
    ) -> AsyncIterator[bytes]:
        want_usage = bool(req.stream_options and req.stream_options.include_usage)
        usage: Usage | None = None
        decoder = SSEDecoder() if adapter.framing == "sse" else NDJSONDecoder()
        try:
            async with stream:
                async for chunk in stream.chunks():
                    for event, data in decoder.feed(chunk):
                        c = adapter.parse_event(event, data, ctx)
                        if c is None:
                            continue
                        if c.usage is not None:
                            usage, c.usage = c.usage, None
                        if c.choices:
                            yield sse_event(encode(c))
                for event, data in decoder.close():
                    c = adapter.parse_event(event, data, ctx)
                    if c is not None and c.usage is not None:
                        usage, c.usage = c.usage, None
                    if c is not None and c.choices:
                        yield sse_event(encode(c))
            if want_usage and usage is not None:
                yield sse_event(encode(_usage_chunk(ctx, usage)))
        except GatewayError as exc:
            yield _error_event(exc)
        except (msgspec.DecodeError, msgspec.ValidationError):
            yield _error_event(UpstreamError(f"Upstream '{stream.provider}' sent an invalid stream event"))
        yield DONE

    async def _relay_local(
        self, first: Completion, rest: AsyncIterator[Completion], req: CompletionRequest
    ) -> AsyncIterator[bytes]:
        want_usage = bool(req.stream_options and req.stream_options.include_usage)
        c: Completion | None = first
        try:
            while c is not None:
                if c.choices:
                    c.usage = None
                    yield sse_event(encode(c))
                elif want_usage and c.usage is not None:
                    yield sse_event(encode(c))
                c = await anext(rest, None)
        except GatewayError as exc:
            yield _error_event(exc)
        finally:
            await rest.aclose()  # type: ignore[attr-defined]
        yield DONE


def _usage_chunk(ctx: CallContext, usage: Usage) -> Completion:
    return Completion(id=ctx.id, created=ctx.created, model=ctx.model, choices=[], usage=usage)


def _error_event(exc: GatewayError) -> bytes:
    # Mid-stream, every dialect gets OpenAI's envelope: the seeds define no error event of their own.
    return sse_event(
        encode({"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}})
    )


def _text_prompts(req: CompletionRequest) -> list[str] | None:
    form = prompt_form(req.prompt)
    if form == "text":
        return [req.prompt]  # type: ignore[list-item]
    if form == "texts":
        return list(req.prompt)  # type: ignore[arg-type]
    return None
