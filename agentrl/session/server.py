"""The session HTTP server: OpenAI-compatible chat completions over a token ledger.

Routes (all JSON)::

    POST   /tokenize                               messages or text -> token ids
    POST   /sessions                               open a session -> {"id", "base_url"}
    POST   /sessions/{id}/v1/chat/completions      one assistant turn (OpenAI Chat Completions)
    POST   /sessions/{id}/v1/responses             one assistant turn (OpenAI Responses)
    POST   /sessions/{id}/v1/messages              one assistant turn (Anthropic Messages)
    POST   /v1/chat/completions, /v1/responses,    the same for the session named by the
           /v1/messages                            X-Session-ID header or by its key (gateway)
    GET    /sessions/{id}/v1/models                the model (for SDKs that list models)
    GET    /sessions/{id}                          a summary of the session
    GET    /sessions/{id}/trajectory               the open segment as a Trajectory
    GET    /sessions/{id}/trajectories             every segment, in order
    DELETE /sessions/{id}                          close it; returns its trajectories
    GET    /v1/models, /metrics, /health
    POST   /update_weights_from_disk               the engine's weight-update API, under SGLang's
    POST   /init_weights_update_group              names and JSON shapes (the same handlers as
    POST   /update_weights_from_distributed        ``agentrl serve-engine``), so a trainer can sync
    POST   /destroy_weights_update_group           weights into this server's engine with
    GET    /get_weight_version, /get_model_info    ``SGLangEngine(session_server_url)``

The official ``openai`` SDK works unchanged with
``base_url=http://HOST:PORT/sessions/{id}/v1``, the ``anthropic`` SDK with
``base_url=http://HOST:PORT/sessions/{id}``. Errors use OpenAI's error body
(``{"error": {"message", "type", "param", "code"}}``; Anthropic's
``{"type": "error", "error": {...}}`` on ``/messages``) with 401/403 for a missing or
foreign session key, 404 for an unknown
session, 422 for a malformed request (the field is named; ``code`` is
``"context_length_exceeded"`` when the conversation no longer fits the context),
424 when the engine failed during the turn (nothing recorded; other sessions are
unaffected). The weight endpoints answer SGLang's ``{"success", "message"}``, 400
when the update is rejected (the old weights stay). The server never answers 5xx.

Layout: the routes are :mod:`agentrl.session.routes` (the weight endpoints
:mod:`agentrl.engines.weight_routes`, shared with the engine server), the bodies
:mod:`agentrl.session.server_wire`; this module builds the app and maps errors to status codes.
:class:`agentrl.httpkit.BackgroundServer` runs the app on a thread (tests, notebooks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from agentrl.engines import weight_routes
from agentrl.engines.errors import EngineError
from agentrl.httpkit import validation_message
from agentrl.session.dialects.common import classify
from agentrl.session.dialects.messages import anthropic_error
from agentrl.session.errors import LedgerError, SessionError
from agentrl.session.manager import SessionManager
from agentrl.session.routes import router
from agentrl.session.server_wire import ChatCompletionRequest, error_response

__all__ = ["ChatCompletionRequest", "create_app"]


def _answer(
    request: Request, status: int, message: str, kind: str, param: str | None, code: str | None
) -> JSONResponse:
    """The error in the dialect's own shape: Anthropic's for ``/messages``, else OpenAI's."""
    if request.url.path.endswith("/messages"):
        return anthropic_error(status, message, kind)
    return error_response(status, message, kind, param, code)


def _is_branch(part: object) -> bool:
    """A location part naming a union's branch (``str``, ``list[...]``, ``tagged-union[...]``), not a field."""
    return isinstance(part, str) and (part in {"str", "int", "float", "bool", "list", "dict"} or "[" in part)


def _field_errors(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """Validation errors located by field alone: union branches dropped from each location, and an
    error about a field dropped when another one points inside it (``input`` is a list of items, so
    "input is not a string" says less than "input.0.content: ...")."""
    out = [{**e, "loc": tuple(p for p in e.get("loc", ()) if not _is_branch(p))} for e in errors]
    return [
        e
        for e in out
        if not any(len(o["loc"]) > len(e["loc"]) and o["loc"][: len(e["loc"])] == e["loc"] for o in out)
    ]


async def _on_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    msg, param = validation_message(_field_errors(exc.errors()))
    return _answer(request, 422, msg, "invalid_request_error", param, None)


async def _on_error(request: Request, exc: Exception) -> JSONResponse:  # never a 500
    status, kind, code = classify(exc)
    message = str(exc)
    if isinstance(exc, LedgerError):
        message = f"ledger invariant broken (a bug, please report it): {exc}"
    elif not isinstance(exc, (SessionError, EngineError)):
        message = f"request failed: {type(exc).__name__}: {exc}"
    return _answer(request, status, message, kind, None, code)


def create_app(
    manager: SessionManager,
    *,
    default_max_tokens: int = 256,
    audit: bool = False,
    require_session_keys: bool = False,
) -> FastAPI:
    """The FastAPI app over ``manager``. ``audit`` runs the canonical audit on every trajectory read;
    ``require_session_keys`` makes every session-scoped request carry its session's key (gateway mode)."""
    app = FastAPI(title="agentrl session server", version="1")
    app.state.manager, app.state.engine = manager, manager.engine
    app.state.default_max_tokens, app.state.audit = default_max_tokens, audit
    app.state.require_session_keys = require_session_keys
    app.include_router(router)
    app.include_router(weight_routes.router)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(SessionError, _on_error)
    app.add_exception_handler(EngineError, _on_error)
    app.add_exception_handler(Exception, _on_error)
    return app
