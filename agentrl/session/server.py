"""The session HTTP server: OpenAI-compatible chat completions over a token ledger.

Routes (all JSON)::

    POST   /tokenize                               messages or text -> token ids
    POST   /sessions                               open a session -> {"id", "base_url"}
    POST   /sessions/{id}/v1/chat/completions      one assistant turn (OpenAI schema)
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
``base_url=http://HOST:PORT/sessions/{id}/v1``. Errors use OpenAI's error body
(``{"error": {"message", "type", "param", "code"}}``) with 404 for an unknown
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

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from agentrl.engines import weight_routes
from agentrl.engines.errors import EngineError, EngineRequestError, WeightUpdateError
from agentrl.httpkit import validation_message
from agentrl.session.errors import (
    ContextFullError,
    LedgerError,
    SessionEngineError,
    SessionError,
    SessionRequestError,
    TemplateError,
    UnknownSessionError,
)
from agentrl.session.manager import SessionManager
from agentrl.session.routes import router
from agentrl.session.server_wire import ChatCompletionRequest, error_response

__all__ = ["ChatCompletionRequest", "create_app"]


async def _on_validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    msg, param = validation_message(exc.errors())
    return error_response(422, msg, "invalid_request_error", param)


async def _on_session_error(_: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, UnknownSessionError):
        return error_response(404, str(exc), "not_found_error")
    if isinstance(exc, ContextFullError):
        return error_response(422, str(exc), "invalid_request_error", code="context_length_exceeded")
    if isinstance(exc, (SessionRequestError, TemplateError)):
        return error_response(422, str(exc), "invalid_request_error")
    if isinstance(exc, SessionEngineError):
        return error_response(424, str(exc), "engine_error")
    if isinstance(exc, LedgerError):
        return error_response(
            409, f"ledger invariant broken (a bug, please report it): {exc}", "ledger_error"
        )
    return error_response(400, str(exc), "session_error")


async def _on_engine_error(_: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, (EngineRequestError, WeightUpdateError)):
        return error_response(400, str(exc), type(exc).__name__)
    return error_response(424, str(exc), type(exc).__name__)


async def _on_other(_: Request, exc: Exception) -> JSONResponse:  # never a 500
    return error_response(400, f"request failed: {type(exc).__name__}: {exc}", "server_error")


def create_app(manager: SessionManager, *, default_max_tokens: int = 256, audit: bool = False) -> FastAPI:
    """The FastAPI app over ``manager``. ``audit`` runs the canonical audit on every trajectory read."""
    app = FastAPI(title="agentrl session server", version="1")
    app.state.manager, app.state.engine = manager, manager.engine
    app.state.default_max_tokens, app.state.audit = default_max_tokens, audit
    app.include_router(router)
    app.include_router(weight_routes.router)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(SessionError, _on_session_error)
    app.add_exception_handler(EngineError, _on_engine_error)
    app.add_exception_handler(Exception, _on_other)
    return app
