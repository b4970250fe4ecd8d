"""Buffered emulation: run an attempt's sub-requests (`Call`) and fold their answers into the one the
client asked for: stops cut, logprobs trimmed, best_of chosen, usage summed, guided output checked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import msgspec

from gateway.emulation.client_schema import Work, WorkExhausted
from gateway.emulation.planning import _CHECKS, _DEFAULT_CAPS, Call, Emulation, Guide, sub_requests
from gateway.emulation.seeds import Seeded, reseeded
from gateway.emulation.stops import StopMatcher, StopScanner
from providers.base import CallContext
from wire.errors import UpstreamError, UpstreamTimeoutError
from wire.schema import Choice, Completion, CompletionRequest, Logprobs, Usage

_T = TypeVar("_T")
_R = TypeVar("_R", bound=Seeded)  # a sub-request
_A = TypeVar("_A")  # its answer


def _cut_logprobs(lp: Logprobs | None, keep: int) -> Logprobs | None:
    """Logprobs for the first `keep` characters of a choice's text."""
    if lp is None:
        return None
    out = Logprobs(
        tokens=[], token_logprobs=[], top_logprobs=[] if lp.top_logprobs is not None else None, text_offset=[]
    )
    used = 0
    for i, tok in enumerate(lp.tokens):
        if used >= keep:
            break
        piece = tok[: keep - used]
        out.tokens.append(piece)
        out.token_logprobs.append(lp.token_logprobs[i])
        if out.top_logprobs is not None and lp.top_logprobs is not None:
            out.top_logprobs.append(lp.top_logprobs[i])
        out.text_offset.append(lp.text_offset[i])
        used += len(piece)
    return out


# The most text the stop automaton reads (in Python, a step per character) before the event loop gets a turn.
SCAN_SLICE = 8 * 1024


async def _scan(scanner: StopScanner, text: str) -> tuple[str, bool]:
    """`scanner.feed(text)`, a slice at a time, letting the event loop run between slices."""
    if len(text) <= SCAN_SLICE:
        return scanner.feed(text)
    sent: list[str] = []
    for at in range(0, len(text), SCAN_SLICE):
        if at:
            await asyncio.sleep(0)
        out, stopped = scanner.feed(text[at : at + SCAN_SLICE], final=at + SCAN_SLICE >= len(text))
        sent.append(out)
        if stopped:
            return "".join(sent), True
    return "".join(sent), False


async def _apply_stop(choice: Choice, stops: StopMatcher, include: bool) -> Choice:
    sent, stopped = await _scan(StopScanner(stops, include), choice.text)
    if not stopped:
        return choice
    cut = len(sent)
    # The engine's generated ids and stop reason describe the text before the cut; the prompt's still hold.
    return Choice(
        text=choice.text[:cut],
        index=choice.index,
        logprobs=_cut_logprobs(choice.logprobs, cut),
        finish_reason="stop",
        prompt_logprobs=choice.prompt_logprobs,
        prompt_token_ids=choice.prompt_token_ids,
    )


def _mean_logprob(choice: Choice) -> float:
    lps = [x for x in (choice.logprobs.token_logprobs if choice.logprobs else []) if x is not None]
    return sum(lps) / len(lps) if lps else float("-inf")


def _sum_details(a: msgspec.Struct | None, b: msgspec.Struct | None) -> Any:
    """Field-wise sum of two usage-details structs (None fields stay None unless one side has them)."""
    if a is None or b is None:
        return a if b is None else b
    values = {}
    for f in a.__struct_fields__:
        x, y = getattr(a, f), getattr(b, f)
        values[f] = None if x is None and y is None else (x or 0) + (y or 0)
    return type(a)(**values)


def _add(total: Usage | None, u: Usage | None) -> Usage | None:
    if u is None:
        return total
    if total is None:
        return msgspec.structs.replace(u)
    return Usage(
        prompt_tokens=total.prompt_tokens + u.prompt_tokens,
        completion_tokens=total.completion_tokens + u.completion_tokens,
        total_tokens=total.total_tokens + u.total_tokens,
        completion_tokens_details=_sum_details(total.completion_tokens_details, u.completion_tokens_details),
        prompt_tokens_details=_sum_details(total.prompt_tokens_details, u.prompt_tokens_details),
    )


def summed(usages: Iterable[Usage]) -> Usage | None:
    """The calls' usages added up; None without any."""
    total: Usage | None = None
    for u in usages:
        total = _add(total, u)
    return total


async def gather(calls: Sequence[Awaitable[_T]]) -> list[_T]:
    """All in parallel; the first failure cancels the rest (one attempt fails as a whole)."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # A failed task holds its exception, whose traceback (the one raised here) holds this frame.
        del tasks
        raise


async def ready(guide: Guide) -> None:
    """The guide's schema compiled in full (on the checks' thread) before its first answer is checked."""
    checker = guide.checker
    if checker is not None and not checker.ready:
        await asyncio.get_running_loop().run_in_executor(_CHECKS, checker.finish)


async def checked(
    guide: Guide,
    retries: int,
    sub: _R,
    call: Callable[[_R], Awaitable[_A]],
    again: Callable[[_R], Awaitable[_A]],
    work: Work,
    texts: Callable[[_A], list[str]],
    stride: int = 1,
) -> _A:
    """One sub-call whose answer's `texts` (a completion's choices, a chat answer's message contents) must
    each satisfy `guide`: made again up to `retries` times, then a 502 `guided_output_invalid`. A seeded
    sub-call is asked again with its seed moved on by `stride` (the calls fanned out beside it) each time:
    the same seed would sample the same failed answer."""
    why = ""
    for attempt in range(retries + 1):
        answer = await (again(reseeded(sub, attempt * stride)) if attempt else call(sub))
        try:
            failures = [await guide.verdict(text, work) for text in texts(answer)]
        except WorkExhausted as exc:
            raise _unchecked(guide, exc) from None
        bad = [f for f in failures if f is not None]
        if not bad:
            return answer
        why = bad[0]
    raise UpstreamError(
        f"The model's output {why}, after {retries + 1} attempts; '{guide.param}' is enforced by "
        "the gateway for this provider and an unvalidated answer is never returned",
        code="guided_output_invalid",
        param=guide.param,
        retryable=False,
    )


def _texts(c: Completion) -> list[str]:
    """What a guided completion's check reads: each choice's text (a filtered one has nothing to check)."""
    return [ch.text for ch in c.choices if ch.finish_reason != "content_filter"]


def _unchecked(guide: Guide, exc: WorkExhausted) -> UpstreamError:
    """The request's checking budget or deadline ran out: no retry (it would only be refused unchecked)."""
    if exc.deadline:
        return UpstreamTimeoutError(
            f"The request's deadline passed while the gateway checked its answer against '{guide.param}'",
            code="deadline_exceeded",
            retryable=False,
            cause="deadline_exceeded",
        )
    return UpstreamError(
        f"The model's output could not be checked: {exc}; '{guide.param}' is enforced by the gateway for "
        "this provider and an unvalidated answer is never returned",
        code="guided_output_invalid",
        param=guide.param,
        retryable=False,
    )


async def complete(
    em: Emulation,
    req: CompletionRequest,
    ctx: CallContext,
    call: Call,
    again: Call | None = None,
    work: Work | None = None,
) -> Completion:
    """The sub-calls' answers as one. `again` makes a guided output's retry (by default `call`): a call
    beyond the planned ones, which the attempt charges to the target's quota as it is made. `work`: what
    checking the answers may spend, the request's (shared with its other attempts)."""
    calls: list[Awaitable[Completion]]
    if em.guide is not None:
        await ready(em.guide)
        spend = work if work is not None else Work(_DEFAULT_CAPS.guided_work)
        retry = again or call
        calls = [
            checked(em.guide, em.guided_retries, sub, call, retry, spend, _texts, em.fan_n)
            for sub in sub_requests(em, req)
        ]
    else:
        calls = [call(sub) for sub in sub_requests(em, req)]
    results = await gather(calls)
    choices: list[Choice] = []
    usage: Usage | None = None
    fingerprint = None
    for p_index, prompt in enumerate(em.prompts):
        batch = results[p_index * em.fan_n : (p_index + 1) * em.fan_n]
        mine = [ch for c in batch for ch in sorted(c.choices, key=lambda ch: ch.index)]
        for c in batch:
            usage = _add(usage, c.usage)
            fingerprint = fingerprint or c.system_fingerprint
        if em.best_of:
            mine = sorted(mine, key=_mean_logprob, reverse=True)[: em.n]
            if req.logprobs is None:
                mine = [msgspec.structs.replace(ch, logprobs=None) for ch in mine]
        for j, ch in enumerate(mine):
            if em.matcher is not None:
                ch = await _apply_stop(ch, em.matcher, em.include_stop)
            text = (prompt if isinstance(prompt, str) else "") + ch.text if em.echo else ch.text
            # Replaced, not rebuilt: an engine's token-native fields (token_ids, stop_reason...) are kept.
            choices.append(msgspec.structs.replace(ch, text=text, index=p_index * em.n + j))
    return Completion(
        id=ctx.id, created=ctx.created, model=ctx.model, choices=choices, usage=usage, system_fingerprint=fingerprint
    )
