"""One answer shape whichever provider serves it (issue 12, item 8), checked over real sockets.

- `text_offset` counts into prompt + text as OpenAI's does: a continuation starts at len(prompt), an echoed
  prompt at 0. OpenAI: a recorded gpt-3.5-turbo-instruct stream (docs/clients.md) puts its first token at
  36, after its prompt. vLLM counts from the start of the choice's own text instead (0 without echo), so the
  gateway computes OpenAI's offsets for it; the fake provider computes them itself.
- The fake provider's echoed prompt tokens: `token_logprobs` and `top_logprobs` agree (the first token has
  neither, every other one is in its alternatives with exactly its logprob), as vLLM and OpenAI answer.
- SGP's `stop_sequences` is what SGP's API says (`string[]`): a list; a bare string is refused with SGP's
  422, while `stop` (OpenAI's name) takes a bare string as a one-item list.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.helpers.clients import sse_data
from tests.helpers.upstreams import Upstream

from .conftest import LOCAL, VLLMLike

PROMPTS = ["Question: what sat on the mat?\nAnswer:", "the cat"]
MODELS = [pytest.param("demo/text", id="fake"), pytest.param(LOCAL, id="vllm")]


def _choices(api: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The choices of an answer, or of a stream merged per choice index (tokens and offsets concatenated)."""
    resp = api.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    if not body.get("stream"):
        choices: list[dict[str, Any]] = resp.json()["choices"]
        return choices
    merged: dict[int, dict[str, Any]] = {}
    for data in sse_data(resp.text):
        if data == "[DONE]":
            continue
        for c in json.loads(data)["choices"]:
            into = merged.setdefault(c["index"], {"index": c["index"], "text": "", "logprobs": None})
            into["text"] += c["text"]
            if c["logprobs"] is not None:
                lp = into["logprobs"] = into["logprobs"] or {k: [] for k in c["logprobs"]}
                for key, values in c["logprobs"].items():
                    lp[key].extend(values)
    return [merged[i] for i in sorted(merged)]


def _assert_contiguous(lp: dict[str, Any], start: int) -> None:
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"])
    assert lp["text_offset"][0] == start
    for i in range(1, len(lp["tokens"])):
        assert lp["text_offset"][i] == lp["text_offset"][i - 1] + len(lp["tokens"][i - 1])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("model", MODELS)
def test_continuation_offsets_start_after_the_prompt(
    api: httpx.Client, upstream: Upstream, vllm_like: VLLMLike, model: str, stream: bool
) -> None:
    body = {"model": model, "prompt": PROMPTS, "max_tokens": 5, "logprobs": 2, "n": 2, "stream": stream}
    choices = _choices(api, body)
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    for c in choices:
        _assert_contiguous(c["logprobs"], len(PROMPTS[c["index"] // 2]))
    if model == LOCAL:
        # What vLLM itself answered: offsets from 0. The gateway moved them to where OpenAI's are.
        sent = upstream.only().json()
        assert sent["logprobs"] == 2 and not sent.get("echo")
        assert [c["logprobs"]["text_offset"][0] for c in vllm_like.answer(sent)["choices"]] == [0, 0, 0, 0]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("model", MODELS)
def test_echo_offsets_start_at_zero_and_reach_the_continuation_at_len_prompt(
    api: httpx.Client, upstream: Upstream, model: str, stream: bool
) -> None:
    body = {"model": model, "prompt": PROMPTS, "max_tokens": 3, "logprobs": 1, "echo": True, "stream": stream}
    for c in _choices(api, body):
        prompt = PROMPTS[c["index"]]
        lp = c["logprobs"]
        _assert_contiguous(lp, 0)
        assert c["text"].startswith(prompt)
        # The first token after the prompt sits at len(prompt), as in a non-echo answer.
        assert len(prompt) in lp["text_offset"]
        assert lp["token_logprobs"][0] is None


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("model", MODELS)
def test_echoed_logprobs_agree_with_their_alternatives(api: httpx.Client, model: str, stream: bool) -> None:
    body = {"model": model, "prompt": PROMPTS, "max_tokens": 4, "logprobs": 3, "echo": True, "stream": stream}
    for c in _choices(api, body):
        lp = c["logprobs"]
        assert len(lp["top_logprobs"]) == len(lp["tokens"])
        for i, (token, logprob, top) in enumerate(
            zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True)
        ):
            if i == 0:
                assert logprob is None and top is None, "the first token has no context: no logprob, no top"
                continue
            assert logprob is not None and top is not None
            assert top[token] == logprob
            assert len(top) >= 3


def test_fake_echoed_prompt_logprobs_are_not_a_constant(api: httpx.Client) -> None:
    body = {"model": "demo/text", "prompt": PROMPTS[0], "max_tokens": 0, "logprobs": 1, "echo": True}
    lp = _choices(api, body)[0]["logprobs"]
    assert len(set(lp["token_logprobs"][1:])) > 1


SGP = "/v4/beta/completions"


def test_sgp_stop_sequences_is_a_list(api: httpx.Client) -> None:
    prompt = "one two three four five"
    ok = api.post(SGP, json={"model": "demo/echo", "prompt": prompt, "stop_sequences": [" four"]})
    assert ok.status_code == 200, ok.text
    assert ok.json()["choices"][0]["text"] == "one two three"
    bare = api.post(SGP, json={"model": "demo/echo", "prompt": prompt, "stop_sequences": " four"})
    assert bare.status_code == 422, bare.text
    detail = bare.json()["detail"]
    assert [d["loc"] for d in detail] == [["body", "stop_sequences"]]
    stop = api.post(SGP, json={"model": "demo/echo", "prompt": prompt, "stop": " four"})
    assert stop.status_code == 200, stop.text
    assert stop.json()["choices"][0]["text"] == "one two three"
