"""The HTTP plumbing every remote engine client shares: one pool per event loop, deadlines, safe retries.

A request that never reached the server (connection refused, connect timeout) is retried
with backoff; an idempotent read also on read errors and 502/503. Anything past its deadline
raises :class:`EngineTimeoutError` naming the call; other transport failures
:class:`EngineUnavailableError`. httpx pools belong to one event loop, so the client keeps one
per loop: the same engine object serves the run's loop and ``run_sync``'s fresh loops.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from agentrl.engines.errors import EngineTimeoutError, EngineUnavailableError

__all__ = ["HTTPEngineClient"]

_RETRY_ALWAYS = (httpx.ConnectError, httpx.ConnectTimeout)
_RETRY_IDEMPOTENT = (*_RETRY_ALWAYS, httpx.ReadError, httpx.ReadTimeout, httpx.RemoteProtocolError)


class HTTPEngineClient:
    """Base of the HTTP engine clients (``SGLangEngine``, ``VLLMEngine``): ``_call`` with deadlines."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        retries: int = 3,
        api_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.connect_timeout_s = connect_timeout_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._clients: dict[int, tuple[asyncio.AbstractEventLoop, httpx.AsyncClient]] = {}

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        for key, (old_loop, _) in list(self._clients.items()):
            if old_loop.is_closed():
                del self._clients[key]  # its connections died with their loop
        entry = self._clients.get(id(loop))
        if entry is None or entry[0] is not loop:
            entry = (loop, httpx.AsyncClient(base_url=self.base_url, headers=self._headers))
            self._clients[id(loop)] = entry
        return entry[1]

    async def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        idempotent: bool = False,
        timeout_s: float | None = None,
        params: dict[str, Any] | None = None,
    ) -> httpx.Response:
        retryable = _RETRY_IDEMPOTENT if idempotent else _RETRY_ALWAYS
        timeout = httpx.Timeout(timeout_s or self.timeout_s, connect=self.connect_timeout_s)
        client = self._client()
        delay = 0.2
        for attempt in range(self.retries + 1):
            try:
                resp = await client.request(method, path, json=body, timeout=timeout, params=params)
            except retryable as e:
                if attempt == self.retries:
                    raise EngineUnavailableError(
                        f"{method} {self.base_url}{path} failed after {attempt + 1} attempts: {type(e).__name__}: {e}"
                    ) from e
            except httpx.TimeoutException as e:
                raise EngineTimeoutError(
                    f"{method} {self.base_url}{path} exceeded its deadline of {timeout_s or self.timeout_s} s"
                ) from e
            except httpx.HTTPError as e:
                raise EngineUnavailableError(
                    f"{method} {self.base_url}{path} failed: {type(e).__name__}: {e}"
                ) from e
            else:
                if not (idempotent and resp.status_code in (502, 503) and attempt < self.retries):
                    return resp
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        """Close this loop's connection pool (the others close with their loops)."""
        entry = self._clients.pop(id(asyncio.get_running_loop()), None)
        if entry is not None:
            await entry[1].aclose()
