"""Token-ledger sessions: server-owned tokenization with exact multi-turn tokens.

``SessionManager`` is the in-process API (the trainer's rollouts use it);
``create_app`` wraps it in the OpenAI-compatible HTTP server that
``agentrl serve-session`` runs. See docs/session.md.
"""

from __future__ import annotations

from agentrl.session.audit import AuditReport, audit_segment
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
    "AuditReport",
    "ChatResult",
    "ContextFullError",
    "Family",
    "Ledger",
    "LedgerError",
    "Segment",
    "SessionEngineError",
    "SessionError",
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
    if name == "SessionClient":
        from agentrl.session.client import SessionClient

        return SessionClient
    raise AttributeError(f"module 'agentrl.session' has no attribute {name!r}")
