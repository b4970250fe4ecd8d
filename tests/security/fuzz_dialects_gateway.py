"""The gateway the dialect fuzzing runs against, and its upstream replaying a recorded OpenAI answer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Final

import httpx
from aiohttp import web

from tests.helpers.recordings import FIXTURES, sse_events
from tests.helpers.servers import GatewayProcess, cli_env
from tests.helpers.upstreams import Received

ROUTES: Final = {
    "/v1/completions": "openai",
    "/inference/v1/completions": "openai",
    "/v4/beta/completions": "fastapi",
    "/api/v1/compatibility/openai/v1/completions": "fastapi",
}


ANSWER_S: Final = 10.0
# The gateway child may not map more than this: an unbounded answer fails it, not the machine.
ADDRESS_SPACE: Final = 6 * 1024**3


RECORDED: Final = json.loads((FIXTURES / "openai" / "completion_davinci002.json").read_bytes())
RECORDED_EVENTS: Final = [
    json.loads(e[len(b"data: ") :])
    for e in sse_events((FIXTURES / "openai" / "completion_stream_davinci002.sse.txt").read_bytes())
    if e != b"data: [DONE]"
]


# The upstream: a recorded OpenAI answer, with as many choices as the request asks for


def _choices_asked(body: Any) -> int:
    if not isinstance(body, dict):
        return 1
    n, best = body.get("n"), body.get("best_of")
    n = n if isinstance(n, int) else 1
    best = best if isinstance(best, int) else 1
    prompt = body.get("prompt")
    prompts = len(prompt) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else 1
    return max(1, min(max(n, best) * max(prompts, 1), 512))


async def recorded_answer(request: web.Request, received: Received) -> web.StreamResponse:
    try:
        body = json.loads(received.body)
    except ValueError:
        body = None
    count = _choices_asked(body)
    if not (isinstance(body, dict) and body.get("stream") is True):
        answer = dict(RECORDED, choices=[dict(RECORDED["choices"][0], index=i) for i in range(count)])
        return web.json_response(answer)
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for event in RECORDED_EVENTS:
        chunk = dict(event, choices=[dict(event["choices"][0], index=i) for i in range(count)])
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    usage = dict(RECORDED_EVENTS[-1], choices=[], usage=RECORDED["usage"])
    await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
    await resp.write_eof()
    return resp


# The gateway, restarted when an answer did not come (the next example gets a working one)


class Gateway:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.proc: GatewayProcess | None = None
        self.client = httpx.Client(trust_env=False, timeout=ANSWER_S)

    def start(self) -> None:
        env = cli_env()
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        limit = ["prlimit", f"--as={ADDRESS_SPACE}", "--"] if shutil.which("prlimit") else []
        self.proc = GatewayProcess(self.path, env, prefix=limit)
        self.proc.wait_ready()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def restart(self) -> None:
        if self.proc is not None and self.proc.proc.poll() is None:
            self.proc.proc.kill()  # a frozen worker would sit out SIGTERM's grace
            self.proc.proc.wait(10)
        self.stop()
        self.client.close()
        self.client = httpx.Client(trust_env=False, timeout=ANSWER_S)
        self.start()

    def post(self, route: str, body: bytes) -> httpx.Response:
        assert self.proc is not None
        try:
            return self.client.post(self.proc.url + route, content=body, headers={"content-type": "application/json"})
        except httpx.HTTPError as exc:
            died = self.proc.proc.poll()
            self.restart()
            raise AssertionError(
                f"no complete answer ({type(exc).__name__}, timeout {ANSWER_S} s; gateway exit code {died})"
            ) from None
