"""Token estimates for reserving rate-limit budget before a call.

Models of the kinds whose adapter says `openai_bpe` (OpenAI, Azure) are counted with their real BPE when the optional
`bpe-openai` package is installed (it embeds cl100k/o200k, so it works offline, unlike `tiktoken`,
which downloads its tables on first use). Everything else, and OpenAI without that package, uses a
documented estimate: one token per 4 UTF-8 bytes, rounded up, which over-reserves slightly for English
and is reconciled with the usage the upstream reports. Token-id prompts are counted exactly.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Final, Protocol

from wire.chat import ChatRequest
from wire.schema import CompletionRequest, Unrendered

if TYPE_CHECKING:
    from gateway.upstream.plan import Route

BYTES_PER_TOKEN = 4
# The library's own bound on a text it encodes (it raises ValueError at and past it).
_MAX_CHARS: Final = 1_000_000
# Texts on which the backend's count must agree with the library's encoder before it is trusted.
_PROBES: Final = (
    "",
    "Say hello",
    "  x\n\n\tdef f(a, b):\n    return a+b # 12345678",
    "naïve 😀 中文 <|endoftext|> 's 'll",
)


class _Encoding(Protocol):
    def encode_ordinary(self, text: str) -> list[int]: ...


@lru_cache(maxsize=32)
def _encoding(model: str) -> _Encoding | None:
    # Its import reads its tables through a deprecated importlib call: a process run with warnings as
    # errors (`-W error`, pytest's filterwarnings) would otherwise lose the real count for good.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return _load(model)


def _load(model: str) -> _Encoding | None:
    try:
        import bpe_openai  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except Exception:  # not installed, or it failed to load its tables: use the estimate, never fail a request
        return None
    # tiktoken's model table: davinci-002, babbage-002 and gpt-3.5-turbo-instruct are cl100k.
    name = "o200k_base" if model.startswith(("gpt-4o", "gpt-4.1", "gpt-5", "o1", "o3", "o4")) else "cl100k_base"
    if model.startswith(("text-davinci-002", "text-davinci-003", "code-")):
        name = "p50k_base"
    elif model in ("davinci", "curie", "babbage", "ada") or model.startswith("text-"):
        name = "r50k_base"
    try:
        enc: Any = bpe_openai.get_encoding(name)
    except Exception:
        return None
    return enc  # type: ignore[no-any-return]


@lru_cache(maxsize=32)
def _counter(model: str) -> Callable[[str], int] | None:
    """What `len(enc.encode_ordinary(text))` is for `model`'s tables, without the wrapper's per-call work (a
    UTF-8 check, a copy of the token list, a limit read through two objects): the Rust backend's own
    `count`, where this version of the library has one that agrees with its encoder. Raises ValueError
    where the library does (a text too long, too many tokens)."""
    enc = _encoding(model)
    if enc is None:
        return None

    def encoded(text: str) -> int:
        return len(enc.encode_ordinary(text))

    count = getattr(getattr(enc, "_backend", None), "count", None)
    limit = getattr(getattr(enc, "_runtime", None), "chunk_limit", None)
    if not callable(count) or type(limit) is not int or limit <= 0:
        return encoded
    try:
        if any(count(p) != encoded(p) for p in _PROBES):
            return encoded
    except Exception:
        return encoded

    def counted(text: str) -> int:
        if len(text) >= _MAX_CHARS:
            return encoded(text)  # the library's own refusal (after its clean-up, which can shorten a text)
        try:
            n: int = count(text)
        except UnicodeEncodeError:  # lone surrogates: the library cleans the text up first
            return encoded(text)
        if n > limit:
            raise ValueError(f"{n} tokens, over the tokenizer's limit of {limit}")
        return n

    return counted


def warm() -> None:
    """Load the BPE tables now: importing bpe-openai takes ~0.7 s, which would otherwise block the event
    loop (every request in flight) on the first OpenAI-family request with a token limit."""
    _counter("gpt-3.5-turbo-instruct")


def text_tokens(text: str, bpe: bool, model: str) -> int:
    if bpe:
        # As encode_ordinary counts: a prompt's "<|endoftext|>" is text the client sent, which `encode` would
        # refuse with an exception.
        count = _counter(model)
        if count is not None:
            try:
                return count(text)
            except ValueError:  # over the library's own size limits: the estimate still reserves something
                pass
    size = len(text) if text.isascii() else len(text.encode("utf-8"))  # ASCII: a byte a character, no copy
    return -(-size // BYTES_PER_TOKEN)


def unrendered_tokens(beside: Unrendered, bpe: bool, model: str) -> int:
    """What a request sends beside its prompt text (`wire.schema.Unrendered`): its text counted as a prompt's
    is, and its images' allowance."""
    text = beside.text
    return (text_tokens(text, bpe, model) if text else 0) + beside.image_tokens


def prompt_count(prompt: str | list[Any]) -> int:
    """The prompts `prompt` holds: a list of texts or of token-id lists is one per item, else one. Each goes
    upstream with what the request sends beside it (a suffix, a schema), which is counted once per prompt."""
    return 1 if isinstance(prompt, str) or isinstance(prompt[0], int) else len(prompt)


def request_tokens(req: CompletionRequest) -> int:
    """A request's prompt tokens by the estimate (no BPE), what is sent beside its prompts included: for the
    usage of a stream no one counted."""
    prompt = prompt_tokens(req.prompt, False, "")
    beside = req.unrendered
    if beside is None:
        return prompt
    return prompt + prompt_count(req.prompt) * unrendered_tokens(beside, False, "")


def prompt_tokens(prompt: str | list[Any], bpe: bool, model: str) -> int:
    if isinstance(prompt, str):
        return text_tokens(prompt, bpe, model)
    first = prompt[0]
    if isinstance(first, str):
        return sum(text_tokens(p, bpe, model) for p in prompt)
    if isinstance(first, int):
        return len(prompt)
    return sum(len(p) for p in prompt)


def unbounded_completion(route: Route, cap: int) -> int:
    """Completion tokens per choice a request without `max_tokens` may generate, as budgets and token limits
    count it: nothing bounds the answer but the model's context, so the documented cap
    (`caps.budget_max_tokens`), or the provider's own default (configured, else the adapter's) when larger."""
    return max(route.endpoint.default_max_tokens or route.adapter.default_max_tokens, cap)


def reservation(req: CompletionRequest, bpe: bool, model: str, per_choice: int) -> tuple[int, int]:
    """(prompt tokens, prompt tokens + the most the request may generate: `per_choice` x choices).

    `bpe`: the provider's adapter counts with OpenAI's tables (`openai_bpe`). `per_choice`: the request's
    `max_tokens`, or `unbounded_completion` without one.
    """
    text = req.prompt
    n, best_of = req.n, req.best_of
    choices = 1 if n is None and best_of is None else max(n or 1, best_of or 1)
    beside = req.unrendered  # tools, schemas, a suffix, thinking sent back, images; None for a prompt alone
    if type(text) is str:  # the common case: one text, counted without `prompt_tokens`'s dispatch
        prompt = text_tokens(text, bpe, model)
        if beside is not None:
            prompt += unrendered_tokens(beside, bpe, model)
        return prompt, prompt + per_choice * choices
    prompts = prompt_count(text)
    choices *= prompts
    prompt = prompt_tokens(text, bpe, model)
    if beside is not None:
        prompt += prompts * unrendered_tokens(beside, bpe, model)
    return prompt, prompt + per_choice * choices


def over_limit(
    req: CompletionRequest, bpe: bool, model: str, per_choice: int, counts: tuple[int, int], limit: int
) -> tuple[str, str, str]:
    """What a reservation over a token `limit` is made of, as the refusal says it: (its parts with their tokens,
    the field the client can act on, what to do). `counts`: `reservation`'s, for `per_choice`. The field is
    `max_tokens` only when lowering it alone would fit; else the prompt, or what is sent beside it where that
    weighs more (its largest field)."""
    prompt, tokens = counts
    beside = req.unrendered
    side = 0 if beside is None else prompt_count(req.prompt) * unrendered_tokens(beside, bpe, model)
    choices = (tokens - prompt) // per_choice if per_choice > 0 else 1
    own = "messages" if isinstance(req, ChatRequest) else "prompt"  # a chat's prompt is its rendered messages
    parts = [f"{prompt - side} of {own}"]
    if beside is not None and side:
        parts.append(f"{side} sent beside it" + (f" (most in '{beside.largest}')" if beside.largest else ""))
    answer = f"{per_choice} max_tokens" if req.max_tokens is not None else f"{per_choice} answer tokens by default"
    parts.append(answer + (f" x {choices} choices" if choices != 1 else ""))
    if req.max_tokens is not None and choices and prompt + choices <= limit:
        return " + ".join(parts), "max_tokens", f"lower max_tokens to {(limit - prompt) // choices} or less"
    if beside is not None and side > prompt - side and beside.largest:
        return " + ".join(parts), beside.largest, f"send less in '{beside.largest}'"
    return " + ".join(parts), own, f"shorten the {own}"


# Tokens a provider may add around each prompt (a start token, a chat template's few), beyond its text's.
FRAMING_TOKENS = 16


def prompt_bound(prompt: str | list[Any], bpe: bool, model: str, beside: Unrendered | None = None) -> int:
    """The most tokens `prompt` can be, for budgets (a reservation must cover the real count, not guess it):
    a text's exact BPE count where `bpe` and the tables are there, else its UTF-8 bytes (no byte-level or
    byte-fallback tokenizer makes more tokens than bytes), plus FRAMING_TOKENS per prompt; token ids exactly.
    `beside`: what the request sends beside its prompt text, with each prompt: its text counted the same way
    and its images at their allowance."""
    total = 0
    if isinstance(prompt, str) or isinstance(prompt[0], str):
        for text in [prompt] if isinstance(prompt, str) else prompt:
            count = _counter(model) if bpe else None
            counted = None
            if count is not None:
                try:
                    counted = count(text)
                except ValueError:
                    pass
            total += (len(text.encode("utf-8")) if counted is None else counted) + FRAMING_TOKENS
    elif isinstance(prompt[0], int):
        total = len(prompt) + FRAMING_TOKENS
    else:
        total = sum(len(p) for p in prompt) + FRAMING_TOKENS * len(prompt)
    if beside is not None:  # its text bounded as the prompt's is, framed once with each prompt
        total += prompt_count(prompt) * (prompt_bound(beside.text, bpe, model) - FRAMING_TOKENS + beside.image_tokens)
    return total
