"""What the gateway does itself when a provider lacks a feature (a table entry marked `EMULATED`).

Prompt lists, n, best_of, echo, stops beyond the provider's and guided output, each within one failover
attempt: the attempt hands in values (`Call`, `SubStream`) and this module never sees the pipeline. `plan`
bounds the client-chosen work before any upstream call. What each field does and its bounds:
docs/emulation.md.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, cast

import msgspec

from gateway.config import CapsConfig
from gateway.emulation.client_schema import Checker, Work, admit, match_steps
from gateway.emulation.patterns import affordable, compile_pattern
from gateway.emulation.seeds import shifted
from gateway.emulation.stops import StopMatcher, matcher
from providers.base import UNBOUNDED_N, Adapter, Endpoint, LocalAdapter, Table, prompt_form
from wire.errors import InvalidRequestError
from wire.schema import Completion, CompletionRequest

_DEFAULT_CAPS = CapsConfig()
# One upstream call of the attempt for one (sub-)request, on the attempt's target and within its timeouts.
Call = Callable[[CompletionRequest], Awaitable[Completion]]


class SubStream(Protocol):
    """One opened sub-call's stream, as `stream` reads it: its first chunk, then the rest."""

    @property
    def first(self) -> Completion | None: ...

    @property
    def chunks(self) -> AsyncIterator[Completion]: ...


# `guided_choice`: at most this many entries, of at most this many characters together, whoever serves it
# (gateway/path/request.py checks every request): an answer is looked up in a set and a server's grammar is
# built from them, so these bound memory, not time.
GUIDED_CHOICES = 1024
GUIDED_CHOICE_CHARS = 64 * 1024


# Where answers are checked against a client's regex or schema: a thread of the gateway's own, so a flood
# of checks queues here (each request within its own `caps.guided_work`), not in the default executor
# (DNS lookups). One: schema checks hold the GIL, and every further thread competing for it delays the
# event loop more (two made `/health` take 100 ms under load; one, 20 ms).
_CHECKS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="guided-check")


def _bad(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code="unsupported_parameter")


class Guide(msgspec.Struct, frozen=True):
    kind: str  # json | regex | choice
    param: str
    checker: Checker | None = None  # json: the admitted schema, if any
    pattern: Any = None  # regex: compiled by RE2
    choices: frozenset[str] = frozenset()
    depth: int = _DEFAULT_CAPS.json_depth

    def check(self, text: str, work: Work | None = None) -> str | None:
        """None when `text` satisfies the constraint, else why not. Safe to run in a worker thread.

        A schema check spends `work`, the request's (WorkExhausted when it runs out)."""
        if self.kind == "regex":
            if not affordable(self.pattern, text):
                return "is too long to check against the regex within the gateway's bound"
            if work is not None:
                work.charge(match_steps(self.pattern, text))
            return None if self.pattern.fullmatch(text) else "does not match the regex"
        if self.kind == "choice":
            return None if text.strip() in self.choices else "is not one of the choices"
        try:
            value = json.loads(text)
        except ValueError:
            return "is not valid JSON"
        except RecursionError:
            return f"nests deeper than {self.depth} levels"
        if self.checker is None:
            return None
        return self.checker.why(value, work if work is not None else Work(_DEFAULT_CAPS.guided_work))

    async def verdict(self, text: str, work: Work) -> str | None:
        """`check`, off the event loop (on the checks' own thread, so they never hold up the default
        executor's DNS lookups): RE2 releases the GIL while it matches, and a schema check spends `work`."""
        if self.kind == "choice":
            return self.check(text)
        mine = work.share()
        try:
            return await asyncio.get_running_loop().run_in_executor(_CHECKS, self.check, text, mine)
        except asyncio.CancelledError:
            mine.stop()  # the thread gives up at its next draw instead of checking for nobody
            raise


class Emulation(msgspec.Struct):
    prompts: list[str | list[int]]  # one entry per upstream prompt (fan-out when several)
    fan_n: int  # calls per prompt (1 when the provider takes n natively, or best_of's candidates in one call)
    n: int  # choices per prompt the client asked for
    best_of: int | None
    echo: bool
    stops: list[str] | None  # enforced here
    matcher: StopMatcher | None  # their automaton, built once
    include_stop: bool
    upstream_stop: list[str] | None
    guide: Guide | None
    guided_retries: int


def _emulated(params: Table, name: str) -> bool:
    rule = params.get(name)
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
    if endpoint is not None and adapter.in_process:
        cast(LocalAdapter, adapter).admit(req, endpoint, caps)
    n = req.n or 1
    form = prompt_form(req.prompt)
    fan_prompts = form in ("texts", "token_lists") and form not in adapter.prompt_forms
    prompts: list[str | list[int]] = list(req.prompt) if fan_prompts else [req.prompt]  # type: ignore[arg-type, list-item]
    fan_n = n if n > 1 and (n > adapter.max_n or _emulated(adapter.params, "n")) else 1
    best_of = req.best_of if req.best_of and req.best_of > 1 and _emulated(adapter.params, "best_of") else None
    if best_of is not None:
        lp = adapter.params.get("logprobs")
        if lp is None or lp.emulated:
            raise _bad(f"'best_of' cannot be emulated for provider '{provider}': it returns no logprobs", "best_of")
        # The candidates in one call where the operator bounded the provider's `n` (`max_n`) and they fit in it
        # (llama-server then evaluates the prompt once for all of them), else one call each.
        fan_n = 1 if best_of <= adapter.max_n < UNBOUNDED_N and not _emulated(adapter.params, "n") else best_of
    echo = bool(req.echo) and _emulated(adapter.params, "echo")
    if echo and req.logprobs is not None:
        raise _bad(f"'echo' with 'logprobs' cannot be emulated for provider '{provider}'", "echo")
    if echo and form in ("tokens", "token_lists"):
        # The gateway echoes the prompt's text; of token ids it has none to put in front of the completion.
        raise _bad(f"'echo' of a token-id prompt cannot be emulated for provider '{provider}'", "echo")
    stops: list[str] | None = None
    upstream_stop = req.stop if isinstance(req.stop, list) else None
    include = bool(req.include_stop_str_in_output)
    if upstream_stop:
        if include and _emulated(adapter.params, "include_stop_str_in_output"):
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
    guide = make_guide(adapter.params, req, provider, caps) if guided else None
    if len(prompts) == 1 and fan_n == 1 and best_of is None and not echo and stops is None and guide is None:
        return None
    found = bound_stops(stops, provider, caps) if stops is not None else None
    if fan_n > 1 or echo:
        _bound_copies(prompts, fan_n, n if echo else 0, caps.emulated_answer_bytes, best_of is not None)
    return Emulation(
        prompts=prompts,
        fan_n=fan_n,
        n=n,
        best_of=best_of,
        echo=echo,
        stops=stops,
        matcher=found,
        include_stop=include,
        upstream_stop=upstream_stop,
        guide=guide,
        guided_retries=retries,
    )


def bound_stops(stops: list[str], provider: str, caps: CapsConfig) -> StopMatcher:
    """The automaton for the stops the gateway enforces, once they are within `caps` (else a 400 naming `stop`)."""
    for s in stops:
        if len(s) > caps.pattern_chars:
            raise InvalidRequestError(
                f"'stop' has a sequence of {len(s)} characters; the gateway enforces stop sequences for "
                f"provider '{provider}' and takes at most {caps.pattern_chars}",
                param="stop",
                code="invalid_value",
            )
    total = sum(map(len, stops))
    if total > caps.stop_chars:
        raise InvalidRequestError(
            f"'stop' has {total} characters in all; the gateway enforces stop sequences for provider "
            f"'{provider}' and takes at most {caps.stop_chars} characters together",
            param="stop",
            code="invalid_value",
        )
    return matcher(stops)


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


def make_guide(params: Table, req: CompletionRequest, provider: str, caps: CapsConfig) -> Guide | None:
    """The check of a guided field the provider's table (its completion or its chat table) marks emulated;
    None when the provider decodes it natively. Refuses a grammar, and bounds the client's schema and regex."""
    # `plan` calls this only when one of the five fields read here is set: a new one goes in both places
    # (and in gateway/emulation/chat.py's `plan`).
    if req.guided_grammar is not None and _emulated(params, "guided_grammar"):
        raise _bad(
            f"'guided_grammar' is not supported by provider '{provider}', and a grammar cannot be checked "
            "by the gateway",
            "guided_grammar",
        )
    depth = caps.json_depth
    if req.guided_json is not None and _emulated(params, "guided_json"):
        checker = admit(
            req.guided_json,
            param="guided_json",
            depth=depth,
            pattern_chars=caps.pattern_chars,
            paths=caps.schema_paths,
        )
        return Guide("json", "guided_json", checker=checker, depth=depth)
    rf = req.response_format
    if rf is not None and _emulated(params, "response_format") and rf.get("type") == "json_object":
        schema = rf.get("schema")
        if isinstance(schema, dict):
            checker = admit(
                schema, param="response_format", depth=depth, pattern_chars=caps.pattern_chars, paths=caps.schema_paths
            )
            return Guide("json", "response_format", checker=checker, depth=depth)
        return Guide("json", "response_format", depth=depth)
    if req.guided_regex is not None and _emulated(params, "guided_regex"):
        pattern = compile_pattern(req.guided_regex, param="guided_regex", limit=caps.pattern_chars)
        return Guide("regex", "guided_regex", pattern=pattern)
    if req.guided_choice is not None and _emulated(params, "guided_choice"):
        return Guide("choice", "guided_choice", choices=frozenset(req.guided_choice))
    return None


def sub_requests(em: Emulation, req: CompletionRequest) -> list[CompletionRequest]:
    """The upstream calls, in order: prompt by prompt, `fan_n` each."""
    return [_sub_request(em, req, p, j) for p in em.prompts for j in range(em.fan_n)]


def _sub_n(em: Emulation, req: CompletionRequest) -> int | None:
    """The choices one call asks for: best_of's candidates where they go in one call, else one per call where
    `n` is fanned out, else the request's own `n`."""
    if em.best_of:
        return em.best_of if em.fan_n == 1 else None
    return None if em.fan_n > 1 else req.n


def _sub_request(em: Emulation, req: CompletionRequest, prompt: str | list[int], j: int) -> CompletionRequest:
    return msgspec.structs.replace(
        req,
        prompt=prompt,
        seed=shifted(req.seed, j),  # each fanned-out call of a prompt its own (gateway/emulation/seeds.py)
        n=_sub_n(em, req),
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
