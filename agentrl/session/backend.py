"""The session backend contract: everything a rollout needs of the token-ledger sessions.

Two implementations, one surface, every call awaited:

- :class:`~agentrl.session.manager.SessionManager`, in process, over an engine;
- :class:`~agentrl.session.client.AsyncSessionClient`, over a session server's HTTP API
  (``agentrl serve-session``), where tokenization and the ledger live on the server.

An episode through either::

    sid = await sessions.create()
    turn = await sessions.chat_completion(sid, messages, tools, sampling)   # a ChatResult
    ...
    trajectories = await sessions.close(sid)        # exact tokens, loss mask, logprobs, versions

Both implementations take the turn call from :class:`TurnCalls`, which hands its arguments on
as one :class:`TurnRequest`. Errors are the :mod:`agentrl.session.errors` classes on both: a conversation that outgrew the
context is a :class:`~agentrl.session.errors.ContextFullError` (the model's error, which the
rollout keeps); any other :class:`~agentrl.session.errors.SessionError` is infrastructure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentrl.types import Message, SamplingParams, ToolSpec, Trajectory

__all__ = ["ChatResult", "SessionBackend", "TurnCalls", "TurnRequest"]


@dataclass
class ChatResult:
    """One turn's outcome: the parsed reply plus what the ledger recorded for it."""

    message: Message
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    output_ids: list[int] = field(default_factory=list)
    """the sampled token ids (empty over HTTP: the server's reply carries the text, the ledger the ids)"""
    logprobs: list[float] = field(default_factory=list)
    """their rollout logprobs (empty over HTTP, like ``output_ids``)"""
    segment: int = 0
    diverged: str | None = None
    """Why this turn started a new segment (``None`` when it extended the ledger)."""
    parse_failed: bool = False
    stop_string: str | None = None
    """The stop string that ended the reply, if one did."""
    raw_text: str | None = None
    """The reply as decoded text, before parsing (``None`` over HTTP)."""


@runtime_checkable
class SessionBackend(Protocol):
    """Token-ledger sessions over one model: open, run turns, read trajectories, close.

    ``family_name`` is the chat-template family; ``stop_token_ids`` are the template's
    end-of-turn tokens, at which every turn stops. Turns of one session are serialized;
    many sessions may run turns at once from one event loop.
    """

    @property
    def model_name(self) -> str: ...

    @property
    def family_name(self) -> str: ...

    @property
    def stop_token_ids(self) -> list[int]: ...

    async def create(self, session_id: str | None = None) -> str:
        """Open a session; its id (a fresh one unless given)."""
        ...

    # The contract; both implementations inherit TurnCalls.chat_completion below.
    async def chat_completion(
        self,
        session_id: str,
        messages: list[Message],
        tools: list[ToolSpec] | None = None,
        sampling: SamplingParams | None = None,
        *,
        stop: list[str] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> ChatResult:
        """One assistant turn on ``messages``, the whole conversation so far."""
        ...

    async def trajectories(self, session_id: str) -> list[Trajectory]:
        """One trajectory per ledger segment with at least one sampled turn."""
        ...

    async def close(self, session_id: str) -> list[Trajectory]:
        """Close the session; its trajectories."""
        ...

    async def tokenize(
        self,
        messages: list[Message],
        tools: list[ToolSpec] | None = None,
        *,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of a full render, exactly as a session's first turn would send them."""
        ...

    async def aclose(self) -> None:
        """Release what the backend holds (connections); sessions still open are left as they are."""
        ...


@dataclass(frozen=True)
class TurnRequest:
    """One assistant turn's arguments: the whole conversation so far, its tools and how to sample the reply.

    ``stop`` strings end the reply at their first occurrence; ``template_kwargs`` go to the chat
    template (over the family's own).
    """

    messages: list[Message]
    tools: list[ToolSpec] | None = None
    sampling: SamplingParams | None = None
    stop: list[str] | None = None
    template_kwargs: dict[str, Any] | None = None


class TurnCalls:
    """``chat_completion`` written once for every backend: its arguments become one :class:`TurnRequest`.

    An implementation inherits it and answers ``_turn(session_id, turn)``.
    """

    # SessionBackend states this signature as the contract; this is its one implementation.
    async def chat_completion(
        self,
        session_id: str,
        messages: list[Message],
        tools: list[ToolSpec] | None = None,
        sampling: SamplingParams | None = None,
        *,
        stop: list[str] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> ChatResult:
        """One assistant turn on ``messages``, the whole conversation so far."""
        return await self._turn(session_id, TurnRequest(messages, tools, sampling, stop, template_kwargs))

    async def _turn(self, session_id: str, turn: TurnRequest) -> ChatResult:
        raise NotImplementedError
