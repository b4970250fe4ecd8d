"""llama-server's answers as llama.cpp's own code builds them (tools/server/server-task.cpp in the
llama-cpp-python 0.3.36 sdist's vendor/llama.cpp), read by the adapters that sit in front of it: `llamacpp`
(`/completion`) and the OpenAI-compatible ones (`/v1/completions` behind a `vllm` provider).

Each token's `token` is cut to whole UTF-8 (`validate_utf8`) and `bytes` carries all of it: a piece of a
character has `token: ""`. The real servers answer these in tests/realservers/.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway import emulation
from providers.envelope import Unreadable
from providers.llamacpp import LlamaCppAdapter
from providers.vllm import VLLMAdapter
from tests.helpers.adapters import context, request
from wire.errors import InvalidRequestError, UpstreamError, UpstreamStatusError

LLAMA = LlamaCppAdapter()
VLLM = VLLMAdapter()
PROMPT = "# h\u00e9llo w\u00f6rld \u2014 \u00fcn\u00efcode"  # 23 characters, 29 bytes
CHECK = "\u2713".encode()  # e2 9c 93: three tokens of a byte-level BPE, one character


def _prob(tok: int, raw: bytes, logprob: float, top: list[tuple[int, bytes, float]]) -> dict[str, Any]:
    def text(b: bytes) -> str:
        return b.decode("utf-8", "ignore")  # what validate_utf8 leaves of a piece of a character

    return {
        "id": tok,
        "token": text(raw),
        "bytes": list(raw),
        "logprob": logprob,
        "top_logprobs": [{"id": i, "token": text(r), "bytes": list(r), "logprob": lp} for i, r, lp in top],
    }


# " ✓!" as four tokens: " ", the first two bytes of ✓, its last byte, "!". Five alternatives each; at the
# second position three of them are pieces of characters that all decode to "".
PROBS = [
    _prob(220, b" ", -0.1, [(220, b" ", -0.1), (30, b"?", -2.5)]),
    _prob(
        501,
        CHECK[:2],
        -0.2,
        [(501, CHECK[:2], -0.2), (502, b"\xe2\x80", -1.0), (503, b"\xc3", -1.5), (60, b"x", -3.0)]
        + [(504, b"\xe2", -4.0)],
    ),
    _prob(147, CHECK[2:], -0.05, [(147, CHECK[2:], -0.05), (148, b"\x94", -3.0)]),
    _prob(0, b"!", -0.3, [(0, b"!", -0.3)]),
]


def _v1(probs: list[dict[str, Any]] | None, text: str = " \u2713!") -> bytes:
    """`server_task_result_cmpl_final::to_json_oaicompat` of a non-stream /v1/completions answer."""
    return json.dumps(
        {
            "choices": [
                {
                    "text": text,
                    "index": 0,
                    "logprobs": {"content": probs} if probs is not None else None,
                    "finish_reason": "length",
                }
            ],
            "created": 1_700_000_000,
            "model": "tiny",
            "system_fingerprint": "b1-abc",
            "object": "text_completion",
            "usage": {"completion_tokens": 4, "prompt_tokens": 9, "total_tokens": 13},
            "id": "chatcmpl-x",
        }
    ).encode()


def test_v1_chat_shaped_logprobs_are_translated_not_emptied() -> None:
    out = VLLM.parse_response(_v1(PROBS), context([PROMPT], logprobs=True))
    lp = out.choices[0].logprobs
    assert lp is not None
    assert lp.tokens == [" ", "bytes:\\xe2\\x9c", "bytes:\\x93", "!"]
    assert lp.token_logprobs == [-0.1, -0.2, -0.05, -0.3]
    # Character offsets into prompt + text: the two pieces of the check mark add one character, after both.
    assert lp.text_offset == [23, 24, 24, 25]
    assert lp.top_logprobs is not None
    second = lp.top_logprobs[1]
    assert second == {
        "bytes:\\xe2\\x9c": -0.2,
        "bytes:\\xe2\\x80": -1.0,
        "bytes:\\xc3": -1.5,
        "x": -3.0,
        "bytes:\\xe2": -4.0,
    }
    assert all(tok in top for tok, top in zip(lp.tokens, lp.top_logprobs, strict=True) if top)


def test_llamacpp_native_keeps_every_alternative_and_counts_offsets_from_bytes() -> None:
    body = {"content": " \u2713!", "stop": True, "stop_type": "limit", "completion_probabilities": PROBS}
    out = LLAMA.parse_response(json.dumps(body).encode(), context([PROMPT]))
    lp = out.choices[0].logprobs
    assert lp is not None and lp.top_logprobs is not None
    assert lp.text_offset == [23, 24, 24, 25]
    assert [len(top or {}) for top in lp.top_logprobs] == [2, 5, 2, 1]


def test_offsets_run_on_across_stream_chunks_through_a_split_character() -> None:
    ctx = context([PROMPT])
    offsets: list[int] = []
    for p in PROBS:
        event = {"content": p["token"], "stop": False, "completion_probabilities": [p]}
        chunk = LLAMA.parse_event(None, json.dumps(event).encode(), ctx)
        assert chunk is not None and chunk.choices[0].logprobs is not None
        offsets += chunk.choices[0].logprobs.text_offset
    assert offsets == [23, 24, 24, 25]


def test_two_alternatives_with_the_same_text_stay_two() -> None:
    probs = [_prob(7, b"a", -0.1, [(7, b"a", -0.1), (8, b"a", -0.2), (9, b"b", -0.3)])]
    out = VLLM.parse_response(_v1(probs, "a"), context(["p"], logprobs=True))
    lp = out.choices[0].logprobs
    assert lp is not None and lp.top_logprobs == [{"a": -0.1, "token_id:8": -0.2, "b": -0.3}]


def test_echo_cannot_ride_on_the_chat_shape() -> None:
    with pytest.raises(UpstreamError) as err:
        VLLM.parse_response(_v1(PROBS), context([PROMPT], echo=True, logprobs=True))
    assert err.value.code == "unsupported_logprobs_shape" and err.value.status == 502


def test_logprobs_asked_for_and_missing_are_an_unreadable_answer_not_an_empty_list() -> None:
    body = json.loads(_v1(None))
    body["choices"][0]["logprobs"] = {"tokens": [], "token_logprobs": [], "top_logprobs": None}
    with pytest.raises(Unreadable):
        VLLM.parse_response(json.dumps(body).encode(), context([PROMPT], logprobs=True))


@pytest.mark.parametrize(
    ("sent", "relayed"),
    [
        ([0, 1, 1, 2], [23, 24, 24, 25]),  # vLLM: from the start of the completion's own text
        ([23, 24, 24, 25], [23, 24, 24, 25]),  # llama-cpp-python: into prompt + text, as OpenAI counts
    ],
    ids=["vllm", "llama-cpp-python"],
)
def test_a_servers_own_offsets_are_kept_counted_into_prompt_and_text(sent: list[int], relayed: list[int]) -> None:
    body = json.loads(_v1(None))
    body["choices"][0]["logprobs"] = {
        "tokens": [" ", "bytes:\\xe2\\x9c", "bytes:\\x93", "!"],
        "token_logprobs": [-0.1, -0.2, -0.05, -0.3],
        "top_logprobs": None,
        "text_offset": sent,
    }
    out = VLLM.parse_response(json.dumps(body).encode(), context([PROMPT], logprobs=True))
    assert out.choices[0].logprobs is not None
    assert out.choices[0].logprobs.text_offset == relayed


def test_offsets_a_server_did_not_send_are_counted_from_the_tokens_bytes() -> None:
    body = json.loads(_v1(None))
    body["choices"][0]["logprobs"] = {
        "tokens": [" ", "bytes:\\xe2\\x9c", "bytes:\\x93", "!"],
        "token_logprobs": [-0.1, -0.2, -0.05, -0.3],
    }
    out = VLLM.parse_response(json.dumps(body).encode(), context([PROMPT], logprobs=True))
    assert out.choices[0].logprobs is not None
    assert out.choices[0].logprobs.text_offset == [23, 24, 24, 25]


# llama-server's context error (server-context.cpp, format_error_response), on either route.
CONTEXT_ERROR = json.dumps(
    {
        "error": {
            "code": 400,
            "message": "request (600 tokens) exceeds the available context size (512 tokens), try increasing it",
            "type": "exceed_context_size_error",
        }
    }
).encode()


@pytest.mark.parametrize("adapter", [LLAMA, VLLM], ids=["llamacpp", "vllm"])
def test_llama_servers_context_error_has_one_code_on_every_path(adapter: Any) -> None:
    err = adapter.map_error(400, {}, CONTEXT_ERROR, "p")
    assert isinstance(err, UpstreamStatusError)
    assert (err.code, err.context_window, err.status) == ("context_length_exceeded", True, 400)


def test_llama_cpp_python_context_error_is_recognized() -> None:
    message = "Requested tokens (600) exceed context window of 512"
    body = {"error": {"message": message, "type": "internal_server_error"}}
    err = VLLM.map_error(400, {}, json.dumps(body).encode(), "p")
    assert err.context_window and err.code == "context_length_exceeded"


def test_echo_of_token_ids_is_refused_where_the_gateway_echoes() -> None:
    with pytest.raises(InvalidRequestError) as err:
        emulation.plan(LLAMA, request(prompt=[1, 2, 3], echo=True), "ll", 2)
    assert err.value.param == "echo" and err.value.status == 400
