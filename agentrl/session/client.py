"""The session server's one HTTP client: :class:`AsyncSessionClient`, and a blocking facade.

:class:`AsyncSessionClient` implements :class:`~agentrl.session.backend.SessionBackend` over
``agentrl serve-session``'s API, so a rollout runs through a remote session server exactly as
through an in-process :class:`~agentrl.session.manager.SessionManager`. It also serves what the
``openai`` SDK does not know about: sessions, trajectories, tokenize and metrics::

    sessions = await AsyncSessionClient.connect("http://127.0.0.1:8100")   # reads /health
    sid = await sessions.create()
    turn = await sessions.chat_completion(sid, messages, tools, sampling)
    (traj,) = await sessions.close(sid)

:class:`SessionClient` is the same client for synchronous callers (it runs the coroutines on
a private event loop)::

    with SessionClient("http://127.0.0.1:8100") as client:
        sid = client.create()
        reply = client.chat(sid, [Message(role="user", content="hi")], max_tokens=32)

Agents can use the official ``openai`` SDK against ``openai_base_url(sid)``.

Every request has a deadline (``timeout_s``; ``connect_timeout_s`` for the connect). A
request that never reached the server (connection refused, connect timeout) is retried with
backoff up to ``retries`` times; nothing else is retried here (the rollout retries a failed
episode on a fresh session). Server errors come back as the matching
:mod:`agentrl.session.errors` class with the server's message: a conversation that outgrew the
context is a :class:`ContextFullError`; a request past its deadline a
:class:`SessionEngineError`; an unreachable server a :class:`SessionError` naming the URL.

Requests go through agentrl's one HTTP client, :class:`~agentrl.httpkit.HTTPClient`: a
connection pool per event loop (the run's loop, in the trainer); the pool of a loop that has
closed is dropped and the next call on a new loop opens its own.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from agentrl.httpkit import StatusMap
from agentrl.httpkit.client import Failure, HTTPClient
from agentrl.session.backend import ChatResult, TurnCalls, TurnRequest
from agentrl.session.errors import (
    ContextFullError,
    SessionEngineError,
    SessionError,
    SessionKeyError,
    SessionRequestError,
    UnknownSessionError,
)
from agentrl.types import Message, SamplingParams, ToolSpec, Trajectory

__all__ = ["AsyncSessionClient", "SessionClient", "raise_for_status"]

_STATUS = StatusMap[SessionError](
    default=SessionError,
    by_status={
        401: SessionKeyError,
        403: SessionKeyError,
        404: UnknownSessionError,
        422: SessionRequestError,
        424: SessionEngineError,
    },
    by_kind={"context_length_exceeded": ContextFullError},
)
"""A session server's error answer -> the :mod:`agentrl.session.errors` class."""


def raise_for_status(resp: httpx.Response, where: str) -> None:
    """Raise the :mod:`agentrl.session.errors` class of a 4xx/5xx session-server reply, with its message.

    A context-full turn (422, ``code: "context_length_exceeded"``) is a
    :class:`ContextFullError`, which callers treat as the model's error, not the server's.
    """
    _STATUS.raise_for(resp.status_code, resp.content, where)


def _messages(messages: list[Message]) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=True) for m in messages]


def _sampling_fields(sampling: SamplingParams | None) -> dict[str, Any]:
    """The OpenAI request fields of ``sampling`` (the server stops at the template's end-of-turn)."""
    sp = sampling or SamplingParams.model_validate({})
    if sp.stop_token_ids:
        raise SessionRequestError(
            f"stop_token_ids={sp.stop_token_ids} cannot be sent to a session server (it stops at the "
            "chat template's end-of-turn tokens); leave them empty"
        )
    if sp.ignore_eos:
        raise SessionRequestError(
            "ignore_eos=True cannot be sent to a session server (a turn ends at the chat template's "
            "end-of-turn token, which the ledger needs); leave it False"
        )
    out: dict[str, Any] = {"max_tokens": sp.max_new_tokens, "temperature": sp.temperature, "top_p": sp.top_p}
    if sp.top_k > 0:
        out["top_k"] = sp.top_k
    if sp.seed is not None:
        out["seed"] = sp.seed
    return out


def _trajectories(out: dict[str, Any]) -> list[Trajectory]:
    return [Trajectory.model_validate(t) for t in out["trajectories"]]


class AsyncSessionClient(TurnCalls):
    """A session server's API as a :class:`~agentrl.session.backend.SessionBackend` (module docstring).

    ``timeout_s`` bounds every request (a turn included), ``connect_timeout_s`` every connect;
    ``max_connections`` should cover the sessions that run turns at once. ``health`` is the
    server's ``/health`` (model, family, stop ids, vocab size, weight version): build with
    :meth:`connect`, which reads it, or pass it.
    """

    def __init__(
        self,
        base_url: str,
        *,
        health: dict[str, Any] | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        max_connections: int = 64,
        retries: int = 2,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s, self.retries = timeout_s, retries
        self.health: dict[str, Any] = dict(health or {})
        self._http = HTTPClient(
            self.base_url,
            on_failure=self._failure,
            errors=_STATUS,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            retries=retries,
            backoff_s=0.2,
            max_connections=max_connections,
        )
        self._keys: dict[str, str] = {}

    @classmethod
    async def connect(cls, base_url: str, **kwargs: Any) -> AsyncSessionClient:
        """A client of the server at ``base_url``, after reading its ``/health`` (SessionError if unreachable)."""
        client = cls(base_url, **kwargs)
        client.health = dict(await client._call("GET", "/health"))
        return client

    # ------------------------------------------------------------ the SessionBackend surface

    @property
    def model_name(self) -> str:
        return str(self.health.get("model", ""))

    @property
    def family_name(self) -> str:
        return str(self.health.get("family", ""))

    @property
    def stop_token_ids(self) -> list[int]:
        return [int(t) for t in self.health.get("stop_token_ids", [])]

    async def create(self, session_id: str | None = None) -> str:
        out = await self._call("POST", "/sessions", {"session_id": session_id} if session_id else None)
        sid = str(out["id"])
        if out.get("api_key"):  # sent with every later call on this session (gateway mode needs it)
            self._keys[sid] = str(out["api_key"])
        return sid

    def api_key(self, session_id: str) -> str | None:
        """The session's key, as the server returned it when this client created the session."""
        return self._keys.get(session_id)

    async def _turn(self, session_id: str, turn: TurnRequest) -> ChatResult:
        """One assistant turn on the server (``chat_completion``; the messages are the whole conversation)."""
        fields = _sampling_fields(turn.sampling)
        if turn.stop:
            fields["stop"] = list(turn.stop)
        if turn.template_kwargs:
            fields["chat_template_kwargs"] = dict(turn.template_kwargs)
        out = await self.request_chat(session_id, turn.messages, turn.tools, **fields)
        try:
            choice = out["choices"][0]
            extra = out.get("agentrl") or {}
            return ChatResult(
                message=Message.model_validate(choice["message"]),
                finish_reason=str(choice["finish_reason"]),
                prompt_tokens=int(out["usage"]["prompt_tokens"]),
                completion_tokens=int(out["usage"]["completion_tokens"]),
                segment=int(extra.get("segment", 0)),
                diverged=extra.get("diverged"),
                parse_failed=bool(extra.get("parse_failed", False)),
            )
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise SessionError(
                f"{self.base_url} answered a chat completion agentrl cannot read ({type(e).__name__}: {e})"
            ) from e

    async def trajectories(self, session_id: str) -> list[Trajectory]:
        return _trajectories(await self._call("GET", f"/sessions/{session_id}/trajectories", sid=session_id))

    async def close(self, session_id: str) -> list[Trajectory]:
        """Delete the session on the server; its trajectories."""
        out = await self._call("DELETE", f"/sessions/{session_id}", sid=session_id)
        self._keys.pop(session_id, None)
        return _trajectories(out)

    # SessionBackend's signature; only the call's shape is shared with SessionManager.tokenize.
    async def tokenize(
        self,
        messages: list[Message],
        tools: list[ToolSpec] | None = None,
        *,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of a full render, rendered by the server exactly as a session's first turn."""
        body: dict[str, Any] = {
            "messages": _messages(messages),
            "add_generation_prompt": add_generation_prompt,
        }
        if tools:
            body["tools"] = [t.model_dump(exclude_none=True) for t in tools]
        if template_kwargs:
            body["chat_template_kwargs"] = dict(template_kwargs)
        return [int(t) for t in (await self._call("POST", "/tokenize", body))["tokens"]]

    async def aclose(self) -> None:
        """Close this loop's connection pool (a later call opens a new one)."""
        await self._http.aclose()

    # ------------------------------------------------------------ the rest of the API

    async def request_chat(
        self, session_id: str, messages: list[Message], tools: list[ToolSpec] | None = None, **fields: Any
    ) -> dict[str, Any]:
        """The raw OpenAI response; ``fields`` are request fields (``max_tokens``, ``seed``, ``stop``, ...)."""
        body: dict[str, Any] = {"messages": _messages(messages), **fields}
        if tools:
            body["tools"] = [t.model_dump(exclude_none=True) for t in tools]
        return dict(
            await self._call("POST", f"/sessions/{session_id}/v1/chat/completions", body, sid=session_id)
        )

    async def session_info(self, session_id: str) -> dict[str, Any]:
        """The session's summary (turns, segments, tokens, divergences, messages)."""
        return dict(await self._call("GET", f"/sessions/{session_id}", sid=session_id))

    async def encode(self, text: str) -> list[int]:
        """Token ids of plain ``text`` (no template)."""
        return [int(t) for t in (await self._call("POST", "/tokenize", {"text": text}))["tokens"]]

    async def metrics(self) -> dict[str, float]:
        return dict(await self._call("GET", "/metrics"))

    def openai_base_url(self, session_id: str) -> str:
        """The ``base_url`` to give the ``openai`` SDK for this session."""
        return f"{self.base_url}/sessions/{session_id}/v1"

    # ------------------------------------------------------------ HTTP plumbing

    def _failure(self, failure: Failure) -> SessionError:
        if failure.nothing_sent:
            return SessionError(
                f"cannot reach the session server at {self.base_url} ({failure.where}, {failure.attempts} "
                f"attempts): {failure.name}: {failure.error}; is `agentrl serve-session` running there?"
            )
        if failure.kind == "timeout":
            return SessionEngineError(f"{failure.where} exceeded its deadline of {self.timeout_s:g} s")
        return SessionError(f"{failure.where} failed: {failure.name}: {failure.error}")

    async def _call(self, method: str, path: str, body: Any = None, *, sid: str | None = None) -> Any:
        """One request; nothing but a connect failure is retried (a rollout retries its episode)."""
        key = self._keys.get(sid) if sid is not None else None
        headers = {"Authorization": f"Bearer {key}"} if key else None
        return (await self._http.request(method, path, body, headers=headers)).json()


class SessionClient:
    """:class:`AsyncSessionClient` for synchronous callers, on a private event loop.

    Not for use inside a running event loop (await :class:`AsyncSessionClient` there).
    """

    def __init__(self, base_url: str, *, timeout_s: float = 600.0, **kwargs: Any) -> None:
        self.base_url = base_url.rstrip("/")
        self.aclient = AsyncSessionClient(base_url, timeout_s=timeout_s, **kwargs)
        self._loop = asyncio.new_event_loop()

    def _run(self, coro: Any) -> Any:
        return self._loop.run_until_complete(coro)

    def close(self) -> None:
        if not self._loop.is_closed():
            self._run(self.aclient.aclose())
            self._loop.close()

    def __enter__(self) -> SessionClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def openai_base_url(self, session_id: str) -> str:
        """The ``base_url`` to give the ``openai`` SDK for this session."""
        return self.aclient.openai_base_url(session_id)

    def create(self, session_id: str | None = None) -> str:
        return str(self._run(self.aclient.create(session_id)))

    def chat_completion(
        self, session_id: str, messages: list[Message], tools: list[ToolSpec] | None = None, **fields: Any
    ) -> dict[str, Any]:
        """The raw OpenAI response; ``fields`` are request fields (``max_tokens``, ``seed``, ``stop``, ...)."""
        return dict(self._run(self.aclient.request_chat(session_id, messages, tools, **fields)))

    def chat(
        self, session_id: str, messages: list[Message], tools: list[ToolSpec] | None = None, **fields: Any
    ) -> Message:
        """One turn; returns the parsed assistant message."""
        msg = self.chat_completion(session_id, messages, tools, **fields)["choices"][0]["message"]
        return Message.model_validate(msg)

    def info(self, session_id: str) -> dict[str, Any]:
        return dict(self._run(self.aclient.session_info(session_id)))

    def trajectories(self, session_id: str) -> list[Trajectory]:
        return list(self._run(self.aclient.trajectories(session_id)))

    def delete(self, session_id: str) -> list[Trajectory]:
        """Close the session; returns its trajectories."""
        return list(self._run(self.aclient.close(session_id)))

    def tokenize(
        self,
        messages: list[Message] | None = None,
        *,
        text: str | None = None,
        tools: list[ToolSpec] | None = None,
    ) -> list[int]:
        """Token ids of ``text`` (plain) or of ``messages`` rendered as a first turn."""
        if text is not None:
            return list(self._run(self.aclient.encode(text)))
        return list(self._run(self.aclient.tokenize(messages or [], tools)))

    def metrics(self) -> dict[str, float]:
        return dict(self._run(self.aclient.metrics()))
