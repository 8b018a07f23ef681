"""Token-ledger sessions: server-owned tokenization with exact multi-turn tokens.

``SessionBackend`` is what a rollout needs of sessions, every call awaited. ``SessionManager``
implements it in process; ``create_app`` wraps a manager in the OpenAI-compatible HTTP server
that ``agentrl serve-session`` runs, and ``AsyncSessionClient`` implements it over that server
(``SessionClient`` is its blocking facade). See docs/session.md.
"""

from __future__ import annotations

from agentrl.session.audit import AuditReport, audit_segment
from agentrl.session.backend import SessionBackend
from agentrl.session.errors import (
    ContextFullError,
    LedgerError,
    SessionEngineError,
    SessionError,
    SessionRequestError,
    TemplateError,
    UnknownSessionError,
)
from agentrl.session.families import FAMILIES, Family, detect_family, get_family
from agentrl.session.ledger import Ledger, Segment, Turn
from agentrl.session.manager import ChatResult, SessionManager

__all__ = [
    "FAMILIES",
    "AsyncSessionClient",
    "AuditReport",
    "ChatResult",
    "ContextFullError",
    "Family",
    "Ledger",
    "LedgerError",
    "Segment",
    "SessionEngineError",
    "SessionError",
    "SessionBackend",
    "SessionClient",
    "SessionManager",
    "SessionRequestError",
    "TemplateError",
    "Turn",
    "UnknownSessionError",
    "audit_segment",
    "create_app",
    "detect_family",
    "get_family",
]


def __getattr__(name: str) -> object:
    if name == "create_app":  # FastAPI is imported only when the server is wanted
        from agentrl.session.server import create_app

        return create_app
    if name in ("SessionClient", "AsyncSessionClient"):  # httpx is imported only when a client is wanted
        from agentrl.session import client

        return getattr(client, name)
    raise AttributeError(f"module 'agentrl.session' has no attribute {name!r}")
