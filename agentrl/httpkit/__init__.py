"""HTTP plumbing shared by agentrl's three servers and their clients.

- :mod:`~agentrl.httpkit.client`: :class:`HTTPClient`, the one retrying client (deadlines, what is
  safe to retry, backoff, a pool per event loop, error answers through :class:`StatusMap`) that
  the env, session and engine clients hold; its fast transport is
  :mod:`~agentrl.httpkit.http1`'s keep-alive HTTP/1.1 connection;
- :mod:`~agentrl.httpkit.background`: :class:`BackgroundServer`, any ASGI app served by uvicorn on
  a background thread or on a given event loop (tests, notebooks, examples, benchmarks, the
  trainer's agent gateway);
- :mod:`~agentrl.httpkit.validation`: :func:`validation_message`, the one wording of a request
  that failed validation (pydantic errors -> "invalid request: field: problem (got value)");
- :mod:`~agentrl.httpkit.status`: :class:`StatusMap`, how a client turns a 4xx/5xx answer into
  its own exception class (each client keeps its classes; the table says which is which).

Each server keeps its own wire error body (the env server's ``{"detail", "infra_error"}``,
OpenAI's for the session server, SGLang's for the engine server); what is shared is how the
message is worded and read back. Nothing here imports a web framework at import time.
"""

from __future__ import annotations

from agentrl.httpkit.background import BackgroundServer
from agentrl.httpkit.client import Answer, Failure, HTTPClient
from agentrl.httpkit.status import ErrorAnswer, StatusMap
from agentrl.httpkit.validation import validation_message

__all__ = [
    "Answer",
    "BackgroundServer",
    "ErrorAnswer",
    "Failure",
    "HTTPClient",
    "StatusMap",
    "validation_message",
]
