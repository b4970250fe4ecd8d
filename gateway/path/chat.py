"""A chat request's attempts: the same job, failover loop, quotas and relay as a completion's, with the
adapter's chat route (providers/openai_chat.py) in place of its completion route.

A kind without one answers a 400 naming the provider before any I/O. Where the chat route lacks `n`, takes
fewer stop sequences than the request has, or does not decode a guided field, the attempt hands its own
`chat_call` / `chat_open` to gateway/emulation/chat.py, which fans the choices out, cuts the stops and
checks the guided output (docs/emulation.md).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, cast

import msgspec

from gateway.emulation import chat as emulation
from gateway.emulation.chat import ChatEmulation, ChatSubStream
from gateway.emulation.stops import Folded
from gateway.path.answers import MAX_REPORTED_TOKENS, answered, ignored_n, parsed, sane_usage
from gateway.path.attempt import Attempt, Job, _fresh
from gateway.path.echo import Lead, echoed, led, unechoed
from gateway.path.fanout import open_all
from gateway.path.opened import Opened
from gateway.upstream.plan import Group, Plan, Route
from providers.base import CallContext, LocalAdapter, map_params
from providers.chat_fields import NAMED_ROLES, role, unnamed
from providers.chat_params import STRICT, strict_unhonoured
from providers.openai_chat import (
    OpenAIChat,
    check_chat,
    chunks_from,
    from_completion,
    unsupported_endpoint,
)
from wire.chat import ChatChunk, ChatCompletion, ChatRequest, Delta
from wire.errors import UnsupportedParamError
from wire.messages import AssistantMessage, TextPart, render, text_parts
from wire.schema import CompletionRequest
from wire.upstream import UpstreamRequest


def _refused_or_dropped(route: Route, param: str, why: str, lost: list[str]) -> None:
    """A parameter the route's provider cannot carry: a 400 naming it, or with `unsupported_params: drop`
    listed among those dropped (as `map_params` treats a top-level one)."""
    if not route.drop_unsupported:
        raise UnsupportedParamError(param, route.provider, why)
    lost.append(param)


class ChatAttempt(Attempt):
    """One attempt of a chat job on one route: one upstream call to the kind's chat route, or an emulation's
    several."""

    __slots__ = ()
    resumes = False  # the continuation of a broken stream (ContinueAttempt)
    # A ChatJob's request, declared so: read on every attempt, where a `cast` is a call (the slot is Attempt's).
    req: ChatRequest

    def _adapter(self) -> OpenAIChat | LocalAdapter:
        adapter = self.route.adapter
        if adapter.chat_params is None or not (adapter.chat_route or adapter.in_process):
            raise unsupported_endpoint(self.route.provider, adapter.kind)
        return adapter  # type: ignore[return-value]  # its flags say which: not `cast`, a call per attempt

    def _plan(self) -> ChatEmulation | None:
        """The request checked against the route's chat table and bounds, and what must be emulated."""
        route = self.route
        adapter = self._adapter()
        req = self.req
        check_chat(adapter, req, route.provider)
        caps = self.services.caps
        if adapter.in_process:
            cast(LocalAdapter, adapter).admit(req, route.endpoint, caps)  # its work runs on the gateway's loop
        assert adapter.chat_params is not None
        em = emulation.plan(adapter, adapter.chat_params, req, route.provider, caps, self.services.guided_retries)
        if em is not None and em.guide is not None and req.continue_final_message:
            # The check would read the continuation without the message it continues.
            raise UnsupportedParamError(
                "continue_final_message",
                route.provider,
                f"Provider '{route.provider}' does not decode guided output, and the gateway cannot check a "
                "continued message's",
            )
        return em

    def _mapped(self, req: CompletionRequest) -> tuple[dict[str, Any], list[str]]:
        """`req`'s parameters mapped by the route's chat table (`_plan` checked it), and those dropped."""
        route = self.route
        adapter = route.adapter
        table = adapter.chat_params
        assert table is not None
        params, lost = map_params(req, table, route.provider, route.drop_unsupported)
        chat: ChatRequest = req  # type: ignore[assignment]  # an attempt of a ChatJob: not `cast`, a call
        # What the table's own rules cannot see, inside the messages and the tools, refused or dropped as they are.
        # The roles whose `name` the route carries (its flag says an OpenAIChat, without a call); an in-process kind
        # takes a name as any field. One that takes every role's (OpenAI's own set) needs no look at the messages.
        roles = adapter.chat_names if adapter.chat_route else NAMED_ROLES  # type: ignore[union-attr]
        if roles is not NAMED_ROLES and (i := unnamed(chat.messages, roles)) is not None:
            # The adapter builds its messages without the names it does not carry.
            why = (
                f"Provider '{route.provider}' takes no 'name' on a {role(chat.messages[i])} message "
                f"('messages[{i}].name'): send the conversation without it"
            )
            _refused_or_dropped(route, "messages.name", why, lost)
        if chat.tools and strict_unhonoured(chat.tools, table.get("tools")):
            why = (
                f"Provider '{route.provider}' cannot hold a tool call's arguments to the function's schema "
                f"for this request ('strict': true): send the tools without it"
            )
            _refused_or_dropped(route, STRICT, why, lost)
        return params, lost

    async def _charge_n(self, em: ChatEmulation) -> None:
        """The fan-out's calls beyond the one admission charged, all before the first is made."""
        if em.fan_n > 1 and self.admission is not None:
            here = await self.admission.charge_calls(self.route, em.fan_n - 1, "n")
            self.charged, self.own = em.fan_n - 1, (em.fan_n - 1 if here else 0)

    def ahead(self) -> tuple[UpstreamRequest, list[str]] | None:
        """The chat route's upstream request for the job's request, made before the attempt runs."""
        route = self.route
        if route.adapter.in_process or self._plan() is not None:
            return None
        adapter: OpenAIChat = route.adapter  # type: ignore[assignment]  # `_plan` checked it
        req = self.req
        if req.continue_final_message and adapter.chat_continue_strips:
            return None  # its message is trimmed when the attempt runs
        params, lost = self._mapped(req)
        return adapter.build_chat_request(req, route.endpoint, params), lost

    def complete(self) -> Coroutine[Any, Any, ChatCompletion]:
        req = self.req
        job = self.job
        made = job.made(self.route) if job.ahead is not None else None
        if made is not None:
            answer = self.chat_call(req, made)
        else:
            em = self._plan()
            answer = self.chat_call(req) if em is None else self._emulated(em, req)
        if req.echo_last and (text := echoed(req)):
            return led(answer, text)
        return answer

    async def _emulated(self, em: ChatEmulation, req: ChatRequest) -> ChatCompletion:
        await self._charge_n(em)
        try:
            work = self._work() if em.guide is not None else None
            return await emulation.complete(em, req, self.chat_call, self._chat_again, work)
        finally:
            self._unsent()

    async def _chat_again(self, req: ChatRequest, *, first: int = 0) -> ChatCompletion:
        """A guided output's retry: one more upstream call, charged before it is made."""
        await self._charge_again()
        return await self.chat_call(req, first=first)

    async def chat_call(
        self, req: ChatRequest, made: UpstreamRequest | None = None, *, first: int = 0
    ) -> ChatCompletion:
        """One upstream call for `req` (the request, or one of an emulation's sub-requests), buffered; `made`:
        its upstream request, made ahead (`Job.prepare`); `first`: the answer's index of the call's first choice
        (a fan-out's j-th call answers choice j). Called after `_plan`, which checked the route's kind."""
        route = self.route
        # A chat route, or an in-process kind (`_plan` checked which): not `cast`, a call per attempt.
        adapter: OpenAIChat = route.adapter  # type: ignore[assignment]
        pending = ""
        if made is None:
            params = self._prepare(req)
            if adapter.in_process:
                self.sent += 1
                return from_completion(
                    await cast(LocalAdapter, adapter).complete(req, route.endpoint, _call_ctx(self.ctx, first))
                )
            if req.continue_final_message:
                req, pending = trimmed(adapter, req)
            made = adapter.build_chat_request(req, route.endpoint, params)
        ctx = _call_ctx(self.ctx, first)
        body = await self.exchange(adapter, made)
        answer = parsed(route, adapter.parse_chat_response, body, ctx)
        asked = req.n or 1
        choices = answer.choices
        if asked != 1 or len(choices) != 1 or choices[0].index:  # the common answer takes no call to be checked
            answered(route, choices, asked, req.n, self.services.ignores_n)
        u = answer.usage
        # sane_usage's common case, inline, as `Attempt.call` has it: every answer passes here.
        if u is not None and not (
            0 <= u.prompt_tokens <= MAX_REPORTED_TOKENS
            and 0 <= u.completion_tokens <= MAX_REPORTED_TOKENS
            and u.prompt_tokens + u.completion_tokens <= u.total_tokens <= MAX_REPORTED_TOKENS
            and u.completion_tokens_details is None
            and u.prompt_tokens_details is None
        ):
            answer.usage = sane_usage(u)
        if pending:
            for ch in answer.choices:
                if isinstance(ch.message.content, str):
                    ch.message.content = _Trim(pending).text(ch.message.content)
        elif req.continue_final_message and adapter.chat_continue_repeats:
            _unrepeated(answer, req)
        return answer

    async def open(self) -> Opened:
        req = self.req
        job = self.job
        made = job.made(self.route) if job.ahead is not None else None
        if made is not None:
            opened = await self.chat_open(req, made)
        else:
            em = self._plan()
            # The common stream's call awaited from here: no coroutine between it and the failover loop.
            opened = await (self.chat_open(req) if em is None else self._emulated_open(em, req))
        if req.echo_last and (text := echoed(req)):
            opened.led = Lead(text)
            opened.rewrite(opened.led.lead)
        return opened

    async def _emulated_open(self, em: ChatEmulation, req: ChatRequest) -> Opened:
        if em.guide is not None:
            # Bytes sent cannot be taken back: a guided stream is made from an answer already checked.
            answer = await self._emulated(em, msgspec.structs.replace(req, stream=False, stream_options=None))
            chunks = emulation.replayed(answer)
            return Opened(chunks, await anext(chunks, None), ctx=self.ctx)
        await self._charge_n(em)
        try:
            subs = emulation.sub_requests(em, req)
            opens = await open_all([self.chat_open(s, first=j) for j, s in enumerate(subs)])
        finally:
            self._unsent()
        into = Folded()
        merged = emulation.stream(em, cast("list[ChatSubStream]", opens), into)
        return Opened(merged, await anext(merged, None), ctx=opens[0].ctx, children=opens, folded=into)

    async def chat_open(self, req: ChatRequest, made: UpstreamRequest | None = None, *, first: int = 0) -> Opened:
        """One upstream call for `req`, streamed: opened and read to its first event that carries something;
        `made`: its upstream request, made ahead (`Job.prepare`); `first`: as for `chat_call`. Called after `_plan`,
        which checked the route's kind."""
        route = self.route
        # A chat route, or an in-process kind (`_plan` checked which): not `cast`, a call per attempt.
        adapter: OpenAIChat = route.adapter  # type: ignore[assignment]
        pending = ""
        if made is None:
            params = self._prepare(req)
            if adapter.in_process:
                self.sent += 1
                ctx = _call_ctx(self.ctx, first)
                local = chunks_from(cast(LocalAdapter, adapter).stream(req, route.endpoint, ctx))
                return Opened(local, await anext(local, None), ctx=ctx)
            if req.continue_final_message:
                req, pending = trimmed(adapter, req)
        asked = req.n or 1
        if asked > 1 and route.key in self.services.ignores_n:
            raise ignored_n(route, asked, 1)
        if made is None:
            made = adapter.build_chat_request(req, route.endpoint, params)
        ctx = _call_ctx(self.ctx, first)
        self.sent += 1
        self.job.called = route
        stream = await self.services.upstream.open_stream(route.provider, made, self.timeouts, route.key)
        opened = await self.first_event(stream, adapter, adapter.parse_chat_event, adapter.chat_framing, ctx, asked)
        if pending or self.resumes:
            opened.rewrite(_GoingOn(pending, self.resumes).strip)
        return opened


def _call_ctx(ctx: CallContext, first: int) -> CallContext:
    """A context for one upstream call whose first choice is the answer's choice `first`."""
    fresh = _fresh(ctx)
    if first:
        fresh.first_choice = first
    return fresh


class ChatJob(Job):
    """A chat request as the failover loop sees it: a `Job` whose attempts call the chat route."""

    __slots__ = ()
    attempt = ChatAttempt


class ContinueAttempt(ChatAttempt):
    """An attempt of a broken chat stream's continuation: the conversation ends with the assistant message
    streamed so far, which the request asks the route to continue (`continue_final_message`)."""

    __slots__ = ()
    resumes = True

    def ahead(self) -> None:
        return None  # its request is the stream's conversation so far, made when the stream broke


def trimmed(adapter: OpenAIChat, req: ChatRequest) -> tuple[ChatRequest, str]:
    """`req` as a route that refuses a continued message ending in white space takes it, and that white
    space, which the continuation's own leading white space must not repeat."""
    last = req.messages[-1]
    if not adapter.chat_continue_strips or not isinstance(last.content, str):
        return req, ""
    kept = last.content.rstrip()
    pending = last.content[len(kept) :]
    if pending:
        req = msgspec.structs.replace(req, messages=[*req.messages[:-1], AssistantMessage(content=kept)])
    return req, pending


def _unrepeated(answer: ChatCompletion, req: ChatRequest) -> None:
    """The continuation alone in each choice of a route that answers a continued message with the message
    before it (llama-server, buffered: the text it parsed, its parts joined by blank lines), as its stream
    and every other route give it; a choice that does not begin with it is left as it came."""
    content = text_parts(req.messages[-1].content, "\n\n")
    if not content:
        return
    for ch in answer.choices:
        text = ch.message.content
        if isinstance(text, str) and text.startswith(content):
            ch.message.content = text[len(content) :]


class _Trim:
    """The continuation's text with its leading white space that the trimmed message held taken off, over
    as many pieces as it comes in."""

    __slots__ = ("pending",)

    def __init__(self, pending: str) -> None:
        self.pending = pending

    def text(self, content: str) -> str:
        k = 0
        while k < len(self.pending) and k < len(content) and content[k] == self.pending[k]:
            k += 1
        self.pending = self.pending[k:] if k == len(content) else ""
        return content[k:]


class _GoingOn:
    """A continued message's chunks as the client's stream: without the white space the message was sent
    without, and, for a broken stream's continuation (`resumes`), no second `role` or prompt ids."""

    __slots__ = ("resumes", "trim")

    def __init__(self, pending: str, resumes: bool) -> None:
        self.trim = _Trim(pending) if pending else None
        self.resumes = resumes

    def strip(self, c: ChatChunk) -> ChatChunk:
        out = []
        resumes = self.resumes
        for ch in c.choices:
            d = ch.delta
            content = d.content
            if self.trim is not None and content:
                content = self.trim.text(content)
                if not self.trim.pending:
                    self.trim = None
            if (resumes and d.role is not None) or content != d.content:
                d = msgspec.structs.replace(d, role=None if resumes else d.role, content=content or None)
            if resumes and d == _EMPTY and ch.finish_reason is None and ch.logprobs is None and not ch.token_ids:
                continue  # the continuation's role chunk: the client's stream already began
            out.append(ch if d is ch.delta else msgspec.structs.replace(ch, delta=d))
        c.choices = out
        if resumes:
            c.prompt_token_ids = None  # the continuation's prompt: the client's stream gave the conversation's
        return c


_EMPTY = Delta()


class ContinueJob(ChatJob):
    """The continuation of a broken chat stream (gateway/path/relay.py `Relay.resume`)."""

    __slots__ = ()
    attempt = ContinueAttempt


def _continues(route: Route, req: ChatRequest) -> bool:
    adapter = route.adapter
    return isinstance(adapter, OpenAIChat) and adapter.chat_params is not None and adapter.continues(req)


def continuation(job: Job, text: str, left: int | None) -> ContinueJob | None:
    """The job that continues a chat stream broken after `text`, on the plan's targets whose chat route can
    continue an assistant message; None when none can (the stream then ends with its error)."""
    req = cast(ChatRequest, job.req)
    groups = []
    for g in job.plan.groups:
        kept = [(r, w) for r, w in zip(g.routes, g.weights, strict=True) if _continues(r, req)]
        if kept:
            groups.append(Group([r for r, _ in kept], [w for _, w in kept], g.strategy))
    if not groups:
        return None
    messages = list(req.messages)
    if req.echo_last:
        text = unechoed(req, text)  # the client has its echo: the continuation goes on from what was generated
    if req.continue_final_message:  # the client's own prefill, continued: the stream so far extends it
        content = messages[-1].content
        if isinstance(content, str):
            messages[-1] = AssistantMessage(content=content + text)
        elif isinstance(content, list) and content and isinstance(content[-1], TextPart):
            messages[-1] = AssistantMessage(content=[*content[:-1], TextPart(content[-1].text + text)])
        else:
            return None
    else:
        messages.append(AssistantMessage(content=text))
    cont = msgspec.structs.replace(
        req,
        messages=messages,
        prompt=render(messages),
        max_tokens=left,
        continue_final_message=True,
        add_generation_prompt=None,
        echo_last=None,
        open_calls=None,  # the stream so far follows any calls the conversation ended on
    )
    # No admission of the request's own (its ticket covers the stream); the continuation's target's quota is
    # charged when the failover loop reaches it, as for any attempt.
    again = ContinueJob(job.services, job.admission, cont, job.ctx, Plan(groups, job.plan.policy))
    again.ask = job.ask  # the continuation waits for (and holds) a slot of its own, as the same tenant
    again.hint = job.hint  # and is the same tenant's to a fleet: its replica, and its engine's cache salt
    return again


__all__ = ["ChatAttempt", "ChatJob", "ContinueJob", "continuation"]
