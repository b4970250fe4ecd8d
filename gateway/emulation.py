"""What the gateway does itself when a provider lacks a feature (a table entry marked `EMULATED`).

Prompt lists, n, best_of, echo, stops beyond the provider's and guided output, each within one failover
attempt: the attempt hands in values (`Call`, `SubStream`) and this module never sees the pipeline. `plan`
bounds the client-chosen work before any upstream call. What each field does and its bounds:
docs/emulation.md.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol

import msgspec

from gateway.client_schema import Checker, admit
from gateway.config import CapsConfig
from gateway.patterns import affordable, compile_pattern
from providers.base import Adapter, CallContext, Endpoint, LocalAdapter, prompt_form
from wire.errors import InvalidRequestError, UpstreamError
from wire.schema import Choice, Completion, CompletionRequest, Logprobs, Usage

_DEFAULT_CAPS = CapsConfig()
# One upstream call of the attempt for one (sub-)request, on the attempt's target and within its timeouts.
Call = Callable[[CompletionRequest], Awaitable[Completion]]


class SubStream(Protocol):
    """One opened sub-call's stream, as `stream` reads it: its first chunk, then the rest."""

    @property
    def first(self) -> Completion | None: ...

    @property
    def chunks(self) -> AsyncIterator[Completion]: ...


# `guided_choice`: at most this many entries, of at most this many characters together (an answer is
# looked up in a set, so these bound memory, not time).
GUIDED_CHOICES = 1024
GUIDED_CHOICE_CHARS = 64 * 1024


def _bad(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code="unsupported_parameter")


class Guide(msgspec.Struct, frozen=True):
    kind: str  # json | regex | choice
    param: str
    checker: Checker | None = None  # json: the admitted schema, if any
    pattern: Any = None  # regex: compiled by RE2
    choices: frozenset[str] = frozenset()
    depth: int = _DEFAULT_CAPS.json_depth

    def check(self, text: str) -> str | None:
        """None when `text` satisfies the constraint, else why not. Safe to run in a worker thread."""
        if self.kind == "regex":
            if not affordable(self.pattern, text):
                return "is too long to check against the regex within the gateway's bound"
            return None if self.pattern.fullmatch(text) else "does not match the regex"
        if self.kind == "choice":
            return None if text.strip() in self.choices else "is not one of the choices"
        try:
            value = json.loads(text)
        except ValueError:
            return "is not valid JSON"
        except RecursionError:
            return f"nests deeper than {self.depth} levels"
        return self.checker.why(value) if self.checker is not None else None

    async def verdict(self, text: str) -> str | None:
        """`check`, off the event loop where it may take long: RE2 releases the GIL while it matches, and a
        schema check is held to client_schema.ANSWER_WORK evaluations."""
        if self.kind == "choice":
            return self.check(text)
        return await asyncio.to_thread(self.check, text)


class Emulation(msgspec.Struct):
    prompts: list[str | list[int]]  # one entry per upstream prompt (fan-out when several)
    fan_n: int  # calls per prompt (1 when the provider takes n natively)
    n: int  # choices per prompt the client asked for
    best_of: int | None
    echo: bool
    stops: list[str] | None  # enforced here
    include_stop: bool
    upstream_stop: list[str] | None
    guide: Guide | None
    guided_retries: int


def _emulated(adapter: Adapter | LocalAdapter, name: str) -> bool:
    rule = adapter.params.get(name)
    return rule is not None and rule.emulated


def plan(
    adapter: Adapter | LocalAdapter,
    req: CompletionRequest,
    provider: str,
    retries: int,
    caps: CapsConfig = _DEFAULT_CAPS,
    endpoint: Endpoint | None = None,
) -> Emulation | None:
    """What must be emulated for this request on this provider; None when the provider does it all.

    Refuses (400 naming the field) what would make the gateway itself work beyond `caps`.
    """
    if endpoint is not None and isinstance(adapter, LocalAdapter):
        adapter.admit(req, endpoint, caps)
    n = req.n or 1
    form = prompt_form(req.prompt)
    fan_prompts = form in ("texts", "token_lists") and form not in adapter.prompt_forms
    prompts: list[str | list[int]] = list(req.prompt) if fan_prompts else [req.prompt]  # type: ignore[arg-type, list-item]
    fan_n = n if n > 1 and _emulated(adapter, "n") else 1
    best_of = req.best_of if req.best_of and req.best_of > 1 and _emulated(adapter, "best_of") else None
    if best_of is not None:
        lp = adapter.params.get("logprobs")
        if lp is None or lp.emulated:
            raise _bad(f"'best_of' cannot be emulated for provider '{provider}': it returns no logprobs", "best_of")
        fan_n = best_of
    echo = bool(req.echo) and _emulated(adapter, "echo")
    if echo and req.logprobs is not None:
        raise _bad(f"'echo' with 'logprobs' cannot be emulated for provider '{provider}'", "echo")
    if echo and form in ("tokens", "token_lists"):
        # The gateway echoes the prompt's text; of token ids it has none to put in front of the completion.
        raise _bad(f"'echo' of a token-id prompt cannot be emulated for provider '{provider}'", "echo")
    stops: list[str] | None = None
    upstream_stop = req.stop if isinstance(req.stop, list) else None
    include = bool(req.include_stop_str_in_output)
    if upstream_stop:
        if include and _emulated(adapter, "include_stop_str_in_output"):
            # A provider that strips the stop string must not see it: the gateway stops, keeping it.
            # One that keeps it (TGI) still gets it, to end early; the gateway makes the cut exact.
            stops = upstream_stop
            upstream_stop = upstream_stop if adapter.stop_in_output else None
        elif adapter.max_stop is not None and len(upstream_stop) > adapter.max_stop:
            stops, upstream_stop = upstream_stop, upstream_stop[: adapter.max_stop]
        elif adapter.stop_in_output and not include:
            # Still sent upstream so generation ends early; the gateway removes what the provider kept.
            stops = upstream_stop
    if stops is not None and req.echo and not echo:
        # A prompt the provider echoes would be scanned for the stops too: the gateway echoes it instead.
        if req.logprobs is not None or form != "text":
            raise _bad(
                f"'echo' with more stop sequences than provider '{provider}' takes needs a single text prompt "
                "and no logprobs",
                "echo",
            )
        echo = True
    # Most requests ask for no guided output: five loads here instead of a call to find that out.
    guided = (
        req.guided_grammar is not None
        or req.guided_json is not None
        or req.response_format is not None
        or req.guided_regex is not None
        or req.guided_choice is not None
    )
    guide = _guide(adapter, req, provider, caps) if guided else None
    if len(prompts) == 1 and fan_n == 1 and not echo and stops is None and guide is None:
        return None
    if stops is not None:
        for s in stops:
            if len(s) > caps.pattern_chars:
                raise InvalidRequestError(
                    f"'stop' has a sequence of {len(s)} characters; the gateway enforces stop sequences for "
                    f"provider '{provider}' and takes at most {caps.pattern_chars}",
                    param="stop",
                    code="invalid_value",
                )
    if fan_n > 1 or echo:
        _bound_copies(prompts, fan_n, n if echo else 0, caps.emulated_answer_bytes, best_of is not None)
    return Emulation(
        prompts=prompts,
        fan_n=fan_n,
        n=n,
        best_of=best_of,
        echo=echo,
        stops=stops,
        include_stop=include,
        upstream_stop=upstream_stop,
        guide=guide,
        guided_retries=retries,
    )


def _size(prompt: str | list[int]) -> int:
    """Bytes of a prompt as UTF-8 (a token id as up to 8 bytes of JSON)."""
    if isinstance(prompt, str):
        return len(prompt) if prompt.isascii() else len(prompt.encode("utf-8", "surrogatepass"))
    return 8 * len(prompt)


def _bound_copies(prompts: Sequence[str | list[int]], fan_n: int, echoes: int, limit: int, best_of: bool) -> None:
    """Each fanned-out call carries its prompt and each echoed choice repeats it: computed before any call."""
    copies = (fan_n if fan_n > 1 else 0) + echoes
    total = sum(_size(p) for p in prompts) * copies
    if total > limit:
        param = "best_of" if best_of else "n" if copies > 1 else "echo"
        raise InvalidRequestError(
            f"'{param}' would make the gateway build {total} bytes from copies of the prompt (echo and "
            f"calls it makes for each choice); at most {limit} are allowed",
            param=param,
            code="invalid_value",
        )


def _guide(adapter: Adapter | LocalAdapter, req: CompletionRequest, provider: str, caps: CapsConfig) -> Guide | None:
    # `plan` calls this only when one of the five fields read here is set: a new one goes in both places.
    if req.guided_grammar is not None and _emulated(adapter, "guided_grammar"):
        raise _bad(
            f"'guided_grammar' is not supported by provider '{provider}', and a grammar cannot be checked "
            "by the gateway",
            "guided_grammar",
        )
    depth = caps.json_depth
    if req.guided_json is not None and _emulated(adapter, "guided_json"):
        checker = admit(req.guided_json, param="guided_json", depth=depth, pattern_chars=caps.pattern_chars)
        return Guide("json", "guided_json", checker=checker, depth=depth)
    rf = req.response_format
    if rf is not None and _emulated(adapter, "response_format") and rf.get("type") == "json_object":
        schema = rf.get("schema")
        if isinstance(schema, dict):
            checker = admit(schema, param="response_format", depth=depth, pattern_chars=caps.pattern_chars)
            return Guide("json", "response_format", checker=checker, depth=depth)
        return Guide("json", "response_format", depth=depth)
    if req.guided_regex is not None and _emulated(adapter, "guided_regex"):
        pattern = compile_pattern(req.guided_regex, param="guided_regex", limit=caps.pattern_chars)
        return Guide("regex", "guided_regex", pattern=pattern)
    if req.guided_choice is not None and _emulated(adapter, "guided_choice"):
        choices = req.guided_choice
        if len(choices) > GUIDED_CHOICES or sum(map(len, choices)) > GUIDED_CHOICE_CHARS:
            raise InvalidRequestError(
                f"'guided_choice' may have at most {GUIDED_CHOICES} entries of at most {GUIDED_CHOICE_CHARS} "
                "characters together",
                param="guided_choice",
                code="invalid_value",
            )
        return Guide("choice", "guided_choice", choices=frozenset(choices))
    return None


def sub_requests(em: Emulation, req: CompletionRequest) -> list[CompletionRequest]:
    """The upstream calls, in order: prompt by prompt, `fan_n` each."""
    return [_sub_request(em, req, p) for p in em.prompts for _ in range(em.fan_n)]


def _sub_request(em: Emulation, req: CompletionRequest, prompt: str | list[int]) -> CompletionRequest:
    return msgspec.structs.replace(
        req,
        prompt=prompt,
        n=None if em.fan_n > 1 or em.best_of else req.n,
        best_of=None if em.best_of else req.best_of,
        # best_of ranks by logprobs: ask for the sampled token's logprob even if the client did not.
        logprobs=req.logprobs if req.logprobs is not None or not em.best_of else 0,
        echo=None if em.echo else req.echo,
        stop=em.upstream_stop,
        include_stop_str_in_output=None if em.stops is not None else req.include_stop_str_in_output,
        guided_json=None if em.guide is not None else req.guided_json,
        guided_regex=None if em.guide is not None else req.guided_regex,
        guided_choice=None if em.guide is not None else req.guided_choice,
        response_format=None if em.guide is not None and em.guide.param == "response_format" else req.response_format,
    )


def find_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """The earliest stop sequence in `text` (position, sequence)."""
    best: tuple[int, str] | None = None
    for s in stops:
        pos = text.find(s)
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, s)
    return best


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


def _apply_stop(choice: Choice, stops: Sequence[str], include: bool) -> Choice:
    hit = find_stop(choice.text, stops)
    if hit is None:
        return choice
    cut = hit[0] + (len(hit[1]) if include else 0)
    return Choice(
        text=choice.text[:cut], index=choice.index, logprobs=_cut_logprobs(choice.logprobs, cut), finish_reason="stop"
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


async def _gather(calls: list[Awaitable[Completion]]) -> list[Completion]:
    """All in parallel; the first failure cancels the rest (one attempt fails as a whole)."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _guided_call(em: Emulation, sub: CompletionRequest, call: Call) -> Completion:
    assert em.guide is not None
    why = ""
    for _ in range(em.guided_retries + 1):
        c = await call(sub)
        failures = [await em.guide.verdict(ch.text) for ch in c.choices if ch.finish_reason != "content_filter"]
        bad = [f for f in failures if f is not None]
        if not bad:
            return c
        why = bad[0]
    err = UpstreamError(
        f"The model's output {why}, after {em.guided_retries + 1} attempts; '{em.guide.param}' is enforced by "
        "the gateway for this provider and an unvalidated answer is never returned",
        code="guided_output_invalid",
        param=em.guide.param,
        retryable=False,
    )
    raise err


async def complete(
    em: Emulation,
    req: CompletionRequest,
    ctx: CallContext,
    call: Call,
) -> Completion:
    calls = [_guided_call(em, sub, call) if em.guide is not None else call(sub) for sub in sub_requests(em, req)]
    results = await _gather(calls)
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
                mine = [Choice(ch.text, ch.index, None, ch.finish_reason) for ch in mine]
        for j, ch in enumerate(mine):
            if em.stops is not None:
                ch = _apply_stop(ch, em.stops, em.include_stop)
            text = (prompt if isinstance(prompt, str) else "") + ch.text if em.echo else ch.text
            choices.append(Choice(text, p_index * em.n + j, ch.logprobs, ch.finish_reason))
    return Completion(
        id=ctx.id, created=ctx.created, model=ctx.model, choices=choices, usage=usage, system_fingerprint=fingerprint
    )


def _borders(s: str) -> list[int]:
    """KMP failure function: for each prefix s[:i+1], the length of its longest proper border."""
    fail = [0] * len(s)
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = fail[k - 1]
        if s[i] == s[k]:
            k += 1
        fail[i] = k
    return fail


class StopScanner:
    """Streams text through, holding back only what could still be the start of a stop sequence.

    Linear in the text: per stop, a KMP automaton carries how much of the stop the text so far ends with
    (that is what must be held back), fed only the new text, and skipping with `str.find` while nothing
    is matched. Rescanning the held text on every chunk would be quadratic in a long partial match.
    """

    def __init__(self, stops: Sequence[str], include: bool) -> None:
        self.stops = [s for s in stops if s]
        self.include = include
        self.buf = ""
        self._fail = [_borders(s) for s in self.stops]
        self._matched = [0] * len(self.stops)

    def _advance(self, i: int, text: str) -> bool:
        """Feed `text` to stop i's automaton; whether the stop is now complete."""
        s, fail, k = self.stops[i], self._fail[i], self._matched[i]
        j, end = 0, len(text)
        while j < end:
            if k == 0:
                j = text.find(s[0], j)
                if j < 0:
                    break
            c = text[j]
            while k and s[k] != c:
                k = fail[k - 1]
            if s[k] == c:
                k += 1
            j += 1
            if k == len(s):
                self._matched[i] = k
                return True
        self._matched[i] = k
        return False

    def feed(self, text: str) -> tuple[str, bool]:
        """(text safe to send now, whether a stop sequence was reached)."""
        self.buf += text
        complete = False
        for i in range(len(self.stops)):
            complete = self._advance(i, text) or complete
        if complete:
            # The earliest-starting stop within the text held and this chunk (as `find_stop` everywhere).
            hit = find_stop(self.buf, self.stops)
            assert hit is not None
            cut = hit[0] + (len(hit[1]) if self.include else 0)
            out, self.buf = self.buf[:cut], ""
            return out, True
        hold = max(self._matched, default=0)
        out = self.buf[: len(self.buf) - hold]
        self.buf = self.buf[len(self.buf) - hold :]
        return out, False

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        return out


async def stream(
    em: Emulation,
    req: CompletionRequest,
    ctx: CallContext,
    opens: Sequence[SubStream],
) -> AsyncGenerator[Completion, None]:
    """Merge the already-opened sub-streams into one, re-indexing, echoing and enforcing stops.

    `opens[k]` is the k-th sub-call's stream (prompt k // fan_n, choice k % fan_n).
    """
    queue: asyncio.Queue[tuple[int, Completion | None | BaseException]] = asyncio.Queue()

    async def pump(k: int, opened: SubStream) -> None:
        try:
            c = opened.first
            while c is not None:
                await queue.put((k, c))
                c = await anext(opened.chunks, None)
            await queue.put((k, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            await queue.put((k, exc))

    pumps = [asyncio.ensure_future(pump(k, o)) for k, o in enumerate(opens)]
    scanners: dict[int, StopScanner] = {}
    echoed: set[int] = set()
    done: set[int] = set()
    usage: Usage | None = None
    live = len(opens)
    try:
        while live:
            k, item = await queue.get()
            if item is None:
                live -= 1
                continue
            if isinstance(item, BaseException):
                raise item
            usage = _add(usage, item.usage)
            p_index, j = divmod(k, em.fan_n)
            out: list[Choice] = []
            for ch in item.choices:
                index = p_index * em.n + (j if em.fan_n > 1 else ch.index)
                if index in done:
                    continue
                text, finish, lp = ch.text, ch.finish_reason, ch.logprobs
                if em.echo and index not in echoed:
                    echoed.add(index)
                    prompt = em.prompts[p_index]
                    text = (prompt if isinstance(prompt, str) else "") + text
                if em.stops is not None:
                    scanner = scanners.setdefault(index, StopScanner(em.stops, em.include_stop))
                    safe, stopped = scanner.feed(ch.text)
                    if em.echo and text != ch.text:
                        safe = text[: len(text) - len(ch.text)] + safe
                    if stopped:
                        finish = "stop"
                    elif finish is not None:
                        safe += scanner.flush()
                    if safe != text:
                        lp = None  # the chunk's token logprobs no longer describe its text
                    text = safe
                if finish is not None:
                    done.add(index)
                if text or finish is not None:
                    out.append(Choice(text, index, lp, finish))
            if out:
                yield ctx.completion(out)
            if (
                em.stops is not None
                and done
                and all(p * em.n + jj in done for p in range(len(em.prompts)) for jj in range(em.n))
            ):
                break  # every choice has stopped: no need to read (or pay for) the rest
        if usage is not None:
            yield ctx.completion([], usage)
    finally:
        for p in pumps:
            p.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


def to_chunks(c: Completion) -> list[Completion]:
    """A validated answer as stream chunks: one per choice, the last carrying the usage."""
    chunks = [
        Completion(id=c.id, created=c.created, model=c.model, choices=[ch], system_fingerprint=c.system_fingerprint)
        for ch in c.choices
    ]
    if chunks:
        chunks[-1].usage = c.usage
    return chunks


__all__ = [
    "Call",
    "Emulation",
    "StopScanner",
    "SubStream",
    "complete",
    "find_stop",
    "plan",
    "stream",
    "sub_requests",
    "to_chunks",
]
