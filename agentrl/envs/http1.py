"""The keep-alive HTTP/1.1 connection, now :mod:`agentrl.httpkit.http1` (this name is kept for imports)."""

from __future__ import annotations

from agentrl.httpkit.http1 import Http1Connection

__all__ = ["Http1Connection"]
