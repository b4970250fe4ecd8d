"""With one process, histogram observations are gathered and added at the tally's flush: a scrape reads
exactly what observing each value at once would have given."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from gateway.ops.metrics import _LATENCY, _OVERHEAD, Metrics, Record
from wire.schema import Usage


def _samples(text: bytes, name: str) -> dict[str, float]:
    """`name`'s samples by their `le` label (the whole series name when it has none)."""
    out = {}
    for line in text.decode().splitlines():
        if line.startswith(name) and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            le = series.partition('le="')[2].partition('"')[0]
            out[le or series] = float(value)
    return out


def test_gathered_observations_read_as_observed_one_by_one() -> None:
    metrics = Metrics()
    assert not metrics.multiprocess
    reference = CollectorRegistry()
    latency = Histogram("ref_latency", "", buckets=_LATENCY, registry=reference)
    upstream = Histogram("ref_upstream", "", buckets=_LATENCY, registry=reference)
    overhead = Histogram("ref_overhead", "", buckets=_OVERHEAD, registry=reference)
    # Values on the bounds (a bound is its bucket's own: `le`), between them and past the last one.
    values = [0.005, 0.0051, 0.01, 0.5, 0.25, 2.5, 7.0, 130.0, 0.0, 0.0001, 0.003, 0.004, 0.02]
    for i, elapsed in enumerate(values):
        up = elapsed / 3 if i % 2 else elapsed
        rec = Record(request_id=f"r{i}", dialect="openai", provider="up", target="up/m", model="up/m")
        rec.usage = Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3)
        rec.upstream_s = up
        metrics.observe(rec, elapsed)
        latency.observe(elapsed)
        upstream.observe(up)
        overhead.observe(max(elapsed - up, 0.0))
    text, ref = metrics.render(), generate_latest(reference)
    for ours, theirs in (
        ("gateway_request_duration_seconds", "ref_latency"),
        ("gateway_upstream_duration_seconds", "ref_upstream"),
        ("gateway_overhead_seconds", "ref_overhead"),
    ):
        got = _samples(text, ours + "_bucket")
        assert got == _samples(ref, theirs + "_bucket")
        assert len(got) == len(_OVERHEAD if ours == "gateway_overhead_seconds" else _LATENCY) + 1  # and +Inf
        assert list(_samples(text, ours + "_count").values()) == [len(values)]
        assert list(_samples(text, ours + "_sum").values()) == [sum(_samples(ref, theirs + "_sum").values())]
    # A second round after a flush adds to what the first left.
    rec = Record(request_id="again", dialect="openai", provider="up", target="up/m", model="up/m")
    metrics.observe(rec, 0.05)
    assert list(_samples(metrics.render(), "gateway_request_duration_seconds_count").values()) == [len(values) + 1]
