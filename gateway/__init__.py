"""The gateway: the HTTP app, the request path, limits, health and operations around the provider adapters."""
