"""Response headers go through a bounded cache of encoded values (gateway/edge/endpoint.py): the cache must never
change what is sent, and client-chosen values must not grow it without bound."""

from __future__ import annotations

from gateway.edge import endpoint


def test_cached_values_are_encoded_exactly_as_uncached_ones() -> None:
    headers = {"x-gateway-model": "up/mödel\x1b[31m", "x-gateway-provider": "up"}
    first = endpoint._encode_headers(headers, "req_1")
    again = endpoint._encode_headers(headers, "req_2")  # now answered from the cache
    assert (
        first[:2]
        == again[:2]
        == [
            (b"x-gateway-model", b"up/m%C3%B6del%1B[31m"),
            (b"x-gateway-provider", b"up"),
        ]
    )
    assert first[2] == (b"x-request-id", b"req_1") and again[2] == (b"x-request-id", b"req_2")


def test_the_cache_is_bounded_and_request_ids_never_enter_it() -> None:
    for i in range(3 * endpoint._ENCODED_MAX):
        endpoint._encode_headers({"x-gateway-model": f"up/m{i}"}, f"req_{i}")
    assert len(endpoint._ENCODED) <= endpoint._ENCODED_MAX
    assert not any(k.startswith("req_") for k in endpoint._ENCODED)
