"""Errors raised by the session server and its token ledger (the ``agentrl.session`` branch).

::

    AgentRLError
    └── SessionError                 a session could not do what was asked
        ├── UnknownSessionError      no session with that id (HTTP 404); create one first
        ├── SessionRequestError      the request is invalid (HTTP 422): empty messages, bad roles, ...
        │   └── ContextFullError     the conversation no longer fits the model's context (also an
        │                            engines ContextLengthError); end the episode as truncated
        ├── TemplateError            the chat template is not append-only for these message shapes
        │                            (HTTP 422); names the offending turn
        ├── SessionKeyError          the request lacks its session's key (HTTP 401) or carries another
        │                            session's key (HTTP 403); pass the key POST /sessions returned
        ├── SessionEngineError       the engine failed or timed out during a turn (HTTP 424); the
        │                            ledger is unchanged, the turn can be retried, other sessions go on
        └── LedgerError              an internal invariant broke (a prefix property did not hold); a bug

A divergent message history is *not* an error: it starts a new segment and is counted.
"""

from __future__ import annotations

from agentrl.engines.errors import ContextLengthError
from agentrl.errors import AgentRLError

__all__ = [
    "ContextFullError",
    "LedgerError",
    "SessionEngineError",
    "SessionError",
    "SessionKeyError",
    "SessionRequestError",
    "TemplateError",
    "UnknownSessionError",
]


class SessionError(AgentRLError):
    """Base class of session-server errors."""


class UnknownSessionError(SessionError, KeyError):
    """No open session has this id (it was never created, or it was deleted)."""

    def __str__(self) -> str:  # KeyError would print the repr of its argument
        return str(self.args[0]) if self.args else "unknown session"


class SessionRequestError(SessionError, ValueError):
    """A chat or tokenize request is invalid; retrying it unchanged fails again."""


class ContextFullError(SessionRequestError, ContextLengthError):
    """The prompt plus ``max_new_tokens`` exceeds the model's context; nothing was recorded."""


class SessionKeyError(SessionError):
    """The request may not touch this session: no key where one is required (``status`` 401),
    or the key of another session (403)."""

    def __init__(self, message: str, status: int = 401) -> None:
        super().__init__(message)
        self.status = status


class TemplateError(SessionError):
    """The chat template cannot be tokenized incrementally for these messages.

    Raised when rendering is not append-only (an earlier turn renders differently once
    a message is appended after it), naming the message index and role that changed.
    """


class SessionEngineError(SessionError):
    """The engine failed or passed its deadline during one turn; nothing was committed."""


class LedgerError(SessionError):
    """An internal ledger invariant did not hold; this is a bug in agentrl, please report it."""
