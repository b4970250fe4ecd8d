"""Issue 11, item 15: the glob translation itself (gateway/limits/globs.py), on RE2."""

from __future__ import annotations

import time

import pytest

from gateway.limits.globs import ModelGlobs


@pytest.mark.parametrize(
    "patterns,model,allowed",
    [
        (["up/model*"], "up/model", True),
        (["up/model*"], "up/model-x", True),
        (["up/model*"], "up/model/east", False),
        (["openai/*"], "openai/org/model", False),
        (["fireworks/**"], "fireworks/accounts/fireworks/models/x", True),
        (["fireworks/**"], "fireworks", False),
        (["**"], "a/b/c", True),
        (["*"], "a/b", False),
        (["a?c"], "abc", True),
        (["a?c"], "a/c", False),
        (["a.c"], "abc", False),
        (["m[1]"], "m[1]", True),
        (["m[1]"], "m1", False),
        ([], "demo/text", False),
    ],
)
def test_glob(patterns: list[str], model: str, allowed: bool) -> None:
    assert ModelGlobs(patterns).match(model) is allowed


def test_a_pathological_pattern_stays_linear() -> None:
    globs = ModelGlobs(["**a**a**a**a**a**a**a**a**a**a**a**a**a**a**b"])
    started = time.perf_counter()
    assert not globs.match("a" * 256)
    assert time.perf_counter() - started < 0.1
