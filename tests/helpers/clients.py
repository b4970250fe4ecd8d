"""What a client sends the gateway and reads back: SDK and raw HTTP clients, bodies, SSE and limit headers.

Every client is built with `trust_env=False`, so a proxy variable on the machine never reroutes a
loopback test, and without retries, so a test sees exactly one attempt.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import openai


def openai_client(base_url: str, api_key: str, *, timeout: float = 15, **kwargs: Any) -> openai.OpenAI:
    """The official SDK pointed at the gateway: no retries (tests assert single attempts), no proxies."""
    return openai.OpenAI(
        base_url=base_url,
        api_key=api_key,
        max_retries=0,
        timeout=timeout,
        http_client=openai.DefaultHttpxClient(trust_env=False),
        **kwargs,
    )


def async_openai_client(base_url: str, api_key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=base_url,
        api_key=api_key,
        max_retries=0,
        timeout=15,
        http_client=openai.DefaultAsyncHttpxClient(trust_env=False),
    )


def client(gw_url: str, key: str | None = None, timeout: float = 15) -> httpx.Client:
    """A raw HTTP client on the gateway, presenting `key` as a bearer token when given."""
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=gw_url, trust_env=False, timeout=timeout, headers=headers)


def words(n: int) -> str:
    """A prompt of `n` words that every count agrees on: the fake provider reports `n` prompt tokens
    (whitespace words) and the bytes estimate is ceil((4n - 1) / 4) = n."""
    return " ".join(["abc"] * n)


def body(model: str = "demo/long", prompt_words: int = 3, max_tokens: int = 7, **extra: Any) -> dict[str, Any]:
    """A completion body of exactly `prompt_words` prompt tokens (see `words`)."""
    return {"model": model, "prompt": words(prompt_words), "max_tokens": max_tokens, **extra}


def sse_data(body: str) -> list[str]:
    """The `data:` payloads of an SSE body the gateway sent, in order (it always frames `data: X\\n\\n`)."""
    out: list[str] = []
    for event in body.split("\n\n"):
        if not event:
            continue
        assert event.startswith("data: "), f"unexpected SSE framing: {event!r}"
        out.append(event[len("data: ") :])
    return out


_DURATION = re.compile(r"^(?:(\d+)m(\d+)s|(\d+(?:\.\d+)?)s|(\d+)ms)$")


def parse_duration(text: str) -> float:
    """OpenAI's reset duration (`20ms`, `1.5s`, `6m0s`) in milliseconds; anything else fails the test."""
    m = _DURATION.match(text)
    assert m is not None, f"not a reset duration: {text!r}"
    if m.group(1) is not None:
        return int(m.group(1)) * 60_000 + int(m.group(2)) * 1000
    if m.group(3) is not None:
        return float(m.group(3)) * 1000
    return float(m.group(4))


def limit_headers(resp: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in resp.headers.items() if k.startswith("x-ratelimit-")}


def slow_batch(gw_url: str, key: str, model: str, lines: int = 20) -> str:
    """A batch of `lines` completions of `model` by `key`, uploaded and created: its id (a slow model keeps
    it running for a while)."""
    rows = [
        {"custom_id": f"l{i}", "method": "POST", "url": "/v1/completions", "body": body(model=model)}
        for i in range(lines)
    ]
    data = "".join(json.dumps(x) + "\n" for x in rows).encode()
    with client(gw_url, key) as c:
        uploaded = c.post("/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", data)})
        assert uploaded.status_code == 200, uploaded.text
        spec = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/completions", "completion_window": "24h"}
        resp = c.post("/v1/batches", json=spec)
        assert resp.status_code == 200, resp.text
        return str(resp.json()["id"])
