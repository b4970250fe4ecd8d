"""A fanned-out call's seed.

A seeded request the gateway answers in several upstream calls (`n` or `best_of` fanned out, a guided
output asked again) must not send the same seed to each: the calls would sample the same tokens, and `n`
seeded choices would be one choice `n` times. Each call takes the request's seed plus its index, vLLM's
rule for the children of a seeded `n` (vllm/v1/engine/parallel_sampling.py): choice 0 is what the same
request with `n: 1` answers, and the whole answer is as reproducible as the seed makes each call.
"""

from __future__ import annotations

from typing import Final, Protocol, TypeVar

import msgspec

_LOW: Final = -(1 << 63)
_SPAN: Final = 1 << 64


class Seeded(Protocol):
    seed: int | None


_S = TypeVar("_S", bound=Seeded)


def shifted(seed: int | None, by: int) -> int | None:
    """`seed` moved on by `by`, wrapping within the int64 range the gateway takes; no seed stays none."""
    if seed is None or not by:
        return seed
    return (seed + by - _LOW) % _SPAN + _LOW


def reseeded(req: _S, by: int) -> _S:
    """`req` with its seed moved on by `by` (itself when it has none)."""
    if req.seed is None or not by:
        return req
    return msgspec.structs.replace(req, seed=shifted(req.seed, by))  # type: ignore[type-var]  # a Struct


__all__ = ["Seeded", "reseeded", "shifted"]
