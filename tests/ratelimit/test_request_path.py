"""The request path's shortcuts say exactly what the general code says.

Admission's common acquire writes its script call from constant segments (`BucketSet.acquire_part`) and its
x-ratelimit headers straight from the script's reply (`reply_headers`); both must match, byte for byte and
header for header, what the general `part` and `rate_headers` (one BucketState per bucket) give. In process memory
it decides with `_Local.acquire_rates`, which must answer and store what the general `run_specs` does.
"""

from __future__ import annotations

import itertools
import random

from gateway.edge.endpoint import _encode_headers
from gateway.limits.admission import _Scopes
from gateway.limits.bucketset import BucketSet
from gateway.limits.gcra import BucketState, _Local
from gateway.limits.rateheaders import as_text, duration, rate_headers, reply_headers
from gateway.limits.ratelimit import Bucket, Kind

KINDS: tuple[Kind, ...] = ("rps", "rpm", "tpm", "tpd", "concurrent")


def sets(most: int = 3) -> list[list[Bucket]]:
    return [
        [Bucket(f"key:s{i}", kind, 10 + i, f"key:id{i}") for i, kind in enumerate(combo)]
        for n in range(1, most + 1)
        for combo in itertools.product(KINDS, repeat=n)
    ]


def test_the_acquire_part_is_the_general_part_for_every_set_of_kinds_and_token_count() -> None:
    for buckets in sets():
        for prefix in ("", "{rl}"):
            bset = BucketSet(buckets, prefix, b"f" * 40)
            for tokens in (0, 1, 17, 4095, 4096, 10**12):
                assert bset.acquire_part(tokens) == bset.part("acquire", "", bset.costs(tokens, 1))


class Clock:
    def __init__(self) -> None:
        self.ms = 1_700_000_000_000

    def __call__(self) -> float:
        return (self.ms + 0.5) / 1000


def test_acquire_rates_answers_and_stores_what_run_specs_does() -> None:
    rng = random.Random(11)
    rates: tuple[Kind, ...] = ("rps", "rpm", "tpm", "tpd")
    for combo in (c for n in (1, 2, 3) for c in itertools.product(rates, repeat=n)):
        # Limits a few requests exhaust (token limits a few prompts), so that refusals come up as often.
        buckets = [Bucket(f"s{i}", kind, 100 if kind in ("tpm", "tpd") else 5) for i, kind in enumerate(combo)]
        bset = BucketSet(buckets)
        clock = Clock()
        fast, general = _Local(clock), _Local(clock)
        answers: list[int] = []
        for _ in range(60):
            clock.ms += rng.choice((0, 0, 1, 7, 150, 2_000, 61_000))
            tokens = rng.choice((0, 1, 3, 12, 40))
            if rng.random() < 0.2:  # a settlement's correction, either way, on both
                costs = [float(rng.randint(-20, 20) if t else rng.randint(-2, 1)) for t in bset.token_mask]
                fast.run_specs("adjust", "", bset.specs, costs)
                general.run_specs("adjust", "", bset.specs, costs)
            out = fast.acquire_rates(bset.specs, bset.token_mask, tokens)
            assert out == general.run_specs("acquire", "", bset.specs, bset.costs(tokens, 1))
            assert fast.tat == general.tat
            answers.append(out[0])
        # Admissions and refusals both, for every set.
        assert 0 < sum(answers) < len(answers), buckets


def test_headers_read_from_the_reply_are_those_of_the_bucket_states() -> None:
    rng = random.Random(7)
    for buckets in sets():
        scopes = _Scopes(buckets, BucketSet(buckets), 0)
        for _ in range(20):
            # Small ranges, so that ties (equal remaining, equal reset) come up often.
            pairs = [(rng.randint(0, 3), rng.choice((0, 5, 999, 1000, 1500, 61_000))) for _ in buckets]
            out = [rng.randint(0, 1), rng.randint(0, 9)] + [x for pair in pairs for x in pair]
            states = [BucketState(b, rem, reset) for b, (rem, reset) in zip(buckets, pairs, strict=True)]
            assert reply_headers(out, scopes.labels) == rate_headers(states)
            assert as_text(rate_headers(states)) == _tightest(states)
            # Encoded by admission, they are the bytes the endpoint would send for the same headers as text.
            assert rate_headers(states) == _encode_headers(_tightest(states))


def _tightest(states: list[BucketState]) -> dict[str, str]:
    """Per label, the bucket with the least remaining, then the longest reset, the first of equals."""
    headers: dict[str, str] = {}
    for kinds, label in ((("rps", "rpm"), "requests"), (("tpm", "tpd"), "tokens")):
        mine = [(s.remaining, -s.reset_ms, i, s) for i, s in enumerate(states) if s.bucket.kind in kinds]
        if mine:
            s = min(mine, key=lambda m: m[:3])[3]
            headers[f"x-ratelimit-limit-{label}"] = str(s.bucket.limit)
            headers[f"x-ratelimit-remaining-{label}"] = str(s.remaining)
            headers[f"x-ratelimit-reset-{label}"] = duration(s.reset_ms)
    return headers
