"""Assistant prefill's parts that need no socket: the two fields read as one choice, each kind's chat body,
the cache key, and the white space a trimmed prefill must not see repeated, over any split of the answer."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gateway.cache.key import cache_key
from gateway.path.chat import _Trim, trimmed
from gateway.path.chat_request import normalize_chat
from providers.base import map_params
from providers.openai_chat import OpenAIChat
from providers.registry import REGISTRY
from wire.chat import ChatRequest, decode_chat
from wire.errors import UnsupportedParamError
from wire.messages import AssistantMessage

PREFILL = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure:\n\n"}]


def _req(**fields: Any) -> ChatRequest:
    body = {"model": "x/m", "messages": PREFILL, **fields}
    return normalize_chat(decode_chat(msgspec.json.encode(body)))


def _body(kind: str, req: ChatRequest) -> dict[str, Any]:
    table = REGISTRY[kind].chat_params
    assert table is not None
    return map_params(req, table, "p", False)[0]


def test_the_two_fields_are_one_choice() -> None:
    on = _req(continue_final_message=True, add_generation_prompt=False)
    assert (on.continue_final_message, on.add_generation_prompt) == (True, None)
    off = _req(continue_final_message=False, add_generation_prompt=True)
    assert (off.continue_final_message, off.add_generation_prompt) == (None, None)
    assert _req(add_generation_prompt=False).add_generation_prompt is False


def test_each_kind_that_can_continue_gets_its_own_body() -> None:
    req = _req(continue_final_message=True)
    for kind in ("vllm", "llamacpp"):  # llama-server reads vLLM's pair
        assert _body(kind, req) == {"continue_final_message": True, "add_generation_prompt": False}
    assert _body("sglang", req) == {"continue_final_message": True}
    assert _body("anthropic", req) == {}  # a trailing assistant message is Anthropic's prefill
    for kind in ("openai", "gemini", "mistral"):
        with pytest.raises(UnsupportedParamError) as refused:
            _body(kind, req)
        assert refused.value.param == "continue_final_message"
    # Every kind that resumes a broken chat stream continues a client's message the same way.
    for kind, cls in REGISTRY.items():
        if issubclass(cls, OpenAIChat) and cls.chat_continue is not None:
            assert cls.chat_params is not None and "continue_final_message" in cls.chat_params, kind


def test_a_prefilled_request_is_its_own_cache_entry() -> None:
    scope = b"t\x00"
    plain = cache_key(_req(), scope)
    assert cache_key(_req(continue_final_message=False), scope) == plain  # the default, said
    assert cache_key(_req(continue_final_message=True), scope) != plain


@pytest.mark.parametrize("pieces", [["\n\nOne"], ["\n", "\nOne"], ["\n", "\n", "One"], ["", "\n\n", "One"]])
def test_the_repeated_white_space_is_taken_off_however_the_answer_is_split(pieces: list[str]) -> None:
    kept, pending = trimmed(REGISTRY["anthropic"](), _req(continue_final_message=True))  # type: ignore[arg-type]
    assert pending == "\n\n" and kept.messages[-1] == AssistantMessage(content="Sure:")
    trim = _Trim(pending)
    assert "".join(trim.text(p) for p in pieces) == "One"


def test_white_space_the_answer_does_not_repeat_is_kept() -> None:
    trim = _Trim("\n\n")
    assert trim.text("\nOne") == "One"
    assert trim.text("\n") == "\n"  # the trim ended with the text after it
    assert _Trim(" ").text("One") == "One"
    # A route that takes trailing white space gets the message as it is.
    req = _req(continue_final_message=True)
    assert trimmed(REGISTRY["vllm"](), req) == (req, "")  # type: ignore[arg-type]
