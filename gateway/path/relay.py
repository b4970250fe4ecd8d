"""A started stream, relayed to the client event by event, and resumed elsewhere if it breaks.

Once a stream's first event has been read the failover loop is done with the request: bytes reach the
client and nothing can be taken back. What can still go wrong is handled here: an error or an early end
becomes an error event, and with `resume_streams` a single text continuation is reopened on another
target from the prompt plus the text already sent (docs/resilience.md, Streams). Every stream the client
saw start ends with [DONE], and its admission is settled and its target's in-flight count
given back (the stream counted from its attempt's start) whatever happened.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, cast

import msgspec

from gateway.limits.admission import Admission, Ticket
from gateway.limits.budgets import STREAM_CHECK_EVENTS, Hold
from gateway.ops.metrics import Record
from gateway.path.answers import UNREADABLE, choices_asked, failed_attempt, ignored_n, sane_usage
from gateway.path.attempt import Job
from gateway.path.chat import continuation
from gateway.path.dialects import OPENAI
from gateway.path.lost import estimated, losses
from gateway.path.opened import Opened
from gateway.path.services import Services
from gateway.resilience.failover import Failover
from gateway.resilience.health import Health
from gateway.upstream.framing import DONE, sse_event
from gateway.upstream.plan import Route
from gateway.upstream.scrub import Scrubber
from providers.envelope import Unreadable
from providers.openai_chat import usage_chunk
from wire.chat import ChunkChoice
from wire.errors import GatewayError, UpstreamError, UpstreamStatusError
from wire.schema import CompletionRequest, Usage, encode

log = logging.getLogger("gateway")


def internal() -> GatewayError:
    """The gateway's own failure: says nothing about the target, so it neither cools nor resumes."""
    return GatewayError("The gateway failed to process the request", code="internal_error", cools=False)


def error_event(exc: GatewayError) -> bytes:
    # Mid-stream, every dialect gets OpenAI's envelope: the seeds define no error event of their own.
    return sse_event(OPENAI.error(exc)[1])


# The end of a stream that failed after it started and before the relay could say so itself.
STREAM_FAILED = error_event(internal()) + DONE


def shutdown_cut() -> GatewayError:
    """A request still running when the drain deadline (`server.shutdown_grace_ms`) cut it."""
    return GatewayError(
        "The gateway is shutting down and cut the request at its drain deadline; retry it",
        code="shutdown_deadline_exceeded",
        status=503,
        type="service_unavailable",
        cools=False,
    )


# The end of a stream cut at the drain deadline: the client learns why, and sees the stream end.
STREAM_CUT = error_event(shutdown_cut()) + DONE


def _resumable(job: Job) -> bool:
    # Only a single text continuation can be resumed by appending what was sent to the prompt (on chat: as
    # the assistant message the continuation goes on with). A client of token ids or logprobs reads what the
    # model sampled given its prompt's tokens; a continuation samples given the text re-tokenized, so such a
    # stream ends at its break instead.
    req = job.req
    return (
        job.plan.policy.resume_streams
        and isinstance(req.prompt, str)
        and job.ctx.n == 1
        and not req.echo
        and req.logprobs is None
        and not req.return_token_ids
        and not req.suffix
    )


class Held:
    """What an opened stream holds (the request's admission, the target's quota, its in-flight count, the
    upstream connection) until the relay's first step takes it over.

    The relay gives all of it back in its `finally`, but an async generator that never ran its first step
    never runs its `finally` either: a client that leaves between the response start and that step (its
    disconnect cancels the relay's task before the task ever ran) would leave it all held. The endpoint
    calls `release` in its own `finally`; it does nothing once the relay has begun.
    """

    __slots__ = ("relay", "opened", "job", "request_id", "taken")

    def __init__(self, relay: Relay, opened: Opened, job: Job, request_id: str) -> None:
        self.relay = relay
        self.opened = opened
        self.job = job
        self.request_id = request_id
        self.taken = False  # the relay began: its `finally` gives everything back

    async def release(self) -> None:
        if self.taken:
            return
        self.taken = True
        job, opened = self.job, self.opened
        if job.cached is not None:
            job.cached.abandon()  # whoever waits on this answer asks for itself
        # Nothing was sent: the prompt is all it used.
        await self.relay.give_back(job, opened.quota, opened, None, 0, self.request_id)


class Relay:
    """Built once per pipeline: what relaying and resuming streams use."""

    __slots__ = ("services", "admission", "health", "failover", "scrub")

    def __init__(
        self, services: Services, admission: Admission, health: Health, failover: Failover, scrub: Scrubber
    ) -> None:
        self.services = services
        self.admission = admission
        self.health = health
        self.failover = failover
        self.scrub = scrub

    async def stream(
        self, opened: Opened, route: Route, job: Job, rec: Record, held: Held | None = None
    ) -> AsyncIterator[bytes]:
        """The client's stream: `opened`'s events as SSE bytes, then the usage chunk if asked (or, on a route whose
        dialect says so, the usage on the chunk that finishes the last choice, held until the upstream ends), then
        [DONE]."""
        if held is not None:
            held.taken = True  # from here on this generator's `finally` gives everything back
        req, ctx = job.req, job.ctx
        want_usage = bool(req.stream_options and req.stream_options.include_usage)
        on_last = ctx.usage_last and not want_usage
        last: Any = None  # with `on_last`, the chunk that finished the last choice: sent with the usage
        quota = opened.quota
        expected = ctx.n if ctx.chat else choices_asked(req)
        cached = job.cached  # the response cache's part (gateway/cache): None unless this stream may be stored
        # While the client takes an event, the time it began: requests waiting for this stream's answer
        # (gateway/cache/inflight.py) stop waiting on a client that takes none for a while.
        now = asyncio.get_running_loop().time
        clean = True  # neither failed nor resumed: only such a stream is stored
        usage: Usage | None = None
        # The text sent so far, which a resumed stream continues from: kept only when it may be resumed, so
        # that a long stream holds nothing of what it relayed.
        text: list[str] | None = [] if _resumable(job) else None
        # What a continuation carries back upstream is bounded as an emulation's copies are: beyond it, the
        # text is let go and the stream is no longer resumed (a chat stream may have no token limit).
        room = self.services.caps.emulated_answer_bytes
        sent = finished = 0
        # Of those sent, chat chunks that carry no token (the role's), less the tokens an emulation's stops held
        # back and sent inside a later chunk: `sent - blank` is what the client has, as a continuation counts it.
        blank = 0
        top = -1  # the highest choice index seen
        ended: set[int] = set()  # the choices whose finish came: each counted once, however often it is sent
        resumed_from = 0  # tokens streamed before the current upstream took over
        resumes = 0  # continuations opened or tried
        unsent = 0  # chunks the stops held back when the last upstream broke: generated, never sent
        # A budgeted stream is charged as it runs past its reservation, so the next admissions stop before it ends.
        hold = cast("Hold | None", rec.hold)
        try:
            while True:
                error: GatewayError | None = None
                try:
                    c = opened.first
                    while c is not None:
                        if c.usage is not None:
                            usage, c.usage = sane_usage(c.usage), None
                        if c.choices:
                            for choice in c.choices:
                                if text is not None:
                                    if ctx.chat and _not_text(choice):  # type: ignore[arg-type]  # a chat chunk's
                                        text = None  # tool calls or thinking: not continued as text (`_not_text`)
                                    else:
                                        text.append(choice.text)
                                        blank += ctx.chat and not choice.text and choice.finish_reason is None
                                        room -= len(choice.text)
                                        if room < 0:
                                            text = None
                                if choice.finish_reason is not None and choice.index not in ended:
                                    ended.add(choice.index)
                                    finished += 1
                                if not -1 < choice.index <= top:  # a choice not seen before: numbered in range?
                                    if not -1 < choice.index < expected:
                                        raise Unreadable(f"a choice numbered {choice.index} of {expected}")
                                    top = choice.index
                            sent += 1
                            if hold is not None and not sent % STREAM_CHECK_EVENTS:
                                hold.streamed(sent)
                            if cached is not None:
                                # A completion or a chat chunk (gateway/cache/chat.py); not `cast`: a call per event.
                                cached.chunk(c)  # type: ignore[arg-type]
                                cached.blocked = now()
                            if on_last and finished >= expected:
                                if last is not None:  # a chunk after the last finish: the one before goes on
                                    yield sse_event(encode(last))
                                last = c  # the usage comes with it or after it, before the upstream's end
                            else:
                                yield sse_event(encode(c))
                            if cached is not None:
                                cached.blocked = 0.0
                        c = await anext(opened.chunks, None)
                    if finished < expected and ctx.n > 1 and finished == top + 1:
                        # Every choice it started, it finished: it answered fewer than `n` asked for, the same
                        # failure as an unstreamed answer's, and the next stream with n > 1 fails before its start.
                        self.services.ignores_n.add(route.key)
                        error = ignored_n(route, expected, finished)
                    elif finished < expected:
                        # A choice never finished: whatever came before the end (a usage chunk, `[DONE]`), the
                        # generation did not end, as a buffered answer's choice without a finish reason did not.
                        error = failed_attempt(
                            route, "ended the stream early", "upstream_stream_ended_early", "stream_ended_early"
                        )
                except GatewayError as exc:
                    # Kept without a traceback on it or on what it chains, which hold this frame (and through it
                    # `error`): a cycle the collector alone would free, at every stream that breaks after it started.
                    error = exc.detached()
                    if error.target is None and isinstance(error, UpstreamError):
                        error.target, error.provider = route.key, route.provider  # the framing's errors name none
                except UNREADABLE:
                    # Judged as the same failure before the first event is: evidence against the target.
                    error = failed_attempt(
                        route, "sent an invalid stream event", "invalid_upstream_response", "invalid_response"
                    )
                except Exception:
                    # A bug (an adapter's, an emulation's): the client gets a generic error event and
                    # the end of the stream, never a traceback; the log gets the traceback.
                    log.exception("stream failed after it started (request %s)", rec.request_id)
                    error = internal()
                if error is None:
                    break
                clean = False
                if finished >= expected:
                    # Every choice ended before the break (a connection dropped before the usage chunk or
                    # [DONE]): the answer is whole. It ends as a finished stream, not resumed (a continuation
                    # would add text after the finish), not failed, not stored (its usage may be estimated).
                    break
                await self.release(opened)
                await opened.close()
                if opened.folded is not None:
                    # Read once, at the break: nothing per chunk. What the stops still held was never sent, so
                    # the continuation, which goes on from the text sent, generates it anew; the broken target
                    # generated it all the same, and is paid for it.
                    blank -= opened.folded.tokens
                    unsent = opened.folded.held
                if opened.led is not None:
                    blank += opened.led.blank  # a role chunk the echo gave text to: still no token
                resumed = None
                # The gateway's own failure says nothing about the target: it neither cools nor resumes.
                if error.cools:
                    # Judged as a failed attempt is, resumed or not: a dropped connection cools at once; a 5xx, a
                    # read timeout or an unreadable event on evidence; the client's own deadline never.
                    await self.failover.broke(
                        job.plan,
                        route,
                        error,
                        deadline_s=job.deadline_s,
                        tenant=rec.key_id or rec.key,
                        client_headers=bool(req.inference_extra_headers),
                    )
                    # At most `retries.attempts` continuations: else targets that each break after a token (a
                    # chat without `max_tokens` has no count to run out) would be bounced between until the deadline.
                    if text is not None and not _refused(error) and resumes < job.plan.policy.retries.attempts:
                        resumes += 1
                        resumed = await self.resume(job, "".join(text), sent - blank, rec, route.key)
                if resumed is None:
                    _book_failure(rec, route, error)
                    if cached is not None:
                        cached.abandon()  # nothing to store: whoever waits asks for itself, not after the client
                    yield error_event(self.scrub.error(error))
                    want_usage = on_last = False  # the error event ends what the client reads
                    break
                streamed = sent - blank - resumed_from + unsent  # by the target that broke
                parts = rec.parts if rec.parts is not None else []
                parts.append((route.key, estimated(job, 0).prompt_tokens + resumed_from, streamed))
                rec.parts = parts
                opened, route, attempts = resumed
                rec.attempts += attempts  # the continuation's upstream calls count as the request's
                rec.provider, rec.target = route.provider, route.key  # who finishes it
                if quota is not None:
                    # The broken attempt's target quota is settled with what it used there (its prompt and the
                    # chunks it streamed); the continuation's own, charged where it resumed, at the stream's end.
                    self.admission.settle(quota, quota.prompt + streamed)
                quota = opened.quota
                resumed_from = sent - blank
                unsent = 0  # in the broken target's part
            if usage is not None and resumed_from:
                # The continuation's prompt included the text already streamed: count it as output.
                usage = Usage(
                    prompt_tokens=max(usage.prompt_tokens - resumed_from, 0),
                    completion_tokens=usage.completion_tokens + resumed_from,
                    total_tokens=usage.total_tokens,
                    completion_tokens_details=usage.completion_tokens_details,
                    prompt_tokens_details=usage.prompt_tokens_details,
                )
            if last is not None:
                yield sse_event(encode(msgspec.structs.replace(last, usage=usage)))
                last = None
            elif (want_usage or on_last) and usage is not None:
                if cached is not None:
                    cached.blocked = now()
                yield sse_event(encode(usage_chunk(opened.ctx, usage)))
                if cached is not None:
                    cached.blocked = 0.0
            if cached is not None and clean:
                await cached.finish(usage, (route.provider, route.key))
        except Exception:
            log.exception("stream failed after it started (request %s)", rec.request_id)
            _book_failure(rec, route, internal())
            if cached is not None:
                cached.abandon()
            if last is not None:
                yield sse_event(encode(last))  # generated and counted: the client gets it, without the usage
            yield error_event(internal())
        finally:
            if cached is not None:
                cached.abandon()  # a stream cut or failed (a stored one let go of its waiters already)
            # Settle before awaiting anything: a client that left cancels this generator, and a cancelled
            # task may be cancelled again at its next await.
            # A finished stream is charged its reported usage; one cut short, or one whose upstream reports
            # none (llama-cpp-python's), the gateway's estimate: its prompt, and what it sent.
            if usage is None and sent:
                usage = estimated(job, sent + unsent)
                rec.usage_estimated = True
            rec.usage = usage
            await self.give_back(job, quota, opened, usage, sent, rec.request_id)
        # Every stream the client saw start ends with [DONE], whatever happened before it.
        yield DONE

    async def give_back(
        self, job: Job, quota: Ticket | None, opened: Opened, usage: Usage | None, sent: int, request_id: str
    ) -> None:
        """A stream's end, however it came: the request's ticket and the target's quota settled with what it
        used (its usage, or its prompt and the events sent), its in-flight count given back and its upstream
        response closed, so the connection never goes back to the pool half-read."""
        # Settled before anything is awaited: a cancelled task may be cancelled again at its next await.
        for t in (job.ticket, quota):
            if t is not None:
                self.admission.settle(t, usage.total_tokens if usage is not None else t.prompt + sent)
        try:
            try:
                # Its slot and local count first: synchronous, before any await.
                await self.release(opened, usage.total_tokens if usage is not None else None)
            finally:
                await opened.close()  # even if the shared count's write was cancelled
        except Exception:
            log.exception("closing a stream failed (request %s)", request_id)

    async def release(self, opened: Opened, used: int | None = None) -> None:
        """Give back the server slot and the in-flight count `opened` holds on its target, once: the stream has
        ended, having used `used` tokens (None: not known)."""
        slot = opened.slot
        if slot is not None:
            opened.slot = None
            slot.done(used)
        target = opened.held
        if target is not None:
            opened.held = None
            await self.health.inflight(target, -1)

    async def resume(
        self, job: Job, text: str, sent: int, rec: Record, broken: str | None = None
    ) -> tuple[Opened, Route, int] | None:
        """Continue a broken stream on another target (not `broken`, where it broke) from the prompt plus the
        text already sent (a chat stream: from the conversation plus the assistant message sent so far, where a
        target can continue it), within what is left of the request's deadline; with the upstream calls made."""
        req, ctx = job.req, job.ctx
        time_left = job.until - self.failover.clock()
        if time_left <= 0:
            return None
        # Chat's limit is optional (none: the provider's own): the continuation then has none either.
        limit = req.max_tokens if req.max_tokens is not None or ctx.chat else 16
        left = None if limit is None else limit - sent
        if left is not None and left <= 0:
            return None
        again: Job | None
        if ctx.chat:
            again = continuation(job, text, left)
            if again is None:
                return None
        else:
            assert isinstance(req.prompt, str)
            cont: CompletionRequest = msgspec.structs.replace(req, prompt=req.prompt + text, max_tokens=left)
            cont_ctx = msgspec.structs.replace(ctx, prompts=[cont.prompt], offsets=dict(ctx.offsets))
            # No admission of the request's own (its ticket covers the stream), but the continuation's target's
            # quota is charged when the failover loop reaches it, as for any attempt.
            again = Job(self.services, job.admission, cont, cont_ctx, job.plan)
            again.ask = job.ask  # the continuation waits for (and holds) a slot of its own, as the same tenant
            again.hint = job.hint  # and is the same tenant's to a fleet: its replica, and its engine's cache salt
        try:
            outcome = await self.failover.run(
                again.plan,
                again.open,
                deadline_s=time_left,  # the request's own deadline, not a new total_ms
                discard=again.discard,
                keep=again.keep,  # the continuation counts in flight on its own target
                tenant=rec.key_id or rec.key,
                client_headers=bool(req.inference_extra_headers),
                hint=job.hint,  # a replicated provider's policy keys the continuation as the request
                avoid=broken,  # whether or not the break cooled it
                lost=losses(again, rec),  # a hedged continuation's loser: the request's too
            )
        except GatewayError as exc:
            rec.attempts += exc.attempts or 0  # calls made before the continuation gave up: the request's too
            return None
        return outcome.value, outcome.route, outcome.attempts


def _refused(error: GatewayError) -> bool:
    """An error event that refuses the request itself (invalid, over the model's context window, filtered):
    its continuation would be refused too, wherever it went, as the failover loop would try no other target
    for it before the first event. Transport failures, timeouts and an early end are breaks, resumed."""
    return isinstance(error, UpstreamStatusError) and not error.retryable and not error.elsewhere


def _not_text(choice: ChunkChoice) -> bool:
    """A chat chunk a continuation could not carry back as the assistant message's text: tool calls, a
    refusal, or the model's thinking. A continuation carries text alone: after thinking, the next target
    would be asked to continue an empty message, its limit not reduced by the thinking the client has, and
    the client would read a second thinking after the first. Only a non-empty field counts: servers that
    send an empty or null one beside every content piece stay resumable."""
    delta = choice.delta
    return bool(delta.tool_calls or delta.refusal or delta.reasoning_content or delta.thinking_blocks)


def _book_failure(rec: Record, route: Route, error: GatewayError) -> None:
    """The access log, metrics and span of a stream that ended in an error event: counted as the failure it
    is (the status its error would have had, its code and cause, the target that broke), not as the 200 the
    client saw when the stream started."""
    rec.status, rec.error_code, rec.cause = error.status, error.code, error.cause
    # Not `failed`: this target did serve what the client received (its usage and first event count).
    rec.provider, rec.target = route.provider, route.key
