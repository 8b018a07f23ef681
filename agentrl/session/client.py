"""The session server's Python client: open sessions, run turns, fetch trajectories over HTTP.

Agents can use the official ``openai`` SDK against ``client.openai_base_url(sid)``;
this client adds what the SDK does not know about: sessions, trajectories, tokenize
and metrics. Every call has a deadline; server errors come back as the matching
:mod:`agentrl.session.errors` exception with the server's message::

    client = SessionClient("http://127.0.0.1:8100")
    sid = client.create()
    reply = client.chat(sid, [Message(role="user", content="hi")], max_tokens=32)
    (traj,) = client.trajectories(sid)
    client.delete(sid)
"""

from __future__ import annotations

from typing import Any

import httpx

from agentrl.httpkit import StatusMap
from agentrl.session.errors import (
    ContextFullError,
    SessionEngineError,
    SessionError,
    SessionRequestError,
    UnknownSessionError,
)
from agentrl.types import Message, ToolSpec, Trajectory

__all__ = ["SessionClient", "raise_for_status"]

_ERRORS: dict[int, type[SessionError]] = {
    404: UnknownSessionError,
    422: SessionRequestError,
    424: SessionEngineError,
}


def raise_for_status(resp: httpx.Response, where: str) -> None:
    """Raise the :mod:`agentrl.session.errors` class of a 4xx/5xx session-server reply, with its message.

    A context-full turn (422, ``code: "context_length_exceeded"``) is a
    :class:`ContextFullError`, which callers treat as the model's error, not the server's.
    """
    if resp.status_code >= 400:
        table = StatusMap(SessionError, _ERRORS, {"context_length_exceeded": ContextFullError})
        raise table.error(resp.status_code, resp.content, where)


class SessionClient:
    """A blocking client of one session server; ``timeout_s`` bounds every request."""

    def __init__(self, base_url: str, *, timeout_s: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SessionClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        try:
            r = self._http.request(method, path, json=body)
        except httpx.TimeoutException as e:
            raise SessionError(f"{method} {self.base_url}{path} timed out: {e}") from e
        except httpx.TransportError as e:
            raise SessionError(f"cannot reach the session server at {self.base_url}: {e}") from e
        raise_for_status(r, f"{method} {self.base_url}{path}")
        return r.json()

    def openai_base_url(self, session_id: str) -> str:
        """The ``base_url`` to give the ``openai`` SDK for this session."""
        return f"{self.base_url}/sessions/{session_id}/v1"

    def create(self, session_id: str | None = None) -> str:
        return str(self._call("POST", "/sessions", {"session_id": session_id} if session_id else None)["id"])

    def chat_completion(
        self, session_id: str, messages: list[Message], tools: list[ToolSpec] | None = None, **fields: Any
    ) -> dict[str, Any]:
        """The raw OpenAI response; ``fields`` are request fields (``max_tokens``, ``seed``, ``stop``, ...)."""
        body: dict[str, Any] = {"messages": [m.model_dump(exclude_none=True) for m in messages], **fields}
        if tools:
            body["tools"] = [t.model_dump(exclude_none=True) for t in tools]
        return dict(self._call("POST", f"/sessions/{session_id}/v1/chat/completions", body))

    def chat(
        self, session_id: str, messages: list[Message], tools: list[ToolSpec] | None = None, **fields: Any
    ) -> Message:
        """One turn; returns the parsed assistant message."""
        msg = self.chat_completion(session_id, messages, tools, **fields)["choices"][0]["message"]
        return Message.model_validate(msg)

    def info(self, session_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/sessions/{session_id}"))

    def trajectories(self, session_id: str) -> list[Trajectory]:
        out = self._call("GET", f"/sessions/{session_id}/trajectories")["trajectories"]
        return [Trajectory.model_validate(t) for t in out]

    def delete(self, session_id: str) -> list[Trajectory]:
        """Close the session; returns its trajectories."""
        return [
            Trajectory.model_validate(t)
            for t in self._call("DELETE", f"/sessions/{session_id}")["trajectories"]
        ]

    def tokenize(
        self,
        messages: list[Message] | None = None,
        *,
        text: str | None = None,
        tools: list[ToolSpec] | None = None,
    ) -> list[int]:
        body: dict[str, Any] = {"text": text} if text is not None else {}
        if messages is not None:
            body["messages"] = [m.model_dump(exclude_none=True) for m in messages]
        if tools:
            body["tools"] = [t.model_dump(exclude_none=True) for t in tools]
        return list(self._call("POST", "/tokenize", body)["tokens"])

    def metrics(self) -> dict[str, float]:
        return dict(self._call("GET", "/metrics"))
