"""The built-in `fake` provider: keyless, in-process, deterministic, for demos, tests and load tests.

Text is derived from a hash of the prompt (and seed and choice), so the same request always gets the same
answer; the model name picks a behaviour (`echo`, `slow-<N>ms`, `drip-<N>ms`, `long`, `error-<status>`,
`crash-after-<N>`). It runs on the gateway's event loop, so `admit` bounds its work by `caps` first.
The behaviours, logprobs shape and bounds in full: docs/provider-notes.md#fake.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from bisect import bisect_left
from collections.abc import AsyncGenerator
from itertools import accumulate
from typing import Any

import msgspec

from providers.base import CallContext, Endpoint, LocalAdapter, LocalCaps, Param, table
from providers.chat_params import chat_table
from providers.offsets import text_offsets
from wire.errors import InvalidRequestError, UpstreamStatusError, shown
from wire.schema import Choice, Completion, CompletionRequest, FinishReason, Logprobs, Usage

WORDS = (
    "the quick brown fox jumps over a lazy dog while seven bright stars drift across calm "
    "water and old maps fold into paper boats that sail toward distant quiet harbors where "
    "patient lighthouses count every wave until morning light returns"
).split()
# `\s*\S+` with findall would retry the white-space run from each of its positions: quadratic in a prompt
# of spaces. Splitting on `\S+` is linear; a token is the white space before a word plus the word.
_WORD = re.compile(r"(\S+)")
_LONGEST_WORD = max(len(w) for w in WORDS) + 1
# Chunks a stream sends before letting the event loop run (a drip stream sleeps between chunks anyway).
_YIELD_EVERY = 64
_BEHAVIOUR = re.compile(r"^(slow|drip)-(\d{1,6})ms$|^error-(\d{3})$")
_CRASH = re.compile(r"^crash-after-(\d{1,4})$")


class FakeCrash(RuntimeError):
    """What `crash-after-<N>` raises: deliberately not a GatewayError, like a bug would not be."""


class _Generated(msgspec.Struct):
    text: str
    tokens: list[str]
    logprobs: list[float]
    finish: str


def _prompt_texts(prompt: str | list[Any]) -> list[str]:
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt[0], str):
        return [str(p) for p in prompt]
    if isinstance(prompt[0], int):
        return [" ".join(str(t) for t in prompt)]
    return [" ".join(str(t) for t in p) for p in prompt]


def _stream_of(seed: bytes) -> list[int]:
    return list(hashlib.blake2b(seed, digest_size=64).digest())


def _tokens(text: str) -> list[str]:
    parts = _WORD.split(text)
    return [parts[i] + parts[i + 1] for i in range(0, len(parts) - 1, 2)]


def _logprob(digest: list[int], i: int) -> float:
    return -((digest[(i * 7) % 64] % 300) + 1) / 100


def _generate(prompt: str, p_tokens: list[str], j: int, req: CompletionRequest, behaviour: str) -> _Generated:
    max_tokens = 16 if req.max_tokens is None else req.max_tokens
    digest = _stream_of(f"{prompt}\x00{j}\x00{req.seed}".encode())
    if behaviour == "echo":
        words = p_tokens[: max_tokens + 1]
    else:
        # `long` has one word more than the limit, so it always ends on the limit: finish_reason "length".
        natural = max_tokens + 1 if behaviour == "long" else 8 + digest[0] % 40
        words = [" " + WORDS[digest[i % 64] * (i + 1) % len(WORDS)] for i in range(natural)]
    finish = "stop"
    if len(words) > max_tokens:
        words, finish = words[:max_tokens], "length"
    text = "".join(words)
    logprobs = [_logprob(digest, i) for i in range(len(words))]
    ends = list(accumulate(map(len, words)))
    # The first word that completes a stop sequence; among the stops complete by then, the earliest.
    found = [(pos, s) for s in (req.stop if isinstance(req.stop, list) else []) if s and (pos := text.find(s)) >= 0]
    if not found:
        return _Generated(text=text, tokens=words, logprobs=logprobs, finish=finish)
    w = min(bisect_left(ends, pos + len(s)) for pos, s in found)
    pos, s = min(hit for hit in found if hit[0] + len(hit[1]) <= ends[w])
    cut = pos + (len(s) if req.include_stop_str_in_output else 0)
    before = ends[w - 1] if w else 0
    tokens, lps = words[:w], logprobs[:w]
    # A stop that starts inside earlier tokens cuts them too: tokens must concatenate to the text.
    size = before
    while tokens and size - len(tokens[-1]) >= cut:
        size -= len(tokens.pop())
        lps.pop()
    if size > cut:
        tokens[-1] = tokens[-1][: len(tokens[-1]) - (size - cut)]
    if cut > before:
        tokens.append(text[before:cut])
        lps.append(_logprob(digest, w))
    return _Generated(text=text[:cut], tokens=tokens, logprobs=lps, finish="stop")


def _echo_logprobs(prompt: str, p_tokens: list[str]) -> list[float | None]:
    """The echoed prompt's own token logprobs: the first has no context, so none (as OpenAI and vLLM answer)."""
    if not p_tokens:
        return []
    digest = _stream_of(f"{prompt}\x00echo".encode())
    return [None, *(_logprob(digest, i) for i in range(1, len(p_tokens)))]


def _top(tokens: list[str], lps: list[float | None], k: int) -> list[dict[str, float] | None] | None:
    """k alternatives per token, the token itself the likeliest with exactly its `token_logprobs` value.

    A token without a logprob (the first echoed one) has no alternatives either: `null`, like its logprob.
    """
    if k <= 0:
        return None
    out: list[dict[str, float] | None] = []
    for tok, lp in zip(tokens, lps, strict=True):
        if lp is None:
            out.append(None)
            continue
        alts = {tok: lp}
        step = 1
        while len(alts) < k:
            alt = f" {WORDS[(len(tok) * 13 + step) % len(WORDS)]}{step}"
            if alt != tok:  # an echoed prompt word can look like an alternative; it keeps its own logprob
                alts[alt] = round(lp - step * 0.5, 4)
            step += 1
        out.append(alts)
    return out


class FakeAdapter(LocalAdapter):
    kind = "fake"
    auth = "none"
    max_logprobs = 20
    # In process: no upstream body, but the same fields, should it ever read `inference_extra_params`.
    guarded_paths = frozenset({"prompt", "max_tokens", "n", "best_of"})
    params = table(
        max_tokens=Param(),
        stop=Param(),
        include_stop_str_in_output=Param(),
        n=Param(),
        logprobs=Param(),
        echo=Param(),
        seed=Param(),
        temperature=Param(),
        top_p=Param(),
        top_k=Param(),
        frequency_penalty=Param(),
        presence_penalty=Param(),
        user=Param(),
    )
    # Chat answers are its completions as the assistant's message (providers/openai_chat.py `from_completion`),
    # which carry no chat logprobs.
    chat_params = chat_table(params, drop=("logprobs",))

    def admit(self, req: CompletionRequest, endpoint: Endpoint, caps: LocalCaps) -> None:
        limit = caps.fake_max_tokens
        if req.max_tokens is not None and req.max_tokens > limit:
            raise InvalidRequestError(
                f"'max_tokens' is {req.max_tokens}, but model '{shown(endpoint.model)}' generates at most {limit} "
                "tokens per choice",
                param="max_tokens",
                code="invalid_value",
            )
        tokens = 16 if req.max_tokens is None else req.max_tokens
        k = req.logprobs if isinstance(req.logprobs, int) else None
        total = 0
        for prompt in _prompt_texts(req.prompt):
            size = len(prompt) if prompt.isascii() else len(prompt.encode("utf-8", "surrogatepass"))
            own = size if endpoint.model == "echo" else tokens * _LONGEST_WORD
            total += (own + (size if req.echo else 0)) * (req.n or 1)
        if k is not None:
            # Each token also carries its logprob, offset and k alternatives in JSON: about (4 + 3k) x its text.
            total *= 4 + 3 * k
        if total > caps.emulated_answer_bytes:
            param = "n" if (req.n or 1) > 1 else "logprobs" if k is not None else "echo" if req.echo else "prompt"
            raise InvalidRequestError(
                f"'{param}' would make model '{shown(endpoint.model)}' build an answer of about {total} bytes; at most "
                f"{caps.emulated_answer_bytes} are allowed",
                param=param,
                code="invalid_value",
            )

    def _behaviour(self, endpoint: Endpoint) -> tuple[str, float, float]:
        m = _BEHAVIOUR.match(endpoint.model)
        if m is None:
            return (endpoint.model if endpoint.model in ("echo", "long") else "text"), 0.0, 0.0
        if m.group(3):
            status = int(m.group(3))
            raise UpstreamStatusError(
                f"{endpoint.provider} error ({status}): fake failure requested by model name",
                upstream_status=status,
                provider=endpoint.provider,
                retry_after=1.0 if status == 429 else None,
            )
        ms = int(m.group(2)) / 1000.0
        return "text", (ms if m.group(1) == "slow" else 0.0), (ms if m.group(1) == "drip" else 0.0)

    def _choices(self, req: CompletionRequest, behaviour: str) -> tuple[list[Choice], list[list[str]], Usage]:
        """The choices, each one's text split into the tokens a stream sends, and the usage."""
        n = req.n or 1
        k = req.logprobs if isinstance(req.logprobs, int) else None
        prompts = _prompt_texts(req.prompt)
        choices: list[Choice] = []
        pieces: list[list[str]] = []
        prompt_tokens = completion_tokens = 0
        for p_index, prompt in enumerate(prompts):
            p_tokens = _tokens(prompt)
            prompt_tokens += len(p_tokens)
            for j in range(n):
                g = _generate(prompt, p_tokens, j, req, behaviour)
                completion_tokens += len(g.tokens)
                text, tokens, lps = g.text, g.tokens, list[float | None](g.logprobs)
                if req.echo:
                    text = prompt + text
                    tokens = p_tokens + tokens
                    if k is not None:
                        lps = _echo_logprobs(prompt, p_tokens) + lps
                logprobs = None
                if k is not None:
                    # OpenAI's offsets count into prompt + text: an echoed prompt starts at 0, a continuation
                    # right after its prompt.
                    offsets = text_offsets(tokens, 0 if req.echo else len(prompt))
                    top = _top(tokens, lps, k)
                    logprobs = Logprobs(tokens=tokens, token_logprobs=lps, top_logprobs=top, text_offset=offsets)
                finish: FinishReason = "length" if g.finish == "length" else "stop"
                choices.append(Choice(text=text, index=p_index * n + j, logprobs=logprobs, finish_reason=finish))
                pieces.append(tokens)
        usage = Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )
        return choices, pieces, usage

    async def complete(self, req: CompletionRequest, endpoint: Endpoint, ctx: CallContext) -> Completion:
        behaviour, delay, _ = self._behaviour(endpoint)
        if delay:
            await asyncio.sleep(delay)
        if _CRASH.match(endpoint.model):
            raise FakeCrash("fake crash requested by model name")
        choices, _, usage = self._choices(req, behaviour)
        return ctx.completion(choices, usage)

    async def stream(
        self, req: CompletionRequest, endpoint: Endpoint, ctx: CallContext
    ) -> AsyncGenerator[Completion, None]:
        behaviour, delay, interval = self._behaviour(endpoint)
        if delay:
            await asyncio.sleep(delay)
        choices, token_lists, usage = self._choices(req, behaviour)
        crash = _CRASH.match(endpoint.model)
        crash_after = int(crash.group(1)) if crash else -1
        sent = 0
        for choice, tokens in zip(choices, token_lists, strict=True):
            lp = choice.logprobs
            pieces = tokens or [""]
            for i, piece in enumerate(pieces):
                if sent == crash_after:
                    raise FakeCrash("fake crash requested by model name")
                last = i == len(pieces) - 1
                chunk_lp = None
                if lp is not None and not tokens:
                    # A choice with no tokens (empty prompt, max_tokens 0) still ends with a chunk: it carries none.
                    chunk_lp = Logprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
                elif lp is not None:
                    chunk_lp = Logprobs(
                        tokens=[piece],
                        token_logprobs=[lp.token_logprobs[i]],
                        top_logprobs=[lp.top_logprobs[i]] if lp.top_logprobs is not None else None,
                        text_offset=[lp.text_offset[i]],
                    )
                yield Completion(
                    id=ctx.id,
                    created=ctx.created,
                    model=ctx.model,
                    choices=[
                        Choice(
                            text=piece,
                            index=choice.index,
                            logprobs=chunk_lp,
                            finish_reason=choice.finish_reason if last else None,
                        )
                    ],
                )
                sent += 1
                if interval:
                    await asyncio.sleep(interval)
                elif sent % _YIELD_EVERY == 0:
                    await asyncio.sleep(0)
        yield ctx.completion([], usage)
