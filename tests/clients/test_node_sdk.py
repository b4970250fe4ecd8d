"""The official openai Node SDK (npm `openai`, the version pinned in tests/clients/node/package.json) against
the gateway over a real socket: a completion with logprobs, a stream with its usage chunk, and a refused field
raised as the SDK's `BadRequestError`; on chat (node/chat.mjs), `chat.completions.create` plain and streamed,
tool calls plain and streamed (reassembled by hand and by the SDK's `chat.completions.stream` helper), a tool
result sent back, against the loopback OpenAI chat route (`ChatLike`) behind providers of kind openai and vllm.

The package is installed once into a cache directory (`.ci/run` does it; otherwise the first run does, from
the npm registry). Without `node` and `npm`, or when the install fails, the test is skipped with the reason
(counted by `pytest -rs`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Upstream

from .chatlike import ChatLike
from .conftest import CLIENTS_KEY

NODE_DIR = Path(__file__).parent / "node"
PINNED: str = json.loads((NODE_DIR / "package.json").read_text())["dependencies"]["openai"]


def cache_dir() -> Path:
    """Where `.ci/run` and this test install the package (the same path in both)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "completions-gateway" / "node-openai"


def _installed(where: Path) -> str | None:
    manifest = where / "node_modules" / "openai" / "package.json"
    if not manifest.exists():
        return None
    version: str = json.loads(manifest.read_text())["version"]
    return version


def _install(npm: str, where: Path) -> str | None:
    """npm install the pinned SDK into `where`; None when it worked, else why not."""
    where.mkdir(parents=True, exist_ok=True)
    shutil.copy(NODE_DIR / "package.json", where / "package.json")
    try:
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--ignore-scripts", "--prefix", str(where)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "npm install timed out"
    if done.returncode != 0:
        return f"npm install failed: {done.stderr.strip()[-300:]}"
    return None


@pytest.fixture(scope="module")
def node_sdk() -> Iterator[tuple[str, Path]]:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are not on this machine: the Node SDK test needs them")
    where = cache_dir()
    if _installed(where) != PINNED:
        problem = _install(npm, where)
        if problem is not None or _installed(where) != PINNED:
            pytest.skip(f"the openai npm package {PINNED} could not be installed: {problem}")
    # The script must sit next to node_modules for Node's ESM resolution to find the package.
    for script in ("completions.mjs", "chat.mjs"):
        shutil.copy(NODE_DIR / script, where / script)
    yield node, where


def _run(
    node_sdk: tuple[str, Path], gateway: GatewayThread, model: str, prompt: str = "", script: str = "completions.mjs"
) -> dict[str, Any]:
    node, where = node_sdk
    env = {k: v for k, v in os.environ.items() if "PROXY" not in k.upper()}
    env |= {
        "GATEWAY_URL": gateway.url + "/v1",
        "GATEWAY_KEY": CLIENTS_KEY,
        "GATEWAY_MODEL": model,
        "GATEWAY_PROMPT": prompt,
    }
    done = subprocess.run([node, str(where / script)], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out


@pytest.mark.parametrize("model", ["demo/text", "local/facebook/opt-125m"])
def test_node_sdk_completion_stream_and_error(
    node_sdk: tuple[str, Path], gateway: GatewayThread, api: httpx.Client, model: str
) -> None:
    prompt = "Say this is a test"
    out = _run(node_sdk, gateway, model, prompt)

    plain = out["plain"]
    direct = api.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 12, "logprobs": 1})
    assert direct.status_code == 200, direct.text
    assert plain["object"] == "text_completion" and plain["model"] == model
    assert plain["choices"][0]["text"] == direct.json()["choices"][0]["text"]
    assert plain["choices"][0]["logprobs"]["text_offset"][0] == len(prompt)
    assert plain["usage"]["total_tokens"] == plain["usage"]["prompt_tokens"] + plain["usage"]["completion_tokens"]

    chunks = out["chunks"]
    *content, last = chunks
    assert "".join(c["choices"][0]["text"] for c in content) == plain["choices"][0]["text"]
    assert last["choices"] == [] and last["usage"] == plain["usage"]

    assert out["error"] == {"name": "BadRequestError", "status": 400, "param": "temperature", "code": "invalid_value"}


@pytest.mark.parametrize("model", ["oa/gpt-4o-mini", "vc/Qwen/Qwen2.5-1.5B-Instruct"])
def test_node_sdk_chat(
    node_sdk: tuple[str, Path], gateway: GatewayThread, chat_upstream: Upstream, chat_like: ChatLike, model: str
) -> None:
    out = _run(node_sdk, gateway, model, script="chat.mjs")
    bodies = [r.json() for r in chat_upstream.received]

    plain = out["plain"]
    direct = chat_like.answer(bodies[0])
    assert plain["object"] == "chat.completion" and plain["model"] == model
    assert plain["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
    assert plain["usage"] == direct["usage"]

    *content, last = out["chunks"]
    assert content[0]["choices"][0]["delta"]["role"] == "assistant"
    assert (
        "".join(c["choices"][0]["delta"].get("content") or "" for c in content)
        == direct["choices"][0]["message"]["content"]
    )
    assert last["choices"] == [] and last["usage"] == plain["usage"]

    (call,) = out["toolPlain"]["choices"][0]["message"]["tool_calls"]
    assert out["toolPlain"]["choices"][0]["finish_reason"] == "tool_calls"
    assert call["function"] == direct_call(chat_like, bodies[2])
    (streamed,) = out["calls"].values()
    assert streamed["pieces"] > 3 and out["toolFinish"] == "tool_calls"
    assert {k: streamed[k] for k in ("id", "name", "arguments")} == {
        "id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"],
    }
    (helper,) = out["helperFinal"]["choices"][0]["message"]["tool_calls"]
    assert helper["id"] == call["id"] and helper["function"] == call["function"]

    assert out["answered"]["choices"][0]["message"]["content"] == " The tool said: 21 degrees"
    sent = bodies[-1]["messages"]
    assert sent[2]["tool_calls"][0]["id"] == call["id"] and sent[3]["tool_call_id"] == call["id"]

    assert out["error"] == {"name": "BadRequestError", "status": 400, "param": "temperature", "code": "invalid_value"}


def direct_call(chat_like: ChatLike, body: dict[str, Any]) -> dict[str, str]:
    """The function of the call the upstream answers `body` with."""
    function: dict[str, str] = chat_like.answer(body)["choices"][0]["message"]["tool_calls"][0]["function"]
    return function
