"""Text offsets for logprobs when a provider does not send them.

OpenAI's legacy `text_offset` counts characters into prompt + completion, so the first generated token
of a non-echo completion sits at `len(prompt)`; with echo the prompt's own tokens start at 0.
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
