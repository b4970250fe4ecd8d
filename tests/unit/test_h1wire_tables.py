"""The h1 client's tables of request lines and header blocks made before: what they keep is bounded in
count and in size, whatever URLs and headers the requests carry (a client's `inference_extra_headers` and a
model name in a URL are its own text), and what is made from them is the same kept or not."""

from __future__ import annotations

from gateway.upstream import h1wire
from gateway.upstream.h1wire import header_lines, request_line


def test_a_short_header_block_is_kept_and_made_the_same() -> None:
    headers = {"authorization": "Bearer sk-x", "content-type": "application/json"}
    first = header_lines(headers)
    assert tuple(headers.items()) in h1wire._HEADERS
    assert header_lines(dict(headers)) == first
    assert first.endswith("accept-encoding: gzip, deflate\r\n\r\n")


def test_a_long_header_block_is_made_but_not_kept() -> None:
    headers = {"authorization": "Bearer sk-x", "x-client": "v" * 100_000}
    made = header_lines(headers)
    assert "x-client: " + "v" * 100_000 + "\r\n" in made
    assert tuple(headers.items()) not in h1wire._HEADERS
    assert header_lines(headers) == made


def test_the_tables_never_hold_more_than_their_bound() -> None:
    for i in range(3 * h1wire._LINES_MAX):
        header_lines({"traceparent": f"00-{i:032x}-{i:016x}-01"})
        request_line("POST", f"http://127.0.0.1:8000/m/vendor/model-{i}/v1/completions")
    assert len(h1wire._HEADERS) <= h1wire._LINES_MAX and len(h1wire._LINES) <= h1wire._LINES_MAX
    long_url = "http://127.0.0.1:8000/" + "m" * 10_000
    key, line = request_line("POST", long_url)
    assert key == ("http", "127.0.0.1", 8000) and line == f"POST /{'m' * 10_000} HTTP/1.1\r\n"
    assert ("POST", long_url) not in h1wire._LINES
