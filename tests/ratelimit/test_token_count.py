"""The prompt's BPE count a token limit reserves is exactly the library encoder's count, whatever the text.

The gateway counts with the tokenizer backend's own `count` (no token list built) where it agrees with
`encode_ordinary`; these hold it to the encoder on texts that stress the pre-tokenizer and the wrapper's
edge cases (empty, lone surrogates, a special token written as text, over the library's length bound).
"""

from __future__ import annotations

import math
import random
import subprocess
import sys

import pytest

from gateway.limits.tokens import BYTES_PER_TOKEN, _encoding, prompt_bound, text_tokens

# cl100k (gpt-3.5-turbo-instruct) and o200k (gpt-4o): the tables the package embeds.
MODELS = ("gpt-3.5-turbo-instruct", "gpt-4o-mini")
EDGES = [
    "",
    " ",
    "Say hello",
    "<|endoftext|> is text here",
    "a\ud800b lone surrogate",
    "\ud83d\ude00 a pair written as surrogates",
    "   leading and trailing   \n\n\n",
    "def f(x):\n\treturn x ** 2  # 1234567890 12345",
    "I'm sure they'll've done it's 'S 'LL",
    "中文字符 日本語 한국어 😀😃🎉 naïve façade",
    "\u200b\u3000\ufeff zero-width and wide spaces",
    "x" * 5000,
    "ab " * 3000,
]


def _random_texts(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    pieces = [" ", "\n", "\t", "a", "Z", "9", "'", "'s", "é", "中", "😀", "<|endoftext|>", "  ", "hello", ".", "—"]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 120))) for _ in range(n)]


@pytest.mark.parametrize("model", MODELS)
def test_the_count_is_the_encoders(model: str) -> None:
    enc = _encoding(model)
    if enc is None:
        pytest.skip("bpe-openai is not installed")
    for text in [*EDGES, *_random_texts(7, 2000)]:
        assert text_tokens(text, True, model) == len(enc.encode_ordinary(text)), repr(text[:80])


def test_a_text_over_the_librarys_bound_is_estimated() -> None:
    model = MODELS[0]
    if _encoding(model) is None:
        pytest.skip("bpe-openai is not installed")
    text = "hello world " * 90_000  # 1,080,000 characters: the library refuses it, so the estimate counts
    assert text_tokens(text, True, model) == math.ceil(len(text.encode()) / BYTES_PER_TOKEN)
    assert prompt_bound(text, True, model) == len(text.encode()) + 16


def test_budgets_bound_uses_the_same_count() -> None:
    model = MODELS[1]
    enc = _encoding(model)
    if enc is None:
        pytest.skip("bpe-openai is not installed")
    texts = EDGES[:8]
    assert prompt_bound(texts, True, model) == sum(len(enc.encode_ordinary(t)) + 16 for t in texts)


def test_the_tables_load_in_a_process_that_treats_warnings_as_errors() -> None:
    # The library's import reads its tables through a deprecated importlib call; with `-W error` that warning
    # would be an exception, and the failed load would be remembered: every count an estimate from then on.
    code = "from gateway.limits.tokens import _encoding; import sys; sys.exit(_encoding('gpt-4o-mini') is None)"
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
