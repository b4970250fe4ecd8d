"""Side-by-side loopback benchmark of the completions gateway.

Run with ``python -m bench`` (or ``make bench``). One run measures a fast loopback upstream
directly, a thin Python passthrough reference and the gateway under identical load, so every
published figure is a ratio taken on the same machine at the same moment. The same run covers
the gateway's variants (2 workers, granian, uvicorn's httptools protocol, Redis limits), latency
against offered load, memory over a million requests and memory while holding a thousand open
streams; see ``bench.scenarios``.
"""
