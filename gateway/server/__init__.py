"""The HTTP/1.1 server protocol uvicorn runs for the gateway: parsing requests, building ASGI scopes,
`receive`/`send`, keep-alive, pipelining, flow control and its caps.

uvicorn keeps the server's life (sockets, workers, signals, lifespan, graceful shutdown); `H1Protocol` is
the class it builds per connection (`uvicorn.Config(http=H1Protocol)`). It is a generic ASGI protocol:
docs/servers.md lists its caps and defaults.

May import nothing else of the gateway (uvicorn and httptools only); ops (serving) imports it.
"""

from gateway.server.cycle import DISCONNECT
from gateway.server.h1 import H1Protocol

__all__ = ["DISCONNECT", "H1Protocol"]
