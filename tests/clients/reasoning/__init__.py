"""Reasoning models on `/v1/chat/completions`, with the official `openai` SDK, over real sockets."""
