"""Provider adapters, one module per kind; `REGISTRY` maps a config `kind` to its adapter."""

from __future__ import annotations

from providers.anthropic import AnthropicAdapter
from providers.azure import AzureAdapter
from providers.base import Adapter, LocalAdapter
from providers.bedrock import BedrockAdapter
from providers.cohere import CohereAdapter
from providers.deepseek import DeepSeekAdapter
from providers.fake import FakeAdapter
from providers.fireworks import FireworksAdapter
from providers.gemini import GeminiAdapter
from providers.llamacpp import LlamaCppAdapter
from providers.mistral import MistralAdapter
from providers.ollama import OllamaAdapter
from providers.openai import OpenAIAdapter
from providers.pais import PAISAdapter
from providers.sgp import SGPAdapter
from providers.tgi import TGIAdapter
from providers.together import TogetherAdapter
from providers.vllm import VLLMAdapter

REGISTRY: dict[str, type[Adapter] | type[LocalAdapter]] = {
    cls.kind: cls
    for cls in (
        OpenAIAdapter,
        AzureAdapter,
        FireworksAdapter,
        TogetherAdapter,
        VLLMAdapter,
        DeepSeekAdapter,
        PAISAdapter,
        SGPAdapter,
        GeminiAdapter,
        MistralAdapter,
        AnthropicAdapter,
        CohereAdapter,
        TGIAdapter,
        OllamaAdapter,
        LlamaCppAdapter,
        BedrockAdapter,
        FakeAdapter,
    )
}

__all__ = ["REGISTRY", "Adapter", "LocalAdapter"]
