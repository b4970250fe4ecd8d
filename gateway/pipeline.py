"""One completion request, end to end: authenticate, decode, route, translate, call, normalize.

This is the request path, so it is kept flat: one JSON decode of the client body, one encode of the
upstream body per attempt, one decode of the upstream answer and one encode of the client answer.
Streams are relayed event by event; nothing buffers a whole stream. A stream's attempt (and so every
retry and failover) ends when its first event has been read: after that, bytes reach the client and
the only way on is `resume_streams`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import msgspec

from gateway import emulation, tracing
from gateway.admission import Admission, Ticket
from gateway.auth import KeyRing
from gateway.config import LoadedConfig
from gateway.dialects import Dialect, decode_error
from gateway.emulation import Emulation
from gateway.errors import GatewayError, UpstreamError
from gateway.failover import Failover, Outcome
from gateway.framing import DECODERS, DONE, sse_event
from gateway.health import Health
from gateway.ids import unique_suffix
from gateway.metrics import Metrics, Record
from gateway.request import normalize
from gateway.routing import Plan, Route, Router
from gateway.schema import Completion, CompletionRequest, Usage, decode_request, encode
from gateway.scrub import Scrubber, watch_logs
from gateway.state import SharedState
from gateway.upstream import Stream, Timeouts, Upstream
from gateway.usage import UsageStore
from providers.base import Adapter, CallContext, LocalAdapter, map_params, prompt_form
from providers.envelope import Unreadable
from providers.quota import exhausted_for

log = logging.getLogger("gateway")

# What an upstream answer that cannot be read raises while it is parsed: the answer is broken, not the
# gateway (other exceptions are adapter bugs, logged with their traceback, but also a failed attempt).
_UNREADABLE = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, Unreadable)
# The most tokens one answer may report: larger (or negative) counts from a broken upstream are clamped
# so they cannot poison rate limits, budgets and usage rows.
MAX_REPORTED_TOKENS = 100_000_000
# The longest an upstream's own quota headers may keep its target off: a month (Mistral's longest window),
# so a reset header saying "99999h" does not park the target for years.
MAX_QUOTA_WAIT_S = 31 * 86400.0


def _completion_id() -> str:
    return "cmpl-" + unique_suffix()


class Result(msgspec.Struct):
    """A finished answer (`body`) or an open stream (`stream`), plus headers for the client."""

    headers: dict[str, str]
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None


class Opened:
    """A stream whose first event has arrived: nothing has been sent to the client yet."""

    def __init__(
        self,
        chunks: AsyncGenerator[Completion, None],
        first: Completion | None,
        stream: Stream | None = None,
        *,
        ctx: CallContext,
        children: Sequence[Opened] = (),
    ) -> None:
        self.chunks = chunks
        self.first = first
        self.stream = stream
        self.ctx = ctx  # this call's own context: its `created` is what the stream's chunks carry
        self.children = children  # the sub-streams an emulated fan-out merges
        self.quota: Ticket | None = None  # an alias target's provider/deployment quota, settled with the stream

    def drop(self) -> None:
        """Close the upstream connection(s) at once (not returned to the pool half-read)."""
        if self.stream is not None:
            self.stream.close()
        for child in self.children:
            child.drop()

    async def close(self) -> None:
        self.drop()
        await self.chunks.aclose()
        for child in self.children:
            await child.close()


class Pipeline:
    def __init__(
        self,
        loaded: LoadedConfig,
        *,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        metrics: Metrics | None = None,
    ) -> None:
        self.loaded = loaded
        self.router = Router(loaded)
        self.keys = KeyRing(loaded)
        self.upstream = Upstream(loaded)
        self.shared = SharedState(loaded.config.redis.url)
        on_cooldown = metrics.cooldown if metrics is not None else None
        self.health = Health(
            self.shared,
            loaded.config.cooldown,
            clock=clock,
            on_cooldown=on_cooldown,
            refresh_ms=loaded.config.redis.refresh_ms,
        )
        self.log_prompts = loaded.config.logging.prompts
        self.log_requests = loaded.config.logging.requests
        self.failover = Failover(self.health, clock=clock, **({"sleep": sleep} if sleep else {}))
        self.admission = Admission(loaded, self.shared, **({"sleep": sleep} if sleep else {}))
        self.usage = UsageStore(loaded, self.shared, metrics=metrics)
        # None unless tracing is on (gateway/tracing.py): the endpoint then opens a span per request.
        self.tracing = tracing.from_config(loaded)
        # Built once per config: cuts the config's secrets out of upstream text (errors, logs).
        self.scrub = Scrubber.from_config(loaded)
        watch_logs(self.scrub)

    # Requests hold the pipeline they started with; a reload retires this one, which closes its pools
    # when the last of them ends.
    active = 0
    _retiring = False
    _closing: asyncio.Future[None] | None = None

    def enter(self) -> None:
        self.active += 1

    def exit(self) -> None:
        self.active -= 1
        if self._retiring and self.active == 0:
            self._close_soon()

    def retire(self) -> None:
        self._retiring = True
        if self.active == 0:
            self._close_soon()

    def _close_soon(self) -> None:
        if self._closing is None:
            self._closing = asyncio.ensure_future(self.close())

    async def close(self) -> None:
        await self.admission.drain()
        await self.admission.limiter.close()
        await self.usage.drain()
        await self.upstream.close()
        await self.shared.close()

    async def complete(
        self, raw: bytes, headers: Mapping[str, str], dialect: Dialect, rec: Record | None = None
    ) -> Result:
        try:
            return await self._complete(raw, headers, dialect, rec)
        except UpstreamError as exc:
            # The one way out for upstream errors before a stream starts: nothing unscrubbed passes it.
            raise self.scrub.error(exc) from None

    async def _complete(self, raw: bytes, headers: Mapping[str, str], dialect: Dialect, rec: Record | None) -> Result:
        rec = rec if rec is not None else Record(request_id="", dialect=dialect.name)
        key = self.keys.authenticate(headers)
        rec.key = key.name if key is not None else None
        try:
            req = decode_request(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise decode_error(exc) from None
        normalize(req, self.loaded.config.caps)
        self.keys.authorize(key, req.model)
        rec.model = req.model  # a budget refusal counts under the model asked for (routing refines it below)
        if key is not None and key.name in self.usage.budgets:
            await self.usage.check(key.name)  # one HGET of today's booked spend
        plan = self.router.plan(req.model)
        alias = req.model in self.router.aliases
        rec.model = req.model if alias else plan.groups[0].routes[0].key
        rec.stream = bool(req.stream)
        if self.log_prompts:
            rec.prompt = req.prompt if isinstance(req.prompt, str) else encode(req.prompt).decode()
        ctx = CallContext(
            id=_completion_id(),
            created=int(time.time()),
            model=req.model,
            prompts=_text_prompts(req),
            n=req.n or 1,
            echo=bool(req.echo),
        )
        dropped: dict[str, list[str]] = {}
        deadline = float(req.inference_timeout) if isinstance(req.inference_timeout, float | int) else None
        ticket = await self.admission.admit(key, req, plan) if self.admission.enabled else None
        limit_headers = ticket.headers if ticket is not None else {}
        if not req.stream:

            async def call(route: Route, timeouts: Timeouts) -> Completion:
                quota = await self.admission.admit_route(route, req, plan) if self.admission.enabled else None
                used: int | None = 0
                try:
                    c = await self._complete_once(route, req, ctx, timeouts, dropped)
                    used = c.usage.total_tokens if c.usage is not None else None
                    return c
                finally:
                    self.admission.settle(quota, used)

            used: int | None = 0
            started = time.perf_counter()
            try:
                done = await self.failover.run(plan, call, deadline_s=deadline)
                usage = done.value.usage
                used = usage.total_tokens if usage is not None else None
            finally:
                rec.upstream_s = time.perf_counter() - started
                self.admission.settle(ticket, used)
            _served(rec, plan, done)
            rec.usage = done.value.usage
            if self.log_prompts:
                rec.completion = encode([ch.text for ch in done.value.choices]).decode()
            return Result(_headers(done, dropped) | limit_headers, body=encode(done.value))

        async def open_stream(route: Route, timeouts: Timeouts) -> Opened:
            quota = await self.admission.admit_route(route, req, plan) if self.admission.enabled else None
            try:
                opened = await self._open_once(route, req, ctx, timeouts, dropped)
            except BaseException:
                self.admission.settle(quota, 0)
                raise
            opened.quota = quota
            return opened

        def discard(lost: Opened) -> None:
            lost.drop()
            self.admission.settle(lost.quota, 0)

        started = time.perf_counter()
        try:
            opened = await self.failover.run(plan, open_stream, deadline_s=deadline, discard=discard)
        except BaseException:
            self.admission.settle(ticket, 0)
            raise
        finally:
            rec.upstream_s = time.perf_counter() - started
        _served(rec, plan, opened)
        relay = self._relay(opened.value, req, ctx, plan, opened.route, ticket, rec)
        return Result(_headers(opened, dropped) | limit_headers, stream=relay)

    async def _watch_quota(self, route: Route, headers: Mapping[str, str]) -> None:
        """An answer that says the upstream's quota is now used up: stop every replica sending more."""
        wait = exhausted_for(headers)
        if wait is not None:
            await self.health.exhausted(route.key, min(wait, MAX_QUOTA_WAIT_S))

    def _prepare(self, route: Route, req: CompletionRequest, dropped: dict[str, list[str]]) -> dict[str, Any]:
        route.adapter.check(req, route.provider)
        params, lost = map_params(req, route.adapter.params, route.provider, route.drop_unsupported)
        if lost:
            dropped[route.key] = lost
        return params

    def _emulation(self, route: Route, req: CompletionRequest) -> Emulation | None:
        return emulation.plan(
            route.adapter,
            req,
            route.provider,
            self.loaded.config.guided_retries,
            self.loaded.config.caps,
            route.endpoint,
        )

    async def _complete_once(
        self,
        route: Route,
        req: CompletionRequest,
        ctx: CallContext,
        timeouts: Timeouts,
        dropped: dict[str, list[str]],
    ) -> Completion:
        em = self._emulation(route, req)
        if em is None:
            return await self._call_once(route, req, ctx, timeouts, dropped)
        return await emulation.complete(em, req, ctx, lambda sub: self._call_once(route, sub, ctx, timeouts, dropped))

    async def _call_once(
        self,
        route: Route,
        req: CompletionRequest,
        ctx: CallContext,
        timeouts: Timeouts,
        dropped: dict[str, list[str]],
    ) -> Completion:
        params = self._prepare(route, req, dropped)
        adapter = route.adapter
        ctx = _fresh(ctx)
        if isinstance(adapter, LocalAdapter):
            return await adapter.complete(req, route.endpoint, ctx)
        upstream_req = adapter.build_request(req, route.endpoint, params)
        resp = await self.upstream.send(route.provider, upstream_req, timeouts, route.key)
        if resp.status >= 400:
            raise adapter.map_error(resp.status, resp.headers, resp.body, route.provider)
        await self._watch_quota(route, resp.headers)
        try:
            return _sane(adapter.parse_response(resp.body, ctx))
        except GatewayError:
            raise
        except Exception as exc:
            raise _unreadable(route, "response body", exc) from None

    async def _open_once(
        self,
        route: Route,
        req: CompletionRequest,
        ctx: CallContext,
        timeouts: Timeouts,
        dropped: dict[str, list[str]],
    ) -> Opened:
        em = self._emulation(route, req)
        if em is None:
            return await self._open_single(route, req, ctx, timeouts, dropped)
        if em.guide is not None:
            # Bytes sent cannot be taken back: a guided stream is made from an answer already validated.
            plain = msgspec.structs.replace(req, stream=False, stream_options=None)
            answer = await emulation.complete(
                em, plain, ctx, lambda sub: self._call_once(route, sub, ctx, timeouts, dropped)
            )
            chunks = _replay(emulation.to_chunks(answer))
            return Opened(chunks, await anext(chunks, None), ctx=ctx)
        subs = emulation.sub_requests(em, req)
        tasks = [asyncio.ensure_future(self._open_single(route, s, ctx, timeouts, dropped)) for s in subs]
        try:
            opens = list(await asyncio.gather(*tasks))
        except BaseException:
            for t in tasks:
                t.cancel()
            for r in await asyncio.gather(*tasks, return_exceptions=True):
                if isinstance(r, Opened):
                    await r.close()
            raise
        merged = emulation.stream(em, req, ctx, opens)
        return Opened(merged, await anext(merged, None), ctx=opens[0].ctx, children=opens)

    async def _open_single(
        self,
        route: Route,
        req: CompletionRequest,
        ctx: CallContext,
        timeouts: Timeouts,
        dropped: dict[str, list[str]],
    ) -> Opened:
        params = self._prepare(route, req, dropped)
        adapter = route.adapter
        ctx = _fresh(ctx)
        if isinstance(adapter, LocalAdapter):
            local = adapter.stream(req, route.endpoint, ctx)
            return Opened(local, await anext(local, None), ctx=ctx)
        upstream_req = adapter.build_request(req, route.endpoint, params)
        stream = await self.upstream.open_stream(route.provider, upstream_req, timeouts, route.key)
        try:
            if stream.status >= 400:
                body = await stream.read_all()
                raise adapter.map_error(stream.status, stream.headers, body, route.provider)
            await self._watch_quota(route, stream.headers)
            events = _events(adapter, stream, ctx, self.loaded.config.caps.upstream_event_bytes)
            try:
                first = await anext(events, None)
                # Events that carry nothing for the client (Azure's prompt-filter chunk, an empty `choices`)
                # are not a start: the attempt is decided by the first one that does.
                while first is not None and not first.choices and first.usage is None:
                    first = await anext(events, None)
            except GatewayError:
                raise
            except Exception as exc:
                # Nothing reached the client yet: a first event that cannot be read is a failed attempt.
                raise _unreadable(route, "stream event", exc) from None
            if first is None:
                # Nothing reached the client yet: an empty stream is a failed attempt, retried like one.
                raise UpstreamError(
                    f"Upstream '{route.key}' ended the stream early",
                    code="upstream_stream_ended_early",
                    retryable=True,
                    cause="stream_ended_early",
                    target=route.key,
                    provider=route.provider,
                )
        except BaseException:
            stream.close()
            raise
        return Opened(events, first, stream, ctx=ctx)

    async def _relay(
        self,
        opened: Opened,
        req: CompletionRequest,
        ctx: CallContext,
        plan: Plan,
        route: Route,
        ticket: Ticket | None,
        rec: Record,
    ) -> AsyncIterator[bytes]:
        want_usage = bool(req.stream_options and req.stream_options.include_usage)
        quota = opened.quota
        expected = ctx.n * (len(ctx.prompts) if ctx.prompts else 1)
        usage: Usage | None = None
        text: list[str] = []
        sent = finished = 0
        resumed_from = 0  # tokens streamed before the current upstream took over
        try:
            while True:
                error: GatewayError | None = None
                try:
                    c = opened.first
                    while c is not None:
                        if c.usage is not None:
                            usage, c.usage = _sane_usage(c.usage), None
                        if c.choices:
                            for choice in c.choices:
                                text.append(choice.text)
                                finished += choice.finish_reason is not None
                            sent += 1
                            yield sse_event(encode(c))
                        c = await anext(opened.chunks, None)
                    if finished < expected and usage is None:
                        error = _stream_broke(
                            route, "ended the stream early", "upstream_stream_ended_early", "stream_ended_early"
                        )
                except GatewayError as exc:
                    error = exc
                except _UNREADABLE:
                    error = _stream_broke(
                        route, "sent an invalid stream event", "invalid_upstream_response", "invalid_response"
                    )
                except Exception:
                    # A bug (an adapter's, an emulation's): the client gets a generic error event and
                    # the end of the stream, never a traceback; the log gets the traceback.
                    log.exception("stream failed after it started (request %s)", rec.request_id)
                    error = _internal()
                if error is None:
                    break
                await opened.close()
                resumed = None
                # The gateway's own failure says nothing about the target: it neither cools nor resumes.
                if error.cools:
                    # A stream that broke mid-way is a failed target, resumed or not (a dropped connection cools).
                    await self.health.failure(route.key, None, "error")
                    if _resumable(plan, req, ctx):
                        resumed = await self._resume(plan, route, req, ctx, "".join(text), sent)
                if resumed is None:
                    yield _error_event(self.scrub.error(error))
                    break
                opened, route = resumed
                resumed_from = sent
            if usage is not None and resumed_from:
                # The continuation's prompt included the text already streamed: count it as output.
                usage = Usage(
                    prompt_tokens=max(usage.prompt_tokens - resumed_from, 0),
                    completion_tokens=usage.completion_tokens + resumed_from,
                    total_tokens=usage.total_tokens,
                    completion_tokens_details=usage.completion_tokens_details,
                    prompt_tokens_details=usage.prompt_tokens_details,
                )
            if want_usage and usage is not None:
                last = opened.ctx.completion([], usage)
                yield sse_event(encode(last))
        except Exception:
            log.exception("stream failed after it started (request %s)", rec.request_id)
            yield _error_event(_internal())
        finally:
            # Settle before awaiting anything: a client that left cancels this generator, and a cancelled
            # task may be cancelled again at its next await.
            # A finished stream is charged its reported usage; one cut short, its prompt and what it sent.
            rec.usage = usage
            for t in (ticket, quota):
                if t is not None:
                    self.admission.settle(t, usage.total_tokens if usage is not None else t.prompt + sent)
            try:
                await opened.close()
            except Exception:
                log.exception("closing a stream failed (request %s)", rec.request_id)
        # Every stream the client saw start ends with [DONE], whatever happened before it.
        yield DONE

    async def _resume(
        self, plan: Plan, broken: Route, req: CompletionRequest, ctx: CallContext, text: str, sent: int
    ) -> tuple[Opened, Route] | None:
        """Continue a broken stream on another target from the prompt plus the text already sent."""
        left = (16 if req.max_tokens is None else req.max_tokens) - sent
        if left <= 0:
            return None
        assert isinstance(req.prompt, str)
        cont = msgspec.structs.replace(req, prompt=req.prompt + text, max_tokens=left)
        offsets = dict(ctx.offsets)
        cont_ctx = msgspec.structs.replace(ctx, prompts=[cont.prompt], offsets=offsets)
        dropped: dict[str, list[str]] = {}

        async def open_stream(route: Route, timeouts: Timeouts) -> Opened:
            return await self._open_once(route, cont, cont_ctx, timeouts, dropped)

        try:
            outcome = await self.failover.run(plan, open_stream, discard=Opened.drop)
        except GatewayError:
            return None
        return outcome.value, outcome.route


async def _replay(chunks: list[Completion]) -> AsyncGenerator[Completion, None]:
    for c in chunks:
        yield c


def _fresh(ctx: CallContext) -> CallContext:
    """A context for one upstream call: attempts (and hedged pairs) never share parser state."""
    return msgspec.structs.replace(ctx, offsets={}, state={})


def _resumable(plan: Plan, req: CompletionRequest, ctx: CallContext) -> bool:
    # Only a single text continuation can be resumed by appending what was sent to the prompt.
    return (
        plan.policy.resume_streams
        and isinstance(req.prompt, str)
        and ctx.n == 1
        and not req.echo
        and req.logprobs is None
        and not req.suffix
    )


async def _events(
    adapter: Adapter, stream: Stream, ctx: CallContext, max_event_bytes: int
) -> AsyncGenerator[Completion, None]:
    """Upstream bytes -> normalized chunks, as they arrive."""
    decoder = DECODERS[adapter.framing](max_event_bytes=max_event_bytes)
    async for chunk in stream.chunks():
        for event, data in decoder.feed(chunk):
            c = adapter.parse_event(event, data, ctx)
            if c is not None:
                yield c
    for event, data in decoder.close():
        c = adapter.parse_event(event, data, ctx)
        if c is not None:
            yield c


def _served(rec: Record, plan: Plan, outcome: Outcome[Any]) -> None:
    route = outcome.route
    rec.provider, rec.target, rec.attempts = route.provider, route.key, outcome.attempts
    rec.fallback = all(r.key != route.key for r in plan.groups[0].routes)


def _headers(outcome: Outcome[Any], dropped: dict[str, list[str]]) -> dict[str, str]:
    route = outcome.route
    headers = {
        "x-gateway-provider": route.provider,
        "x-gateway-model": route.key,
        "x-gateway-attempts": str(outcome.attempts),
    }
    lost = dropped.get(route.key)
    if lost:
        headers["x-gateway-dropped-params"] = ",".join(lost)
    return headers


def _unreadable(route: Route, what: str, exc: Exception) -> UpstreamError:
    """An upstream answer the adapter could not read: a failed attempt (502), retried or failed over."""
    if not isinstance(exc, _UNREADABLE):
        log.error("parsing %s's %s failed", route.provider, what, exc_info=exc)
    return UpstreamError(
        f"Upstream '{route.key}' sent an invalid {what}",
        code="invalid_upstream_response",
        retryable=True,
        cause="invalid_response",
        target=route.key,
        provider=route.provider,
    )


def _stream_broke(route: Route, what: str, code: str, cause: str) -> UpstreamError:
    """A stream that broke after it started: the error event names the target and the cause."""
    return UpstreamError(
        f"Upstream '{route.key}' {what}",
        code=code,
        cause=cause,
        target=route.key,
        provider=route.provider,
    )


def _internal() -> GatewayError:
    return GatewayError("The gateway failed to process the request", code="internal_error", cools=False)


def _tokens(n: int) -> int:
    return n if 0 <= n <= MAX_REPORTED_TOKENS else (0 if n < 0 else MAX_REPORTED_TOKENS)


def _sane_usage(u: Usage) -> Usage:
    """Usage as the upstream reported it, unless a count is negative or absurd (then clamped)."""
    p, c, t = u.prompt_tokens, u.completion_tokens, u.total_tokens
    if 0 <= p <= MAX_REPORTED_TOKENS and 0 <= c <= MAX_REPORTED_TOKENS and p + c <= t <= MAX_REPORTED_TOKENS:
        return u  # the common case: one comparison chain, no new struct
    p, c = _tokens(p), _tokens(c)
    # A total below its parts would undercount what rate limits and budgets are charged.
    return msgspec.structs.replace(u, prompt_tokens=p, completion_tokens=c, total_tokens=max(_tokens(t), p + c))


def _sane(c: Completion) -> Completion:
    if c.usage is not None:
        c.usage = _sane_usage(c.usage)
    return c


def _error_event(exc: GatewayError) -> bytes:
    # Mid-stream, every dialect gets OpenAI's envelope: the seeds define no error event of their own.
    return sse_event(
        encode({"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}})
    )


# The end of a stream that failed after it started and before the relay could say so itself.
STREAM_FAILED = _error_event(_internal()) + DONE


def _text_prompts(req: CompletionRequest) -> list[str] | None:
    form = prompt_form(req.prompt)
    if form == "text":
        return [req.prompt]  # type: ignore[list-item]
    if form == "texts":
        return list(req.prompt)  # type: ignore[arg-type]
    return None
