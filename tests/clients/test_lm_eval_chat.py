"""lm-evaluation-harness's `local-chat-completions` requests, byte for byte the bodies it builds, through the
gateway's chat routes to the loopback OpenAI chat route (`ChatLike`, chatlike.py) behind a provider of kind
vllm (`vc`, where lm-eval's local servers are) and of kind openai (`oa`).

The bodies follow `lm_eval/models/openai_completions.py` and `lm_eval/models/api_models.py`
(EleutherAI/lm-evaluation-harness @ 0064c3a0, the 0.4 line). With `--apply_chat_template` and no tokenizer
(the chat model's default), `TemplateAPI.apply_chat_template` serializes the conversation as
`[{**message, "type": "text"} ...]`: every message carries a top-level `"type": "text"` that OpenAI's schema
does not have (lm-eval's later releases drop it). `LocalChatCompletion._create_payload` then sends
`{"messages", "model", "max_tokens", "temperature", "stop": until[:4], "seed": 1234, **gen_kwargs}`
(`do_sample`, `max_gen_toks` and `until` popped from the task's generation kwargs), one conversation per
request, and reads the answer with `parse_generations` (re-stated below): each choice's
`message.content` at its `index`.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.helpers.upstreams import Upstream

from .chatlike import ChatLike

VLLM_MODEL = "vc/Qwen/Qwen2.5-1.5B-Instruct"
GSM8K_QUESTION = "Question: Natalia sold clips to 48 of her friends in April. How many did she sell?\nAnswer:"
# gsm8k's `until` (its task yaml), and gsm8k_cot_llama's five, of which lm-eval sends the first four.
GSM8K_UNTIL = ["Question:", "</s>", "<|im_end|>"]
COT_LLAMA_UNTIL = ["<|eot_id|>", "<|start_header_id|>user<|end_header_id|>", "Q:", "</s>", "<|im_end|>"]


def _chat(*turns: tuple[str, str]) -> list[dict[str, str]]:
    """`TemplateAPI.apply_chat_template` without a tokenizer: each message with `"type": "text"` added."""
    return [{"role": role, "content": content, "type": "text"} for role, content in turns]


def _payload(messages: list[dict[str, str]], model: str, until: list[str], max_gen_toks: int = 256) -> dict[str, Any]:
    """`LocalChatCompletion._create_payload` for a task whose generation kwargs are `until`, `do_sample:
    false` and `temperature: 0.0` (gsm8k's)."""
    return {
        "messages": messages,
        "model": model,
        "max_tokens": max_gen_toks,
        "temperature": 0.0,
        "stop": until[:4],
        "seed": 1234,
    }


def _parse_generations(out: dict[str, Any]) -> list[str | None]:
    """`LocalChatCompletion.parse_generations` (lm-eval @ 0064c3a0), unchanged in substance."""
    tmp: list[str | None] = [None] * len(out["choices"])
    for choice in out["choices"]:
        tmp[choice["index"]] = choice["message"]["content"]
    return tmp


ZERO_SHOT = _chat(("user", GSM8K_QUESTION))
MULTITURN = _chat(
    ("system", "Solve the grade-school math problem. End with 'The answer is N'."),
    ("user", "Question: There are 15 trees in the grove. 6 more are planted. How many now?\nAnswer:"),
    ("assistant", "15 + 6 = 21. The answer is 21."),
    ("user", GSM8K_QUESTION),
)


@pytest.mark.parametrize(
    ("messages", "until"),
    [
        pytest.param(ZERO_SHOT, GSM8K_UNTIL, id="gsm8k-zero-shot"),
        pytest.param(MULTITURN, COT_LLAMA_UNTIL, id="fewshot-as-multiturn-cot-llama"),
    ],
)
@pytest.mark.parametrize("model", [VLLM_MODEL, "oa/gpt-4o-mini"])
def test_generate_until_answers_what_the_server_answers(
    api: httpx.Client,
    chat_upstream: Upstream,
    chat_like: ChatLike,
    messages: list[dict[str, str]],
    until: list[str],
    model: str,
) -> None:
    body = _payload(messages, model, until)
    resp = api.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    sent = chat_upstream.only().json()
    # The conversation as OpenAI's schema has it: lm-eval's extra `type` is not passed on (a strict server,
    # Mistral's, refuses it), and every other field of every message is.
    assert sent["messages"] == [{k: v for k, v in m.items() if k != "type"} for m in messages]
    assert sent["stop"] == until[:4] and sent["seed"] == 1234 and sent["temperature"] == 0.0
    assert sent.get("max_tokens", sent.get("max_completion_tokens")) == 256
    assert _parse_generations(resp.json()) == [c["message"]["content"] for c in chat_like.answer(sent)["choices"]]


def test_a_stop_sequence_ends_the_generation_before_it(
    api: httpx.Client, chat_upstream: Upstream, chat_like: ChatLike
) -> None:
    full = _parse_generations(api.post("/v1/chat/completions", json=_payload(ZERO_SHOT, VLLM_MODEL, [])).json())[0]
    assert full is not None
    stop = full.split()[2]
    (generated,) = _parse_generations(
        api.post("/v1/chat/completions", json=_payload(ZERO_SHOT, VLLM_MODEL, [stop])).json()
    )
    assert generated == full[: full.find(stop)]


def test_the_model_scoped_base_url(api: httpx.Client, chat_upstream: Upstream, chat_like: ChatLike) -> None:
    """lm-eval's `base_url` may be `/m/<vendor>/<model>/v1/chat/completions`, with `model` the same string."""
    body = _payload(ZERO_SHOT, VLLM_MODEL, GSM8K_UNTIL)
    resp = api.post(f"/m/{VLLM_MODEL}/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    sent = chat_upstream.only().json()
    assert sent["model"] == "Qwen/Qwen2.5-1.5B-Instruct"
    assert _parse_generations(resp.json()) == [c["message"]["content"] for c in chat_like.answer(sent)["choices"]]


def test_a_message_type_other_than_text_is_refused_naming_it(api: httpx.Client, chat_upstream: Upstream) -> None:
    messages = [{"role": "user", "content": "hi", "type": "image_url"}]
    resp = api.post("/v1/chat/completions", json=_payload(messages, VLLM_MODEL, GSM8K_UNTIL))
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "messages.type"
    assert chat_upstream.received == []
