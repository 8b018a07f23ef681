"""HTTP plumbing shared by agentrl's three servers and their clients.

- :mod:`~agentrl.httpkit.background`: :class:`BackgroundServer`, any ASGI app served by uvicorn on
  a background thread (tests, notebooks, examples, benchmarks);
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
from agentrl.httpkit.status import ErrorAnswer, StatusMap
from agentrl.httpkit.validation import validation_message

__all__ = ["BackgroundServer", "ErrorAnswer", "StatusMap", "validation_message"]
