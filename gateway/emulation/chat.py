"""Chat emulation: `n` fanned out for a chat route that lacks it, stop sequences beyond the provider's
count (or every stop, for a provider that keeps the one it matched) cut from the assistant's content by the
gateway, buffered and streamed, and guided output the route does not decode checked (docs/emulation.md).

The same rules as completions': one call per choice, choice `index` = the call's place, usage summed; the
provider is sent the first `max_stop` stops and the gateway finds all of them with one automaton, holding
back in a stream only what could still start one. A choice cut at a stop ends there: `finish_reason`
`stop`, and the tool calls it would have made after that text are not made. Guided output (`guided_json`,
`guided_regex`, `guided_choice`) goes through completions' own check and retry (combine.py `checked`) on
each choice's `message.content`; a guided stream is made from an answer already checked.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from typing import Protocol

import msgspec

from gateway.config import CapsConfig
from gateway.emulation.client_schema import Work
from gateway.emulation.combine import _add, _scan, checked, gather, ready, summed
from gateway.emulation.merge import merged, own_choice
from gateway.emulation.planning import _DEFAULT_CAPS, Guide, bound_stops, make_guide
from gateway.emulation.seeds import reseeded
from gateway.emulation.stops import Folded, StopMatcher, StopScanner
from providers.base import Capabilities, Param
from wire.chat import (
    ChatChoice,
    ChatChunk,
    ChatCompletion,
    ChatLogprobs,
    ChatMessage,
    ChatRequest,
    ChunkChoice,
    Delta,
    TokenLogprob,
    answer_chunks,
)
from wire.errors import InvalidRequestError
from wire.messages import AssistantMessage, ImagePart, Message
from wire.schema import Usage


class ChatCall(Protocol):
    """One upstream call of the attempt for one chat (sub-)request; `first`: the answer's index of the call's
    first choice (a fan-out's j-th call answers choice j), which the tool call ids the gateway makes carry."""

    def __call__(self, req: ChatRequest, /, *, first: int = 0) -> Awaitable[ChatCompletion]: ...


def _nth(call: ChatCall, first: int) -> Callable[[ChatRequest], Awaitable[ChatCompletion]]:
    """`call` for the fan-out's call that answers choice `first` (and its guided retries)."""
    return lambda sub: call(sub, first=first)


class ChatSubStream(Protocol):
    """One opened sub-call's stream: its first chunk, then the rest."""

    @property
    def first(self) -> ChatChunk | None: ...

    @property
    def chunks(self) -> AsyncIterator[ChatChunk]: ...


class ChatEmulation(msgspec.Struct):
    fan_n: int  # calls (1 when the provider takes n natively)
    n: int  # choices the client asked for
    stops: list[str] | None  # enforced here
    matcher: StopMatcher | None
    upstream_stop: list[str] | None  # what the provider is sent
    guide: Guide | None = None  # guided output the gateway checks
    guided_retries: int = 0


def plan(
    adapter: Capabilities,
    table: Mapping[str, Param],
    req: ChatRequest,
    provider: str,
    caps: CapsConfig,
    retries: int = 0,
) -> ChatEmulation | None:
    """What the gateway does for this chat request on this provider; None when the provider does it all.
    Refuses (400 naming the field) what would make the gateway work beyond `caps`. `retries`: a guided
    output's further calls (config `guided_retries`)."""
    n = req.n or 1
    stop = req.stop if isinstance(req.stop, list) else None
    limit = adapter.max_stop
    too_many = stop is not None and limit is not None and len(stop) > limit
    # A provider that keeps the matched stop in its text (TGI; models behind Bedrock's Converse) still gets
    # every stop, to end early; the gateway removes what it kept.
    kept = bool(stop) and adapter.stop_in_output
    guided = (
        req.guided_json is not None
        or req.guided_regex is not None
        or req.guided_choice is not None
        or req.guided_grammar is not None
    )
    if n == 1 and not too_many and not kept and not guided:
        return None  # the common case: a few comparisons
    guide = make_guide(table, req, provider, caps) if guided else None
    rule = table.get("n")
    fan_n = n if n > 1 and rule is not None and (rule.emulated or n > adapter.max_n) else 1
    stops: list[str] | None = None
    upstream = stop
    if too_many:
        assert stop is not None and limit is not None
        stops, upstream = stop, stop[:limit] or None
    elif kept:
        stops = stop
    if fan_n == 1 and stops is None and guide is None:
        return None
    found = bound_stops(stops, provider, caps) if stops is not None else None
    if fan_n > 1:
        _bound_fan_out(req.messages, fan_n, caps.emulated_answer_bytes)
    return ChatEmulation(
        fan_n=fan_n, n=n, stops=stops, matcher=found, upstream_stop=upstream, guide=guide, guided_retries=retries
    )


def _bound_fan_out(messages: list[Message], calls: int, limit: int) -> None:
    """Each call of a fan-out carries the whole conversation (images' data URLs too): bounded before any."""
    size = 0
    for m in messages:
        content = m.content
        if isinstance(content, str):
            size += len(content)
        elif content is not None:
            for part in content:
                size += len(part.image_url.url) if isinstance(part, ImagePart) else len(getattr(part, "text", ""))
        if isinstance(m, AssistantMessage):
            size += sum(len(c.function.arguments) for c in m.tool_calls or ())
    if size * calls > limit:
        raise InvalidRequestError(
            f"'n' would make the gateway send {size * calls} bytes of the conversation (one call per choice); "
            f"at most {limit} are allowed",
            param="n",
            code="invalid_value",
        )


def sub_requests(em: ChatEmulation, req: ChatRequest) -> list[ChatRequest]:
    """The upstream calls: `fan_n` copies asking for one choice each, with the stops the provider takes."""
    sub = msgspec.structs.replace(req, n=None if em.fan_n > 1 else req.n, stop=em.upstream_stop)
    if em.guide is not None:
        sub = msgspec.structs.replace(sub, guided_json=None, guided_regex=None, guided_choice=None)
    return [reseeded(sub, j) for j in range(em.fan_n)]  # each its own seed (gateway/emulation/seeds.py)


def _cut_tokens(lp: ChatLogprobs | None, keep: int) -> ChatLogprobs | None:
    """Token logprobs for the first `keep` characters of the content."""
    if lp is None or lp.content is None:
        return lp
    out: list[TokenLogprob] = []
    used = 0
    for tok in lp.content:
        if used >= keep:
            break
        piece = tok.token[: keep - used]
        out.append(msgspec.structs.replace(tok, token=piece) if piece != tok.token else tok)
        used += len(piece)
    return ChatLogprobs(content=out, refusal=lp.refusal)


async def _cut(choice: ChatChoice, stops: StopMatcher) -> ChatChoice:
    content = choice.message.content
    if not content:
        return choice
    sent, stopped = await _scan(StopScanner(stops, False), content)
    if not stopped:
        return choice
    message = ChatMessage(
        role="assistant",
        content=sent,
        refusal=choice.message.refusal,
        reasoning_content=choice.message.reasoning_content,
        thinking_blocks=choice.message.thinking_blocks,
    )
    return ChatChoice(choice.index, message, "stop", _cut_tokens(choice.logprobs, len(sent)))


def _contents(answer: ChatCompletion) -> list[str]:
    """What a guided chat answer's check reads: each choice's content (a filtered choice, or a refusal, has
    none to check: it is the model saying it will not answer)."""
    return [
        ch.message.content or ""
        for ch in answer.choices
        if ch.finish_reason != "content_filter" and ch.message.refusal is None
    ]


async def complete(
    em: ChatEmulation, req: ChatRequest, call: ChatCall, again: ChatCall | None = None, work: Work | None = None
) -> ChatCompletion:
    """The sub-calls' answers as one: each checked against the guide (and asked again), choices re-indexed
    and cut at the stops, usage summed. `again` makes a guided retry (charged as it is made); `work`: what
    checking may spend, the request's."""
    subs = sub_requests(em, req)
    if em.guide is not None:
        await ready(em.guide)
        spend = work if work is not None else Work(_DEFAULT_CAPS.guided_work)
        retry = again or call
        results = await gather(
            [
                checked(em.guide, em.guided_retries, s, _nth(call, j), _nth(retry, j), spend, _contents, em.fan_n)
                for j, s in enumerate(subs)
            ]
        )
    else:
        results = await gather([call(sub, first=j) for j, sub in enumerate(subs)])
    choices: list[ChatChoice] = []
    usage: Usage | None = None
    fingerprint = None
    for j, answer in enumerate(results):
        usage = _add(usage, answer.usage)
        fingerprint = fingerprint or answer.system_fingerprint
        for ch in sorted(answer.choices, key=lambda c: c.index):
            if em.matcher is not None:
                ch = await _cut(ch, em.matcher)
            index = j if em.fan_n > 1 else ch.index
            choices.append(ch if index == ch.index else msgspec.structs.replace(ch, index=index))
    first = results[0]
    return ChatCompletion(
        id=first.id,
        created=first.created,
        model=first.model,
        choices=choices,
        system_fingerprint=fingerprint,
        usage=usage,
        prompt_token_ids=first.prompt_token_ids,  # every call's prompt is the same conversation
        prompt_logprobs=first.prompt_logprobs,
    )


class _Choices:
    """The stream's per-choice state: each choice's stop scanner, and the choices already finished."""

    __slots__ = ("em", "scanners", "done", "into", "cut")

    def __init__(self, em: ChatEmulation, into: Folded) -> None:
        self.em = em
        self.scanners: dict[int, StopScanner] = {}
        self.done: set[int] = set()
        self.into = into  # the chunks the stops held back and sent inside a later one
        self.cut = False  # a choice the stops ended while its upstream still generates it

    async def relay(self, ch: ChunkChoice, index: int) -> ChunkChoice | None:
        """The choice as the client gets it (re-indexed, cut at a stop), or None when nothing is left of it."""
        if index in self.done:
            return None
        delta, finish, lp, ids, why = ch.delta, ch.finish_reason, ch.logprobs, ch.token_ids, ch.stop_reason
        matcher = self.em.matcher
        if matcher is not None:
            scanner = self.scanners.get(index)
            if scanner is None:
                scanner = self.scanners[index] = StopScanner(matcher, False)
            content = delta.content or ""
            safe, stopped = await _scan(scanner, content) if content else ("", False)
            if not stopped and (finish is not None or delta.tool_calls):
                # The content is over (the choice ends, or turns to tool calls): what was held back goes out.
                rest, stopped = scanner.flush()
                safe += rest
            if stopped:
                self.cut = self.cut or finish is None
                finish = "stop"
                why = None  # the gateway's stop, not the engine's
                delta = Delta(
                    role=delta.role,
                    content=safe,
                    reasoning_content=delta.reasoning_content,
                    thinking_blocks=delta.thinking_blocks,
                )
            elif safe != content:
                delta = msgspec.structs.replace(delta, content=safe or None)
            if safe != content:
                lp = ids = None  # the chunk's token logprobs and ids no longer describe its content
                self.into.scanned(content, safe)  # only here: a chunk the stops left as it was holds nothing
        if finish is not None:
            self.done.add(index)
        if finish is None and lp is None and ids is None and delta == _EMPTY:
            return None
        return ChunkChoice(index, delta, finish, lp, ids, why)


_EMPTY = Delta()


async def stream(
    em: ChatEmulation, opens: Sequence[ChatSubStream], into: Folded | None = None
) -> AsyncGenerator[ChatChunk, None]:
    """Merge the opened sub-streams into one as their chunks arrive: re-indexed, cut at the stops (the chunks
    they held back and sent inside a later one counted `into`), the usage summed onto a last chunk of its
    own. `opens[j]` is the j-th call's stream."""
    state = _Choices(em, into if into is not None else Folded())
    usages: dict[int, Usage] = {}  # each call's latest: an engine may repeat a running total on every chunk
    asked = 1 if em.fan_n > 1 else em.n  # the choices each call asked for
    last: ChatChunk | None = None
    prompt_ids = True  # the prompt's ids not yet relayed: every call's are the same, the client gets them once
    complete = True  # every call's usage is in `usages` (or the stream ended before a cut)
    async with aclosing(merged(opens)) as chunks:
        async for k, item in chunks:
            last = item
            if item.usage is not None:
                usages[k] = item.usage
            out = []
            for ch in item.choices:
                own_choice(ch.index, asked)
                relayed = await state.relay(ch, k if em.fan_n > 1 else ch.index)
                if relayed is not None:
                    out.append(relayed)
            ids = item.prompt_token_ids if prompt_ids else None
            if out or ids is not None:
                prompt_ids = prompt_ids and ids is None
                yield ChatChunk(item.id, item.created, item.model, out, item.system_fingerprint, None, ids)
            if state.cut and em.stops is not None and len(state.done) >= em.n:
                # Every choice has stopped, one while its upstream still generates: no need to read (or pay
                # for) the rest. A usage that lacks some call's is not the answer's: none is reported, and the
                # relay estimates it. When the upstreams ended them all, what follows is their usage: read on.
                complete = len(usages) == len(opens)
                break
    usage = summed(usages.values()) if complete else None
    if usage is not None and last is not None:
        yield ChatChunk(last.id, last.created, last.model, [], usage=usage)


async def replayed(answer: ChatCompletion) -> AsyncGenerator[ChatChunk, None]:
    """A checked answer as the stream the client asked for (bytes sent cannot be taken back, so a guided
    stream starts once its answer passed): wire/chat.py `answer_chunks`."""
    for chunk in answer_chunks(answer):
        yield chunk


__all__ = [
    "ChatCall",
    "ChatEmulation",
    "ChatSubStream",
    "complete",
    "plan",
    "replayed",
    "stream",
    "sub_requests",
]
