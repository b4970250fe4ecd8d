"""The vocabulary the gateway and the provider adapters share: request and answer structs, the error tree,
and the upstream request value. It sits below both and imports nothing of the project's own, so an adapter
can be written and tested without the app (docs/architecture.md)."""
