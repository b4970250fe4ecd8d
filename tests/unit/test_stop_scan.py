"""The stop scan against the rule it implements, on random text: the earliest-starting stop, then the first
in the list, whatever the pieces, the alphabet (ASCII, NUL, non-ASCII) and how many stops share a first
character. The scan skips ahead without a regex; these cases cover each way it skips."""

from __future__ import annotations

import random

import pytest

from gateway.emulation.stops import StopScanner


def reference(text: str, stops: list[str]) -> tuple[str, bool]:
    hits = [(text.find(s), i) for i, s in enumerate(stops) if s and s in text]
    if not hits:
        return text, False
    at, _ = min(hits)
    return text[:at], True


# (what stops are made of, what texts are made of)
ALPHABETS = {
    "ascii": ("ab\n<|Q:", "ab\n<|Q:"),
    "nul": ("a\0b\n\0<", "a\0b\n\0<"),
    "latin-stops": ("a?é\nß", "a?é\nß日\U0001f600"),
    "mixed": ("aé日\n<\0Q", "aé日\n<\0Q"),
    "wide": ("日本語。\U0001f600a", "日本語。\U0001f600a"),
}


@pytest.mark.parametrize("alphabet", list(ALPHABETS))
def test_pieces_cut_where_the_whole_text_would(alphabet: str) -> None:
    rng = random.Random(f"stops-{alphabet}")
    letters, text_letters = ALPHABETS[alphabet]
    for _ in range(400):
        stops = ["".join(rng.choice(letters) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 30))]
        text = "".join(rng.choice(text_letters) for _ in range(rng.randint(0, 60)))
        scanner = StopScanner(stops, include=False)
        sent: list[str] = []
        stopped = False
        i = 0
        while i < len(text) and not stopped:
            step = rng.randint(1, 7)
            out, stopped = scanner.feed(text[i : i + step])
            sent.append(out)
            i += step
        if not stopped:
            out, stopped = scanner.flush()
            sent.append(out)
        assert ("".join(sent), stopped) == reference(text, stops), (stops, text)
