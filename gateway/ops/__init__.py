"""Running it: metrics, tracing, the access log, live config reload, serving (uvicorn/Granian), the `.env`
file read at start-up and the config-doc generator.

May import server (the HTTP/1.1 protocol serving runs) and the base (config, ids, state); every wing above
may import it.
"""
