"""The Batch API run by the gateway: files, batches and their lines in the ledger's database, and the runner.

This wing owns the OpenAI Files and Batches objects (`objects`), an input file's validation into lines
(`lines`), their rows in the ledger's database (`store`: files in chunks, batches with a lease, each line's
state and answer) and the background runner that sends every line through the request path as an
interactive request of the batch's key would go (`runner`, `send`). Its HTTP routes are the edge's
(gateway/edge/batch_routes.py). Docs: docs/batches.md.

May import path, and everything below it (the ledger's engine, limits, ops, config, the base); never edge.
"""
