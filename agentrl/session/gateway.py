"""Gateway mode: which session a request belongs to, and whether it may touch it.

A black-box agent only gets a base URL and an API key (docs/session.md, "Gateway"). The
session is named by the path (``/sessions/{id}/v1/...``), else by the ``X-Session-ID``
header, else by the key alone (every session's key is unique). The key arrives as OpenAI
SDKs send it (``Authorization: Bearer KEY``) or as the Anthropic SDK does (``x-api-key``).

Rules: a key that belongs to another session than the one named is refused (403) always;
with ``require_keys`` every session-scoped request must carry the session's own key (401
otherwise), so an agent cannot read or write another agent's session even if it learns its id.
"""

from __future__ import annotations

from fastapi import Request

from agentrl.session.errors import SessionKeyError, SessionRequestError
from agentrl.session.manager import SessionManager

__all__ = ["SESSION_HEADER", "authorize", "presented_key", "resolve_session"]

SESSION_HEADER = "X-Session-ID"


def presented_key(request: Request) -> str | None:
    """The API key the client sent (``Authorization: Bearer`` or ``x-api-key``), if any."""
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer " and auth[7:].strip():
        return auth[7:].strip()
    return request.headers.get("x-api-key") or None


def authorize(request: Request, sm: SessionManager, session_id: str) -> None:
    """Raise unless this request may use ``session_id`` (see the module docstring)."""
    sm.ledger(session_id)  # an unknown session is a 404 first
    key = presented_key(request)
    owner = sm.session_for_key(key) if key else None
    if owner is not None and owner != session_id:
        sm.counters["tito/gateway/foreign_key"] += 1
        raise SessionKeyError(
            f"the API key belongs to session {owner!r}, not to session {session_id!r}; "
            "use the key POST /sessions returned for this session",
            403,
        )
    if request.app.state.require_session_keys and owner != session_id:
        sm.counters["tito/gateway/missing_key"] += 1
        raise SessionKeyError(
            f"session {session_id!r} needs its key: pass the api_key POST /sessions returned as the "
            "client's API key (Authorization: Bearer KEY or x-api-key: KEY)",
            401,
        )


def resolve_session(request: Request, sm: SessionManager) -> str:
    """The session of a request to the plain ``/v1/...`` routes: the header's, else the key's."""
    sid = request.headers.get(SESSION_HEADER)
    if not sid:
        key = presented_key(request)
        sid = sm.session_for_key(key) if key else None
    if not sid:
        raise SessionRequestError(
            f"no session named: send the {SESSION_HEADER} header, or the session's api_key as the API key, "
            "or use the session's base URL /sessions/{id}/v1"
        )
    authorize(request, sm, sid)
    return sid
