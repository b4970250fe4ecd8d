"""lm-evaluation-harness's `local-completions` requests, byte for byte the bodies it builds, replayed through
the gateway to a vLLM server (the loopback `VLLMLike`, see conftest.py).

The bodies follow `LocalCompletionsAPI._create_payload` in `lm_eval/models/openai_completions.py`
(EleutherAI/lm-evaluation-harness @ 0064c3a0, the 0.4 line): for log-likelihoods
`{"model", "prompt": [[ids...], ...], "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234,
"echo": true}` (older releases sent `max_tokens: 0`), with one token-id list per request of the batch; for
generate_until `{"prompt": [...], "model", "max_tokens", "temperature": 0, "stop": until + [eos], "seed"}`.
Its answers are read the way `parse_logprobs` and `parse_generations` read them (re-stated below from
that file), so an answer lm-eval would choke on fails here.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import httpx
import pytest

from tests.helpers.upstreams import Upstream

from .conftest import LOCAL, VLLMLike, decode

# Token ids of three log-likelihood requests of one batch: context + continuation, as lm-eval concatenates them
# (`(context_enc + continuation_enc)[-(max_length + 1):]`), with the context's length lm-eval slices at.
LOGLIKELIHOOD = [
    ([14582, 25, 1867, 318, 362, 10, 17, 30, 198, 33706, 25], [604]),
    ([464, 3797, 3332, 319, 262], [2603]),
    ([40, 588, 11, 257], [3797, 13, 290]),
]
# generate_until's `until` + eos for the tasks the issue names (lm-eval's task yamls): gsm8k's three plus
# eos fit OpenAI's four; humaneval's five, and five plus eos, do not.
GSM8K_STOPS = ["Question:", "</s>", "<|im_end|>", "<|endoftext|>"]
HUMANEVAL_STOPS = ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]


def _loglikelihood_body(max_tokens: int) -> dict[str, Any]:
    return {
        "model": LOCAL,
        "prompt": [ctx + cont for ctx, cont in LOGLIKELIHOOD],
        "temperature": 0,
        "max_tokens": max_tokens,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }


def _parse_logprobs(out: dict[str, Any], ctxlens: list[int]) -> list[tuple[float, bool]]:
    """`LocalCompletionsAPI.parse_logprobs` (lm-eval @ 0064c3a0), unchanged in substance."""
    res = []
    for choice, ctxlen in zip(sorted(out["choices"], key=itemgetter("index")), ctxlens, strict=True):
        assert ctxlen > 0, "Context length must be greater than 0"
        logprobs = sum(choice["logprobs"]["token_logprobs"][ctxlen:-1])
        tokens_logprobs = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        top_logprobs = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        is_greedy = True
        for tok, top in zip(tokens_logprobs, top_logprobs, strict=True):
            if tok != max(top.values()):
                is_greedy = False
                break
        res.append((logprobs, is_greedy))
    return res


def _parse_generations(out: dict[str, Any]) -> list[str]:
    """`LocalCompletionsAPI.parse_generations`: each text goes where its `index` says."""
    tmp: list[str | None] = [None] * len(out["choices"])
    for choice in out["choices"]:
        tmp[choice["index"]] = choice["text"]
    assert None not in tmp
    return [t for t in tmp if t is not None]


@pytest.mark.parametrize("max_tokens", [1, 0])
def test_loglikelihood_batch_aligns_logprobs_with_the_echoed_tokens(
    api: httpx.Client, upstream: Upstream, vllm_like: VLLMLike, max_tokens: int
) -> None:
    body = _loglikelihood_body(max_tokens)
    resp = api.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    out = resp.json()

    sent = upstream.only().json()
    assert sent["prompt"] == body["prompt"] and sent["echo"] is True and sent["logprobs"] == 1
    assert sent["max_tokens"] == max_tokens and sent["seed"] == 1234 and sent["model"] == "facebook/opt-125m"

    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    for (ctx, cont), choice in zip(LOGLIKELIHOOD, out["choices"], strict=True):
        lp = choice["logprobs"]
        ids = ctx + cont
        # The prompt's own tokens, then what was generated: lm-eval slices the continuation by position.
        assert len(lp["tokens"]) == len(ids) + max_tokens
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == len(lp["top_logprobs"])
        assert lp["tokens"][: len(ids)] == decode(ids)
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert all(v is not None for v in lp["token_logprobs"][1:])
        # Echoed: offsets count from the start of the prompt, which is where the text starts.
        assert choice["text"].startswith("".join(decode(ids)))
        assert lp["text_offset"][0] == 0
        for i in range(1, len(lp["tokens"])):
            assert lp["text_offset"][i] == lp["text_offset"][i - 1] + len(lp["tokens"][i - 1])
        # Each choice answers its own prompt, in prompt order: what the upstream computed for it.
        assert lp["token_logprobs"] == vllm_like.answer(sent)["choices"][choice["index"]]["logprobs"]["token_logprobs"]

    if max_tokens == 1:
        scores = _parse_logprobs(out, [len(ctx) for ctx, _ in LOGLIKELIHOOD])
        expected = [
            sum(c["logprobs"]["token_logprobs"][len(ctx) : -1])
            for (ctx, _), c in zip(LOGLIKELIHOOD, out["choices"], strict=True)
        ]
        assert [s for s, _ in scores] == pytest.approx(expected)


TEXT_PROMPTS: list[Any] = ["def add(x):\n    ", "Question: 2 + 2 =\nAnswer:", "def f(y):\n"]
# `tokenized_requests=True` (local-completions' default) sends the contexts as token ids.
ID_PROMPTS: list[Any] = [[4299, 751, 7, 87, 2599], [24361, 25, 362, 1343, 362, 796], [4299, 277, 7, 88]]


def _generate_body(stops: list[str], prompts: list[Any] = TEXT_PROMPTS) -> dict[str, Any]:
    return {
        "prompt": prompts,
        "model": LOCAL,
        "max_tokens": 256,
        "temperature": 0,
        "stop": stops,
        "seed": 1234,
    }


@pytest.mark.parametrize(
    "stops",
    [
        pytest.param(GSM8K_STOPS, id="4-stops-gsm8k"),
        pytest.param((GSM8K_STOPS, ID_PROMPTS), id="4-stops-gsm8k-token-ids"),
        pytest.param(HUMANEVAL_STOPS, id="5-stops-humaneval"),
        pytest.param([*HUMANEVAL_STOPS, "<|endoftext|>"], id="6-stops-humaneval-eos"),
    ],
)
def test_generate_until_batch_answers_in_prompt_order(
    api: httpx.Client, upstream: Upstream, vllm_like: VLLMLike, stops: list[str] | tuple[list[str], list[Any]]
) -> None:
    body = _generate_body(*stops) if isinstance(stops, tuple) else _generate_body(stops)
    sequences: list[str] = body["stop"]
    resp = api.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    sent = upstream.only().json()
    assert sent["stop"] == sequences and sent["prompt"] == body["prompt"] and sent["seed"] == 1234
    texts = _parse_generations(out)
    expected = [c["text"] for c in vllm_like.answer(sent)["choices"]]
    assert texts == expected
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    for text in texts:
        assert not any(s in text for s in sequences)


def test_loglikelihood_batch_against_the_fake_provider(api: httpx.Client) -> None:
    """The keyless demo answers lm-eval's log-likelihood body in the same shape (its prompt text: the ids)."""
    body = {**_loglikelihood_body(1), "model": "demo/text"}
    resp = api.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    for (ctx, cont), choice in zip(LOGLIKELIHOOD, out["choices"], strict=True):
        lp = choice["logprobs"]
        ids = ctx + cont
        assert choice["text"].startswith(" ".join(map(str, ids)))
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == len(ids) + 1
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert lp["text_offset"][0] == 0
    scores = _parse_logprobs(out, [len(ctx) for ctx, _ in LOGLIKELIHOOD])
    # The fake's every token is the likeliest of its alternatives: lm-eval counts each answer as greedy.
    assert [greedy for _, greedy in scores] == [True, True, True]
