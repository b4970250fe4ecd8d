"""Config `kind` -> adapter class: the one list a new provider kind is added to.

Each line of `BUILTIN` names an adapter as `module:Class`; the class's `kind` is the key. The gateway never
names a kind itself: config validation, routing, header checks, token counting, quota reading and model
discovery all read the adapter's declarations (providers/base.py `Capabilities`). `register()` adds a kind
at run time, for a plug-in or a test.
"""

from __future__ import annotations

import importlib
import re
from typing import Final

from providers.base import Adapter, LocalAdapter
from providers.chat_params import CHAT_GUARDED
from providers.guarded import limit_paths
from providers.openai_chat import OpenAIChat

AdapterClass = type[Adapter] | type[LocalAdapter]

# One line per provider kind; the order is the column order of docs/providers.md.
BUILTIN: Final = (
    "providers.openai:OpenAIAdapter",
    "providers.azure:AzureAdapter",
    "providers.fireworks:FireworksAdapter",
    "providers.together:TogetherAdapter",
    "providers.vllm:VLLMAdapter",
    "providers.sglang:SGLangAdapter",
    "providers.deepseek:DeepSeekAdapter",
    "providers.pais:PAISAdapter",
    "providers.sgp:SGPAdapter",
    "providers.gemini:GeminiAdapter",
    "providers.mistral:MistralAdapter",
    "providers.anthropic:AnthropicAdapter",
    "providers.cohere:CohereAdapter",
    "providers.tgi:TGIAdapter",
    "providers.ollama:OllamaAdapter",
    "providers.llamacpp:LlamaCppAdapter",
    "providers.bedrock:BedrockAdapter",
    "providers.fake:FakeAdapter",
)

# A kind is written in YAML and in metric labels: keep it a plain identifier.
_KIND: Final = re.compile(r"[a-z][a-z0-9_]{0,31}")

REGISTRY: dict[str, AdapterClass] = {}
_credentials: frozenset[str] = frozenset()


def _load(target: str) -> object:
    module, _, name = target.partition(":")
    if not name:
        raise ValueError(f"adapter {target!r} is not written as module:Class")
    found: object = getattr(importlib.import_module(module), name)
    return found


def register(adapter: AdapterClass | str) -> AdapterClass:
    """Make `adapter` (a class, or `module:Class`) the adapter of its `kind`; returns the class, so it also
    works as a class decorator. A kind already held by another class is refused."""
    global _credentials
    cls = _load(adapter) if isinstance(adapter, str) else adapter
    if not (isinstance(cls, type) and issubclass(cls, Adapter | LocalAdapter)):
        raise TypeError(f"{adapter!r} is not an Adapter or LocalAdapter subclass")
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str) or not _KIND.fullmatch(kind):
        raise ValueError(f"{cls.__qualname__}.kind must be a lower-case identifier, got {kind!r}")
    # The request path reads these instead of an isinstance on an abstract class: a class may not say otherwise.
    if cls.in_process != issubclass(cls, LocalAdapter) or cls.chat_route != issubclass(cls, OpenAIChat):
        raise ValueError(f"{cls.__qualname__}.in_process and .chat_route are its class's to set, not its own")
    unguarded = limit_paths(cls.params) - cls.guarded_paths
    if cls.opt_in_n is not None and cls.opt_in_n not in cls.guarded_paths:
        unguarded.add(cls.opt_in_n)  # where `configure` writes `n` once the operator turns it on
    if unguarded:
        raise ValueError(
            f"{cls.__qualname__}.guarded_paths must hold the body paths its table writes limits and counts to: "
            f"{sorted(unguarded)} are missing"
        )
    chat = cls.chat_params
    if chat is not None and limit_paths(chat) - getattr(cls, "chat_guarded_paths", CHAT_GUARDED):
        raise ValueError(f"{cls.__qualname__}.chat_params writes limits and counts where chat does not guard them")
    # A broken stream's continuation asks for `continue_final_message`, which only the table writes upstream.
    if issubclass(cls, OpenAIChat) and cls.chat_continue is not None and "continue_final_message" not in (chat or ()):
        raise ValueError(f"{cls.__qualname__}.chat_continue needs a `continue_final_message` entry in chat_params")
    held = REGISTRY.get(kind)
    if held is not None and held is not cls:
        raise ValueError(f"kind {kind!r} is already registered to {held.__module__}.{held.__qualname__}")
    REGISTRY[kind] = cls
    _credentials = _credentials | cls.credential_headers
    return cls


def unregister(kind: str) -> None:
    """Forget `kind` (a test's throwaway provider)."""
    global _credentials
    REGISTRY.pop(kind, None)
    _credentials = frozenset().union(*(cls.credential_headers for cls in REGISTRY.values()))


def kinds() -> list[str]:
    """Every registered kind, sorted: what a config error lists as valid."""
    return sorted(REGISTRY)


def credential_headers() -> frozenset[str]:
    """Every registered kind's credential headers: a client may not set any of them upstream."""
    return _credentials


for _target in BUILTIN:
    register(_target)
