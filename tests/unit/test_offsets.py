"""Text offsets for logprobs when the upstream omits them (Together sends `{tokens, token_logprobs}` only,
and a bare float per stream chunk): non-echo starts at len(prompt), echo at 0, one running offset per choice.

No recording with logprobs exists (fixtures/INDEX.md: every one has `logprobs: null`), so these inputs are the
real recordings with only their `logprobs` value replaced by the documented shape (docs/providers.md, Together).
"""

from __future__ import annotations

import json
from typing import Any

from gateway.upstream.framing import SSEDecoder
from providers.offsets import prompt_for_choice, text_offsets
from providers.together import TogetherAdapter
from tests.helpers.adapters import context
from tests.helpers.recordings import fixture_bytes, fixture_json

ADAPTER = TogetherAdapter()
PROMPT = "Tell me a joke about opentelemetry"
# The davinci-002 recording's text, split into tokens.
TOKENS = ["-", "go", " library", "\n", "S", "-", "dm", "ssea", " 2020", "-", "08", "-", "13", ":", " How"]


def test_text_offsets() -> None:
    assert text_offsets([], 5) == []
    assert text_offsets(["a", "bc", "", "def"], 0) == [0, 1, 3, 3]
    assert text_offsets(["a", "bc"], 10) == [10, 11]


def test_prompt_for_choice() -> None:
    prompts = ["p0", "p1", "p2"]
    assert [prompt_for_choice(prompts, i, 2) for i in range(6)] == ["p0", "p0", "p1", "p1", "p2", "p2"]
    assert prompt_for_choice(prompts, 9, 1) == ""
    assert prompt_for_choice(None, 0, 1) == ""
    assert prompt_for_choice(prompts, 1, 0) == "p1"
    # An upstream's index may be anything: a negative one continues no prompt (not the last one, as a list reads it).
    assert [prompt_for_choice(prompts, i, 1) for i in (-1, -3, -4)] == ["", "", ""]


def _response(logprobs: dict[str, Any], choices: int = 1) -> bytes:
    body = fixture_json("openai/completion_davinci002.json")
    template = body["choices"][0]
    body["choices"] = [{**template, "index": i, "logprobs": logprobs} for i in range(choices)]
    return json.dumps(body).encode()


def _expected_offsets(start: int, tokens: list[str]) -> list[int]:
    out, pos = [], start
    for tok in tokens:
        out.append(pos)
        pos += len(tok)
    return out


def test_fixture_tokens_cover_the_recorded_text() -> None:
    assert "".join(TOKENS) == fixture_json("openai/completion_davinci002.json")["choices"][0]["text"]


def test_non_echo_offsets_start_after_the_prompt() -> None:
    body = _response({"tokens": TOKENS, "token_logprobs": [-0.5] * len(TOKENS)})
    out = ADAPTER.parse_response(body, context([PROMPT]))
    lp = out.choices[0].logprobs
    assert lp is not None
    assert lp.text_offset[0] == len(PROMPT) == 34
    assert lp.text_offset == _expected_offsets(34, TOKENS)
    assert lp.tokens == TOKENS
    assert lp.top_logprobs is None


def test_echo_offsets_start_at_zero() -> None:
    tokens = ["Tell", " me", " a", " joke", " about", " opent", "elemetry", *TOKENS]
    body = _response({"tokens": tokens, "token_logprobs": [None] + [-1.0] * (len(tokens) - 1)})
    out = ADAPTER.parse_response(body, context([PROMPT], echo=True))
    lp = out.choices[0].logprobs
    assert lp is not None
    assert lp.text_offset == _expected_offsets(0, tokens)
    assert lp.text_offset[7] == len(PROMPT)
    assert lp.token_logprobs[0] is None


def test_each_choice_continues_its_own_prompt() -> None:
    body = _response({"tokens": TOKENS, "token_logprobs": [-0.5] * len(TOKENS)}, choices=4)
    out = ADAPTER.parse_response(body, context(["short", PROMPT], n=2))
    starts = [c.logprobs.text_offset[0] for c in out.choices if c.logprobs is not None]
    assert starts == [5, 5, 34, 34]


def test_upstream_offsets_are_kept_when_consistent() -> None:
    given = [100 + i for i in range(len(TOKENS))]
    body = _response({"tokens": TOKENS, "token_logprobs": [-0.5] * len(TOKENS), "text_offset": given})
    lp = ADAPTER.parse_response(body, context([PROMPT])).choices[0].logprobs
    assert lp is not None and lp.text_offset == given


def test_upstream_offsets_of_the_wrong_length_are_recomputed() -> None:
    body = _response({"tokens": TOKENS, "token_logprobs": [-0.5] * len(TOKENS), "text_offset": [0]})
    lp = ADAPTER.parse_response(body, context([PROMPT])).choices[0].logprobs
    assert lp is not None and lp.text_offset == _expected_offsets(34, TOKENS)


def _stream_with_float_logprobs() -> list[bytes]:
    raw = fixture_bytes("openai/completion_stream_davinci002.sse.txt")
    decoder = SSEDecoder()
    events = decoder.feed(raw) + decoder.close()
    datas = [data for _, data in events if data != b"[DONE]"]
    return [d.replace(b'"logprobs":null', b'"logprobs":-%d.25' % i) for i, d in enumerate(datas)]


def test_together_float_logprobs_in_stream_chunks() -> None:
    ctx = context([PROMPT])
    chunks = [ADAPTER.parse_event(None, data, ctx) for data in _stream_with_float_logprobs()]
    texts: list[str] = []
    offsets: list[int] = []
    for i, chunk in enumerate(chunks):
        assert chunk is not None
        choice = chunk.choices[0]
        assert choice.logprobs is not None
        assert choice.logprobs.tokens == [choice.text]
        assert choice.logprobs.token_logprobs == [-(i + 0.25)]
        assert choice.logprobs.top_logprobs is None
        texts.append(choice.text)
        offsets.extend(choice.logprobs.text_offset)
    assert offsets == _expected_offsets(len(PROMPT), texts)
    assert ctx.offsets == {0: len(PROMPT) + len("".join(texts))}


def test_stream_offsets_run_per_choice_index() -> None:
    ctx = context(["ab", "wxyz"])
    datas = _stream_with_float_logprobs()[:4]
    # Alternate the recorded chunks between choice 0 and choice 1.
    for i, data in enumerate(datas):
        data = data.replace(b'"index":0', b'"index":%d' % (i % 2))
        ADAPTER.parse_event(None, data, ctx)
    texts = [json.loads(d)["choices"][0]["text"] for d in datas]  # "-common", ".\n\n", "I", "'m"
    assert ctx.offsets == {0: 2 + len(texts[0]) + len(texts[2]), 1: 4 + len(texts[1]) + len(texts[3])}
