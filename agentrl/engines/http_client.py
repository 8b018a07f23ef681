"""The base of the remote engine clients: agentrl's one HTTP client with the engine's errors.

Requests go through :class:`~agentrl.httpkit.HTTPClient` (one pool per event loop, so the same
engine object serves the run's loop and ``run_sync``'s fresh loops). A request that never
reached the server (connection refused, connect timeout) is retried with backoff; an idempotent
read also on a broken connection, a read deadline and 502/503. A request that got no answer
raises :class:`EngineUnavailableError` (after the retries, naming the attempts) or, past its
deadline and not retried, :class:`EngineTimeoutError` naming the call. An error answer maps
through :data:`ENGINE_ERRORS`: a name of an agentrl engine error class (the engine and session
servers send one) is raised as that class; otherwise 504 is a deadline, another 4xx a bad
request, a 5xx the server's failure. ``_call`` returns error answers unchecked; the subclasses
check them with :meth:`HTTPEngineClient._raise_for`.
"""

from __future__ import annotations

from typing import Any

from agentrl.engines import errors as engine_errors
from agentrl.engines.errors import (
    EngineError,
    EngineRequestError,
    EngineTimeoutError,
    EngineUnavailableError,
)
from agentrl.httpkit import StatusMap
from agentrl.httpkit.client import Answer, Failure, HTTPClient

__all__ = ["ENGINE_ERRORS", "HTTPEngineClient"]

ENGINE_ERRORS = StatusMap[EngineError](
    default=EngineUnavailableError,
    by_status={504: EngineTimeoutError},
    by_kind={
        name: cls
        for name in engine_errors.__all__
        if isinstance(cls := getattr(engine_errors, name), type) and issubclass(cls, EngineError)
    },
    client_error=EngineRequestError,
)
"""An engine server's error answer -> the engine error class (see the module docstring)."""


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
        self._http = HTTPClient(
            self.base_url,
            on_failure=self._failure,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            retries=retries,
            backoff_s=0.2,
            headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
        )

    def _failure(self, failure: Failure) -> EngineError:
        if failure.retried:
            return EngineUnavailableError(
                f"{failure.where} failed after {failure.attempts} attempts: {failure.name}: {failure.error}"
            )
        if failure.kind == "timeout":
            return EngineTimeoutError(f"{failure.where} exceeded its deadline of {failure.timeout_s:g} s")
        return EngineUnavailableError(f"{failure.where} failed: {failure.name}: {failure.error}")

    async def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        idempotent: bool = False,
        timeout_s: float | None = None,
        params: dict[str, Any] | None = None,
    ) -> Answer:
        """One request; an error answer is returned (check it with :meth:`_raise_for`)."""
        return await self._http.request(
            method,
            path,
            body,
            safe=idempotent,
            retry_status=(502, 503) if idempotent else (),
            timeout_s=timeout_s,
            params=params,
            check=False,
        )

    def _raise_for(self, resp: Answer, path: str) -> None:
        """Raise the engine error of an error answer (:data:`ENGINE_ERRORS`)."""
        ENGINE_ERRORS.raise_for(resp.status, resp.body, f"{self.base_url}{path}")

    async def aclose(self) -> None:
        """Close this loop's connection pool (the others close with their loops)."""
        await self._http.aclose()
