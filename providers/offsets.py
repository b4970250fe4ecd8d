"""Text offsets for logprobs when a provider does not send them, or counts them its own way.

OpenAI's legacy `text_offset` counts characters into prompt + completion, so the first generated token
of a non-echo completion sits at `len(prompt)`; with echo the prompt's own tokens start at 0 (a recorded
gpt-3.5-turbo-instruct stream starts its first token at 36, after its prompt: docs/clients.md). vLLM
counts from the start of the choice's own text instead (0 without echo), so its offsets are computed here
too. A prompt sent as token ids has no text the gateway knows: its continuation's offsets start at 0.
"""

from __future__ import annotations

from collections.abc import Sequence


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
    return prompts[i] if i < len(prompts) else ""
