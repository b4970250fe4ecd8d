"""lm-evaluation-harness itself, unmodified, run against the gateway: its `lm_eval` command from PyPI
(tests/clients/lm_eval_env.sh installs it outside the clone) evaluates a small generate_until task with
its `local-completions` and `local-chat-completions` models, through the gateway's completion and chat
routes to the loopback vLLM-like and OpenAI chat upstreams (conftest.py, chatlike.py).

What it checks: lm-eval finishes; the upstream got one request per document, carrying the document's
question and the task's stop sequences; and every response lm-eval logged is what the upstream answered to
the request the gateway passed on (lm-eval then cuts at its `until` itself).

Without the install every test here is skipped, saying how to make it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Upstream

from .chatlike import ChatLike
from .conftest import CLIENTS_KEY, LOCAL, VLLMLike

VERSION = "0.4.13"
ROOT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "completions-gateway" / f"lm-eval-{VERSION}"
LM_EVAL = ROOT / "bin" / "lm_eval"
CHAT_MODEL = "vc/Qwen/Qwen2.5-1.5B-Instruct"
UNTIL = ["Question:", "</s>", "<|im_end|>"]
QUESTIONS = [
    "Natalia sold clips to 48 of her friends in April. How many did she sell?",
    "There are 15 trees in the grove. 6 more are planted. How many are there now?",
    "Leah had 32 chocolates and her sister had 42. They ate 35. How many are left?",
    "Jason had 20 lollipops. He gave Denny some and now has 12. How many did he give?",
    "Shawn has five toys. He got two more from each of his mom and dad. How many now?",
]
TASK = """
task: gateway_tiny_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: {until}
  do_sample: false
  temperature: 0.0
  max_gen_toks: 16
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


@pytest.fixture(scope="module")
def lm_eval() -> Path:
    if not (ROOT / ".complete").exists():
        pytest.skip(f"lm-eval {VERSION} not installed in {ROOT}: run tests/clients/lm_eval_env.sh (about 90 s)")
    return LM_EVAL


def _run(lm_eval: Path, tmp_path: Path, model: str, model_args: str, *extra: str) -> list[dict[str, Any]]:
    """Runs one evaluation of the task over QUESTIONS; returns the samples lm-eval logged."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": "42"}) + "\n" for q in QUESTIONS))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "gateway_tiny_gen.yaml").write_text(TASK.format(data=data, until=json.dumps(UNTIL)))
    out = tmp_path / "out"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "OPENAI_API_KEY": CLIENTS_KEY,  # what lm-eval's local models send as the bearer token
        "HF_HOME": str(tmp_path / "hf"),
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    argv = [str(lm_eval), "--model", model, "--model_args", model_args, "--tasks", "gateway_tiny_gen"]
    argv += ["--include_path", str(tasks), "--log_samples", "--output_path", str(out), *extra]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    (samples,) = out.rglob("samples_gateway_tiny_gen_*.jsonl")
    return [json.loads(line) for line in samples.read_text().splitlines()]


def _cut(text: str) -> str:
    """lm-eval's own cut of a generation at the first of its `until` strings."""
    for stop in UNTIL:
        text = text.split(stop)[0]
    return text


def test_local_chat_completions(
    lm_eval: Path, tmp_path: Path, gateway: GatewayThread, chat_upstream: Upstream, chat_like: ChatLike
) -> None:
    base_url = f"{gateway.url}/v1/chat/completions"
    args = f"model={CHAT_MODEL},base_url={base_url},num_concurrent=2,max_retries=1"
    samples = _run(lm_eval, tmp_path, "local-chat-completions", args, "--apply_chat_template")

    assert len(chat_upstream.received) == len(QUESTIONS)
    answered: dict[str, str] = {}
    for request in chat_upstream.received:
        body = request.json()
        assert body["model"] == "Qwen/Qwen2.5-1.5B-Instruct"
        assert body["stop"] == UNTIL and body["temperature"] == 0.0
        (message,) = body["messages"]
        assert message["role"] == "user" and set(message) == {"role", "content"}  # lm-eval's "type" is not sent
        answered[message["content"]] = chat_like.answer(body)["choices"][0]["message"]["content"]
    assert sorted(answered) == sorted(f"Question: {q}\nAnswer:" for q in QUESTIONS)
    assert len(samples) == len(QUESTIONS) and all(answered.values())
    for sample in samples:
        prompt = f"Question: {sample['doc']['question']}\nAnswer:"
        assert sample["resps"] == [[_cut(answered[prompt])]], sample


def test_local_completions(
    lm_eval: Path, tmp_path: Path, gateway: GatewayThread, upstream: Upstream, vllm_like: VLLMLike
) -> None:
    base_url = f"{gateway.url}/v1/completions"
    args = f"model={LOCAL},base_url={base_url},tokenizer_backend=None,tokenized_requests=False,num_concurrent=2"
    samples = _run(lm_eval, tmp_path, "local-completions", args + ",max_retries=1")

    assert len(upstream.received) == len(QUESTIONS)
    answered: dict[str, str] = {}
    for request in upstream.received:
        body = request.json()
        assert body["model"] == "facebook/opt-125m" and body["stop"] == UNTIL and body["max_tokens"] == 16
        prompt = body["prompt"]
        prompt = prompt[0] if isinstance(prompt, list) else prompt
        answered[prompt] = vllm_like.answer(body)["choices"][0]["text"]
    assert sorted(answered) == sorted(f"Question: {q}\nAnswer:" for q in QUESTIONS)
    assert len(samples) == len(QUESTIONS) and all(answered.values())
    for sample in samples:
        prompt = f"Question: {sample['doc']['question']}\nAnswer:"
        assert sample["resps"] == [[_cut(answered[prompt])]], sample
