"""vLLM-style tokenizer routes and the model-scoped base path, over real sockets."""
