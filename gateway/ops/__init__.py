"""Running it: metrics, tracing, the access log, live config reload, serving (uvicorn/Granian) and the
config-doc generator.

May import only the base (config, ids, state); every wing above may import it.
"""
