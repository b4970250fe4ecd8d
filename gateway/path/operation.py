"""What the request path does differently for each endpoint it serves: `/v1/completions` and
`/v1/chat/completions` share the pipeline, and differ only in these few steps, held by one value per
endpoint (no branch on the endpoint in the pipeline)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from gateway.config import CapsConfig
from gateway.ids import unique_suffix
from gateway.path.attempt import Job
from gateway.path.chat import ChatJob
from gateway.path.chat_request import normalize_chat
from gateway.path.request import normalize
from wire.chat import decode_chat_request
from wire.schema import CompletionRequest, decode_request


class Operation:
    """One endpoint's steps: its name (recorded in the access log, metrics and ledger), how its body is
    decoded and normalized, its answers' id prefix, and the job its attempts run in."""

    __slots__ = ("name", "chat", "decode", "normalize", "prefix", "job", "genai")

    def __init__(
        self,
        name: str,
        chat: bool,
        decode: Callable[[bytes], CompletionRequest],
        normalize: Callable[[Any, CapsConfig], Any],
        prefix: str,
        job: type[Job],
    ) -> None:
        self.name = name
        self.chat = chat
        self.decode = decode
        self.normalize = normalize
        self.prefix = prefix
        self.job = job
        # OpenTelemetry's GenAI `gen_ai.operation.name` for the request's spans.
        self.genai = "chat" if chat else "text_completion"

    def new_id(self) -> str:
        return self.prefix + unique_suffix()


COMPLETIONS: Final = Operation("completions", False, decode_request, normalize, "cmpl-", Job)
CHAT: Final = Operation("chat", True, decode_chat_request, normalize_chat, "chatcmpl-", ChatJob)

__all__ = ["CHAT", "COMPLETIONS", "Operation"]
