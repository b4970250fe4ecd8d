"""Anthropic tests' shared setup: the adapter."""

from __future__ import annotations

from providers.anthropic import AnthropicAdapter

ADAPTER = AnthropicAdapter()
