"""SSE and NDJSON decoders: real recordings (OpenAI, TGI `data:` without a space, Gemini CRLF, Anthropic
named events, Ollama NDJSON) split at every byte boundary, plus the spec corners the recordings lack."""

from __future__ import annotations

import json
import random
import re

import pytest

from gateway.upstream.framing import DONE, EventTooLarge, NDJSONDecoder, SSEDecoder, sse_event
from tests.helpers.adapters import chunked
from tests.helpers.recordings import fixture_bytes

Event = tuple[str | None, bytes]


def sse_all(parts: list[bytes]) -> list[Event]:
    decoder = SSEDecoder()
    events = [e for part in parts for e in decoder.feed(part)]
    return events + decoder.close()


def ndjson_all(parts: list[bytes]) -> list[Event]:
    decoder = NDJSONDecoder()
    events = [e for part in parts for e in decoder.feed(part)]
    return events + decoder.close()


def openai_events() -> list[Event]:
    raw = fixture_bytes("openai/completion_stream_davinci002.sse.txt").decode()
    return [(None, line[len("data: ") :].encode()) for line in raw.split("\n") if line.startswith("data: ")]


def test_openai_recording_whole() -> None:
    events = sse_all([fixture_bytes("openai/completion_stream_davinci002.sse.txt")])
    assert events == openai_events()
    assert len(events) == 17 and events[-1] == (None, b"[DONE]")


def test_openai_recording_every_two_way_split() -> None:
    raw = fixture_bytes("openai/completion_stream_davinci002.sse.txt")
    expected = openai_events()
    for cut in range(len(raw) + 1):
        assert sse_all([raw[:cut], raw[cut:]]) == expected, cut


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11, 17, 31, 97])
def test_openai_recording_odd_chunks(size: int) -> None:
    raw = fixture_bytes("openai/completion_stream_davinci002.sse.txt")
    assert sse_all(chunked(raw, size)) == openai_events()


def test_tgi_data_without_space_every_split() -> None:
    raw = fixture_bytes("tgi/generate_stream_details.sse.txt")
    assert raw.startswith(b"data:{")
    expected = [(None, raw.strip()[len(b"data:") :])]
    assert json.loads(expected[0][1])["details"]["finish_reason"] == "length"
    for cut in range(len(raw) + 1):
        assert sse_all([raw[:cut], raw[cut:]]) == expected


def test_gemini_crlf_every_split() -> None:
    raw = fixture_bytes("gemini/stream_generate_content.sse.txt")
    assert b"\r\n\r\n" in raw
    whole = sse_all([raw])
    texts = [json.loads(d)["candidates"][0]["content"]["parts"][0]["text"] for _, d in whole]
    assert "".join(texts) == "The capital of France is Paris.\n"
    assert all(not d.endswith(b"\r") for _, d in whole)
    for cut in range(len(raw) + 1):
        assert sse_all([raw[:cut], raw[cut:]]) == whole


def test_anthropic_named_events() -> None:
    raw = fixture_bytes("anthropic/messages_stream.sse.txt")
    events = sse_all(chunked(raw, 5))
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    # The recording pads data lines with trailing spaces inside the JSON; the decoder keeps data verbatim.
    assert json.loads(events[3][1])["delta"]["text"] == "2"


def test_comments_keep_alives_and_blank_lines_are_skipped() -> None:
    raw = fixture_bytes("openai/completion_stream_davinci002.sse.txt")
    padded = b": keep-alive\n\n\n" + raw.replace(b"\n\n", b"\n\n: keep-alive\n\n\n\n")
    assert sse_all(chunked(padded, 9)) == openai_events()


def test_multi_line_data_is_joined_with_newline() -> None:
    assert sse_all([b'data: {\ndata:  "a": 1\ndata: }\n\n']) == [(None, b'{\n "a": 1\n}')]


def test_event_name_applies_to_one_event_only() -> None:
    events = sse_all([b"event: first\ndata: 1\n\ndata: 2\n\nevent: lonely\n\ndata: 3\n\n"])
    assert events == [("first", b"1"), (None, b"2"), (None, b"3")]


def test_other_fields_and_fieldless_lines() -> None:
    events = sse_all([b"id: 7\nretry: 100\ndata: x\nunknown: y\n\ndata\n\n"])
    # A line without a colon is a field name with an empty value (spec); `data` alone is an empty data line.
    assert events == [(None, b"x"), (None, b"")]


def test_only_one_leading_space_is_stripped() -> None:
    assert sse_all([b"data:   padded \n\n"]) == [(None, b"  padded ")]


def test_close_flushes_an_unterminated_event() -> None:
    assert sse_all([b"data: [DONE]"]) == [(None, b"[DONE]")]
    assert sse_all([b"data: a\n"]) == [(None, b"a")]
    assert sse_all([b"data: a\r"]) == [(None, b"a")]
    assert sse_all([b""]) == []


def test_crlf_split_between_cr_and_lf() -> None:
    assert sse_all([b"data: a\r", b"\n\r", b"\n"]) == [(None, b"a")]


def test_sse_event_and_done_round_trip() -> None:
    assert sse_event(b'{"a":1}') == b'data: {"a":1}\n\n'
    assert sse_all([sse_event(b'{"a":1}'), DONE]) == [(None, b'{"a":1}'), (None, b"[DONE]")]


def test_ollama_ndjson_every_split() -> None:
    raw = fixture_bytes("ollama/generate_stream.ndjson")
    lines = [line for line in raw.split(b"\n") if line.strip()]
    expected: list[Event] = [(None, line) for line in lines]
    objects = [json.loads(d) for _, d in expected]
    assert objects[-1]["done"] is True and all(not o["done"] for o in objects[:-1])
    for cut in range(0, len(raw) + 1, 7):
        assert ndjson_all([raw[:cut], raw[cut:]]) == expected
    assert ndjson_all(chunked(raw, 1)) == expected


def test_ndjson_blank_lines_crlf_and_unterminated_last_line() -> None:
    events = ndjson_all([b'{"a":1}\r\n\n  \n{"b"', b":2}"])
    assert [(name, json.loads(data)) for name, data in events] == [(None, {"a": 1}), (None, {"b": 2})]
    assert ndjson_all([b"\n\n"]) == []


def reference_sse(raw: bytes) -> list[Event]:
    """The spec's reading of a whole stream, one line at a time: what the decoder must give however the
    stream is cut into chunks, and whether or not an event takes its one-step way."""
    events: list[Event] = []
    data: list[bytes] = []
    name: str | None = None
    lines = re.split(rb"\r\n|\r|\n", raw.removeprefix(b"\xef\xbb\xbf"))  # the standard's three line ends
    if lines[-1] == b"":
        lines.pop()  # the last line ended; a last line without its end is still a line (`close`)
    for line in [*lines, b""]:
        if not line:
            if data:
                events.append((name, b"\n".join(data)))
            data, name = [], None
            continue
        if line.startswith(b":"):
            continue
        field, _, value = line.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if field == b"data":
            data.append(value)
        elif field == b"event":
            name = value.decode()
    return events


_PIECES = [
    b'data: {"a":1}\n\n',
    b"data: [DONE]\n\n",
    b"data:{}\n\n",
    b"data: x\r\n\r\n",
    b"data: two\ndata: lines\n\n",
    b"event: named\ndata: y\n\n",
    b": keep-alive\n\n",
    b"\n",
    b"data: \n\n",
    b"data:  spaced\n\n",
    b"id: 3\ndata: z\n\n",
    b"data: a\n",  # an event whose blank line comes with a later piece
    b"data: cr\r\n\n",
    b"data: lone cr\r\r",
    b"data: mixed\r\n\r",
    b"data: cr then\rdata: lf\n\n",
]


@pytest.mark.parametrize("seed", range(40))
def test_any_stream_any_chunks_reads_as_the_spec_does(seed: int) -> None:
    rng = random.Random(seed)
    raw = b"\xef\xbb\xbf" * (seed % 2) + b"".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 30)))
    cuts = sorted(rng.sample(range(len(raw) + 1), min(len(raw) + 1, rng.randint(0, 12))))
    parts = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    assert sse_all(parts) == reference_sse(raw)
    assert sse_all([raw]) == reference_sse(raw)


def test_a_whole_event_over_the_cap_is_refused_as_a_split_one_is() -> None:
    big = b"data: " + b"x" * 65 + b"\n\n"
    for parts in ([big], [big[:10], big[10:]]):
        decoder = SSEDecoder(max_event_bytes=64)
        with pytest.raises(EventTooLarge):
            for part in parts:
                decoder.feed(part)
    at_cap = b"data: " + b"x" * 64 + b"\n\n"
    assert SSEDecoder(max_event_bytes=64).feed(at_cap) == [(None, b"x" * 64)]


def test_each_decoder_counts_what_it_took_in_and_what_an_unfinished_event_holds() -> None:
    """What the stream's idle cap reads (`fed`, `held`): every byte taken in, and of them the event still arriving."""
    sse = SSEDecoder()
    assert sse.feed(b": ping\n\n") == [] and (sse.fed, sse.held()) == (8, 0)
    assert sse.feed(b"data: ab\ndata: c") == [] and (sse.fed, sse.held()) == (24, 3 + 7)
    assert sse.feed(b"\n\n") == [(None, b"ab\nc")] and (sse.fed, sse.held()) == (26, 0)
    nd = NDJSONDecoder()
    assert nd.feed(b'{"a":1}\n{"b"') == [(None, b'{"a":1}')] and (nd.fed, nd.held()) == (12, 4)
