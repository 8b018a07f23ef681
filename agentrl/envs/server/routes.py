"""The env server's FastAPI routes and error handlers (the app is built in :mod:`agentrl.envs.server`).

Handlers are module-level and reach the server's :class:`~agentrl.envs.server.state.ServerState`
through ``app.state.agentrl`` (the :func:`state` dependency). ``router`` holds every route but
the oracle, which lives on ``oracle_router`` and is mounted only with ``expose_oracle``.

``POST /episodes/{id}/reset`` and ``/step`` are served by the fast path
(:mod:`agentrl.envs.server.fastpath`) before FastAPI routes anything: their routes here are
schema-only, the OpenAPI documentation of the wire format. They call the same state methods, so
they would answer alike if the fast path were taken out, but in a running server they never run.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from agentrl.envs.server.state import ServerState
from agentrl.envs.server.wire import (
    CreateEpisode,
    EnvHTTPError,
    EpisodeInfo,
    ErrorResponse,
    OracleResponse,
    ResetRequest,
    ResetResponse,
    StepRequest,
    StepResponse,
    ToolsResponse,
    error_payload,
    json_response,
)
from agentrl.httpkit import validation_message

__all__ = ["install_error_handlers", "oracle_router", "router", "state"]

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (404, 409, 413, 422, 429, 504)
}


def state(request: Request) -> ServerState:
    """The server's state (a FastAPI dependency)."""
    st: ServerState = request.app.state.agentrl
    return st


State = Annotated[ServerState, Depends(state)]
router = APIRouter()
oracle_router = APIRouter()


@router.get("/health")
async def health(st: State) -> dict[str, Any]:
    return {"status": "ok", "envs": sorted(st.served), "live_episodes": len(st.episodes)}


@router.get("/envs")
async def envs(st: State) -> dict[str, Any]:
    return {"envs": [{"id": s.id, "description": s.description} for s in st.served.values()]}


@router.get("/metrics")
async def metrics(st: State) -> dict[str, Any]:
    return st.metrics()


@router.post("/episodes", status_code=201, response_model=EpisodeInfo, responses=_ERRORS)
async def create(body: CreateEpisode, st: State) -> Response:
    return json_response(await st.create_episode(body), 201)


@router.get("/episodes/{episode_id}", response_model=EpisodeInfo, responses=_ERRORS)
async def get_episode(episode_id: str, st: State) -> Response:
    return json_response(st.get(episode_id).info())


@router.get("/episodes/{episode_id}/tools", response_model=ToolsResponse, responses=_ERRORS)
async def tools(episode_id: str, st: State) -> Response:
    return json_response({"tools": [t.model_dump(exclude_none=True) for t in st.get(episode_id).env.tools]})


@router.post("/episodes/{episode_id}/reset", response_model=ResetResponse, responses=_ERRORS)
async def reset(episode_id: str, st: State, body: ResetRequest | None = None) -> Response:
    """Schema-only: the fast path serves this route (see the module docstring)."""
    return json_response(await st.reset_episode(episode_id, body or ResetRequest(seed=None)))


@router.post("/episodes/{episode_id}/step", response_model=StepResponse, responses=_ERRORS)
async def step(episode_id: str, body: StepRequest, st: State) -> Response:
    """Schema-only: the fast path serves this route (see the module docstring)."""
    return json_response(await st.step_episode(episode_id, body))


@router.delete("/episodes/{episode_id}", responses=_ERRORS)
async def close(episode_id: str, st: State) -> Response:
    return json_response(st.close_episode(episode_id))


@oracle_router.post("/episodes/{episode_id}/oracle", response_model=OracleResponse, responses=_ERRORS)
async def oracle(episode_id: str, st: State) -> Response:
    """The gold action of a running episode (mounted only with ``expose_oracle``: it leaks the answer)."""
    return json_response(await st.oracle(episode_id))


# ------------------------------------------------------------------ errors
def _answer(request: Request, status: int, detail: str, infra_error: str | None = None,
            headers: dict[str, str] | None = None) -> Response:  # fmt: skip
    state(request).counters[f"http_{status}"] += 1
    return json_response(error_payload(detail, infra_error), status, headers)


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, EnvHTTPError)
    return _answer(request, exc.status, exc.detail, exc.infra_error, exc.headers)


async def _on_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return _answer(request, 422, validation_message(exc.errors())[0])


async def _on_not_found(request: Request, exc: Exception) -> Response:
    return _answer(request, 404, f"no route {request.method} {request.url.path}; see /docs")


async def _on_bad_method(request: Request, exc: Exception) -> Response:
    return _answer(request, 405, f"method {request.method} not allowed on {request.url.path}; see /docs")


def install_error_handlers(app: FastAPI) -> None:
    """Every error answers the env server's body ``{"detail", "infra_error"}`` and is counted (``http_<status>``)."""
    app.add_exception_handler(EnvHTTPError, _on_http_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(404, _on_not_found)
    app.add_exception_handler(405, _on_bad_method)
