"""`chat_guarded_paths`: the chat body paths carrying the conversation, the token limit and the choice count, which
`inference_extra_params` may not write (providers/openai_chat.py), for kinds whose chat body puts them
elsewhere than OpenAI's names (Gemini's `generationConfig.maxOutputTokens`)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from gateway.path.chat_request import normalize_chat
from providers import REGISTRY, register
from providers.base import Endpoint, Param, map_params, table
from providers.chat_params import CHAT_GUARDED
from providers.guarded import limit_paths
from providers.openai_chat import OpenAIChat
from providers.vllm import VLLMAdapter
from tests.unit.test_guarded import _paths
from wire.chat import decode_chat
from wire.errors import InvalidRequestError

LIMIT = 4321
TEXT = "conversation-marker-9e2a"


def _chat_kinds() -> list[str]:
    return [k for k, cls in REGISTRY.items() if cls.chat_params is not None and issubclass(cls, OpenAIChat)]


def _nested(path: str, value: Any) -> dict[str, Any]:
    head, _, rest = path.partition(".")
    return {head: _nested(rest, value) if rest else value}


@pytest.mark.parametrize("kind", _chat_kinds())
def test_the_client_may_not_write_the_chat_limit_or_conversation(kind: str) -> None:
    """Wherever a kind's chat body carries the limit and the conversation, `inference_extra_params` naming
    that path is a 400 naming it, and the registry's check covers the same paths."""
    cls = REGISTRY[kind]
    assert issubclass(cls, OpenAIChat) and cls.chat_params is not None

    def sent(extra: dict[str, Any] | None) -> dict[str, Any]:
        raw: dict[str, Any] = {"model": "p/m", "messages": [{"role": "user", "content": TEXT}], "max_tokens": LIMIT}
        if extra is not None:
            raw["inference_extra_params"] = extra
        req = normalize_chat(decode_chat(msgspec.json.encode(raw)))
        assert cls.chat_params is not None
        params, _ = map_params(req, cls.chat_params, "p", True)
        endpoint = Endpoint(
            provider="p",
            model="m",
            base_url="http://127.0.0.1:9",
            api_key="AKID:secret",
            api_version="v",
            region="us-east-1",
        )
        body: dict[str, Any] = json.loads(cls().build_chat_request(req, endpoint, params).body)
        return body

    body = sent(None)
    paths = _paths(body, LIMIT) + _paths(body, TEXT)
    assert len(paths) == 2, (kind, body)
    for path in paths:
        with pytest.raises(InvalidRequestError) as caught:
            sent(_nested(path, 1))
        # A request field's own name at the top is refused while the request is read, before any adapter.
        assert caught.value.param in (f"inference_extra_params.{path}", "inference_extra_params"), kind
    assert limit_paths(cls.chat_params) <= cls.chat_guarded_paths


def test_a_chat_table_writing_its_limit_outside_chat_guarded_is_not_registered() -> None:
    class Elsewhere(VLLMAdapter):
        kind = "chat_elsewhere_test_kind"
        chat_params = table(max_tokens=Param(to="limits.output"))

    with pytest.raises(ValueError, match="chat_params writes limits"):
        register(Elsewhere)
    assert "chat_elsewhere_test_kind" not in REGISTRY

    class Declared(VLLMAdapter):
        kind = "chat_declared_test_kind"
        chat_params = table(max_tokens=Param(to="limits.output"), continue_final_message=Param())
        chat_guarded_paths = CHAT_GUARDED | {"limits.output"}

    try:
        assert register(Declared) is Declared
    finally:
        REGISTRY.pop("chat_declared_test_kind", None)


def test_a_kind_that_continues_without_the_field_in_its_chat_table_is_not_registered() -> None:
    # Its broken streams' continuations would reach it without the word to continue, and be answered anew.
    class Mute(VLLMAdapter):
        kind = "chat_mute_test_kind"
        chat_params = table(max_tokens=Param())

    with pytest.raises(ValueError, match="continue_final_message"):
        register(Mute)
    assert "chat_mute_test_kind" not in REGISTRY
