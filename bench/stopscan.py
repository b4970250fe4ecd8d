"""``python -m bench.stopscan STOPS TEXT REPS``: feed one text through the stop scanner REPS times.

Run it under callgrind twice with different REPS; the difference of the totals over the difference of
the pieces fed is the scan's instructions per piece (docs/performance.md, "What each
feature costs"). STOPS: ``lm-eval`` (HumanEval's stops and the end-of-text token) or ``many`` (24 stops, 15
distinct first characters). TEXT: ``ascii`` (stream pieces like `` tok7``), ``code`` (pieces of Python,
about half with a newline or ``<``), ``cjk`` (Japanese pieces) or ``long`` (one 3,250-character answer).
"""

from __future__ import annotations

import sys

from gateway.emulation.stops import StopScanner, matcher

STOPS: dict[str, list[str]] = {
    "lm-eval": ["\nclass", "\ndef", "\n#", "\nif", "\nprint", "<|endoftext|>"],
    "many": [
        *["\nclass", "\ndef", "\n#", "\nif", "\nprint", "<|endoftext|>", "Question:", "</s>", "<|im_end|>"],
        *["\n\n", "Q:", "A:", "Problem:", "Solution:", "###", "Human:", "Assistant:", "User:", "[INST]"],
        *["tokens:", "ok.", "1.", "0)", " t0k"],
    ],
}
TEXTS: dict[str, list[str]] = {
    "ascii": [f" tok{i}" for i in range(20)],
    "code": ["def f(x):", "\n    return", " x + 1", "\n\n", "print(f(2))", "\n# done", " <b>", "end"] * 3,
    "cjk": ["これは日本語の文章です"] * 20,
    "long": ["The quick brown fox jumps over the lazy dog.\nQ: what? A: that.\n" * 50],
}


def main(argv: list[str]) -> int:
    stops, text, reps = STOPS[argv[0]], TEXTS[argv[1]], int(argv[2])
    m = matcher(stops)
    for _ in range(reps):
        scanner = StopScanner(m, False)
        for piece in text:
            scanner.feed(piece)
        scanner.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
