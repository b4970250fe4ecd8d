"""The HTTP face: the ASGI app, the completion and tokenizer endpoints, error rendering, the status page
and the model listing (discovery).

Owns everything that knows a route, a status code or a Litestar object. May import every wing below it
(path, resilience, emulation, cache, ledger, limits, upstream, fleet, ops) and the base (config, ids,
state); nothing imports it but `gateway.__main__`.
"""
