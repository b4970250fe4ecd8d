"""`/v1/chat/completions` through the gateway, with the official `openai` SDK, over real sockets."""
