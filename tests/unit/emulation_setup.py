"""Shared setup of the emulation tests: a one-prompt adapter, its answers and request builder."""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.path.request import normalize
from providers.base import EMULATED, Adapter, CallContext, Param, Table, UpstreamRequest, table
from wire.schema import Choice, Completion, CompletionRequest, Logprobs, Usage, decode_request


def req(**fields: Any) -> CompletionRequest:
    body = {"model": "x/m", "prompt": "p", **fields}
    return normalize(decode_request(msgspec.json.encode(body)))


class OnePrompt(Adapter):
    """A provider shaped like the chat-style ones: one text prompt, no n, no echo, guided emulated."""

    kind = "one-prompt"
    max_stop = 2
    prompt_forms = frozenset({"text"})
    params: Table = table(
        max_tokens=Param(),
        stop=Param(),
        logprobs=Param(),
        n=EMULATED,
        best_of=EMULATED,
        echo=EMULATED,
        include_stop_str_in_output=EMULATED,
        guided_json=EMULATED,
        guided_regex=EMULATED,
        guided_choice=EMULATED,
        guided_grammar=EMULATED,
    )

    def build_request(self, req: CompletionRequest, endpoint: Any, body: dict[str, Any]) -> UpstreamRequest:
        raise AssertionError("pure planning tests never build requests")

    def parse_response(self, body: bytes, ctx: CallContext) -> Completion:
        raise AssertionError

    def parse_event(self, event: str | None, data: bytes, ctx: CallContext) -> Completion | None:
        raise AssertionError

    def map_error(self, status: int, headers: Any, body: bytes, provider: str) -> Any:
        raise AssertionError


ADAPTER = OnePrompt()


def answer(text: str, lps: list[float] | None = None, finish: str = "stop") -> Completion:
    logprobs = None
    if lps is not None:
        tokens = [text[i : i + 1] for i in range(len(lps))]
        logprobs = Logprobs(
            tokens=tokens, token_logprobs=list(lps), top_logprobs=None, text_offset=list(range(len(lps)))
        )
    return Completion(
        id="up",
        created=1,
        model="x/m",
        choices=[Choice(text, 0, logprobs, finish)],  # type: ignore[arg-type]
        usage=Usage(prompt_tokens=2, completion_tokens=3, total_tokens=5),
    )
