"""Text offsets for logprobs when a provider does not send them, or counts them its own way.

OpenAI's legacy `text_offset` counts characters into prompt + completion, so the first generated token
of a non-echo completion sits at `len(prompt)`; with echo the prompt's own tokens start at 0 (a recorded
gpt-3.5-turbo-instruct stream starts its first token at 36, after its prompt: docs/clients.md). vLLM
counts from the start of the choice's own text instead (0 without echo), so its offsets are computed here
too. A prompt sent as token ids has no text the gateway knows: its continuation's offsets start at 0.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence, Sized
from typing import Any

from providers.envelope import Unreadable


def aligned(tokens: Sized, *lists: Sized | None) -> None:
    """An upstream's logprobs lists (`token_logprobs`, `top_logprobs`), one entry per token each where sent; lists
    of other lengths are an unreadable answer, never a client's misaligned arrays or an index past a list's end
    when the gateway cuts them at a stop it enforces."""
    for other in lists:
        if other is not None and len(other) != len(tokens):
            raise Unreadable(f"logprobs with {len(tokens)} tokens and a list of {len(other)}")


def text_offsets(tokens: Sequence[str], start: int) -> list[int]:
    out: list[int] = []
    pos = start
    for tok in tokens:
        out.append(pos)
        pos += len(tok)
    return out


def prompt_for_choice(prompts: Sequence[str] | None, index: int, n: int) -> str:
    """The prompt a choice continues: choice index = prompt_index * n + j (OpenAI's rule)."""
    if not prompts:
        return ""
    i = index // max(n, 1)
    return prompts[i] if 0 <= i < len(prompts) else ""  # an upstream's index may be anything


def token_key(text: str, raw: bytes | None) -> str:
    """The string a token is named by in `tokens` and `top_logprobs`: its text, or, when its bytes are not
    whole UTF-8 (a piece of a multi-byte character), OpenAI's `bytes:\\xNN...` form, so that tokens which
    would all decode to "" (or to U+FFFD) stay apart and say what they are."""
    if raw is None:
        return text
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def key_bytes(key: str) -> bytes:
    """A token's bytes from its name (`token_key`'s inverse; any other string is its UTF-8)."""
    if key.startswith("bytes:\\x"):
        try:
            return bytes(int(h, 16) for h in key[len("bytes:\\x") :].split("\\x"))
        except ValueError:
            pass
    return key.encode("utf-8", "surrogatepass")


def running_offsets(
    offsets: dict[int, int], state: dict[str, Any], index: int, start: int, raws: Sequence[bytes]
) -> list[int]:
    """Character offsets of the next tokens of choice `index`, counted from their bytes.

    A token's offset is the number of characters the bytes before it decode to, as the server's text has
    them: a character split over tokens counts once it is whole, a byte that can start no character counts
    as the U+FFFD llama-server writes for it. Counting token strings instead drifts on every token that is
    only part of a character. `offsets` and `state` carry the running position and the undecoded bytes
    across a stream's chunks.
    """
    pos = offsets.get(index, start)
    name = f"utf8:{index}"
    decoder = state.get(name)
    if decoder is None:
        decoder = state[name] = codecs.getincrementaldecoder("utf-8")("replace")
    out: list[int] = []
    for raw in raws:
        out.append(pos)
        pos += len(decoder.decode(raw))
    offsets[index] = pos
    return out
