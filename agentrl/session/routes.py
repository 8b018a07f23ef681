"""The session server's routes (the app is built in :mod:`agentrl.session.server`).

Handlers are module-level and reach the :class:`~agentrl.session.manager.SessionManager`
through ``app.state.manager`` (the :func:`manager` dependency); ``app.state.default_max_tokens``,
``app.state.audit`` and ``app.state.require_session_keys`` hold the server's settings. The three
dialects (Chat Completions, Responses, Messages; :mod:`agentrl.session.dialects`) run their turns
on the same ledger through :func:`_turn`; :mod:`agentrl.session.gateway` decides which session a
request names and whether its key may touch it. Errors are raised as
:mod:`agentrl.session.errors` / :mod:`agentrl.engines.errors` classes and answered in OpenAI's
body (Anthropic's on ``/messages``) by the handlers :mod:`agentrl.session.server` installs.
"""

from __future__ import annotations

import inspect
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Annotated, Any

import pydantic
from fastapi import APIRouter, Depends, Request

from agentrl.engines.protocol import Engine, TokenDelta
from agentrl.session.audit import audit_segment
from agentrl.session.backend import ChatResult
from agentrl.session.dialects.chat import chat_body, chat_events
from agentrl.session.dialects.common import EventStream, TurnArgs
from agentrl.session.dialects.messages import MessagesRequest, messages_body, messages_events, messages_turn
from agentrl.session.dialects.responses import (
    ResponsesRequest,
    response_body,
    response_events,
    responses_turn,
)
from agentrl.session.errors import SessionRequestError
from agentrl.session.gateway import authorize, resolve_session
from agentrl.session.manager import SessionManager
from agentrl.session.server_wire import ChatCompletionRequest, CreateSessionRequest, TokenizeRequest
from agentrl.types import SamplingParams

__all__ = ["manager", "router"]


def manager(request: Request) -> SessionManager:
    """The served session manager (a FastAPI dependency): ``app.state.manager``."""
    sm: SessionManager = request.app.state.manager
    return sm


Manager = Annotated[SessionManager, Depends(manager)]
router = APIRouter()


@router.post("/tokenize")
async def tokenize(req: TokenizeRequest, sm: Manager) -> dict[str, Any]:
    if (req.messages is None) == (req.text is None):
        raise SessionRequestError("send exactly one of 'messages' or 'text'")
    if req.text is not None:
        ids = sm.tok.encode(req.text)
    else:
        ids = await sm.tokenize(
            [m.to_message() for m in req.messages or []],
            req.tools,
            add_generation_prompt=req.add_generation_prompt,
            template_kwargs=req.chat_template_kwargs,
        )
    return {"tokens": ids, "count": len(ids), "model": sm.model_name}


@router.post("/sessions", status_code=201)
async def create_session(sm: Manager, req: CreateSessionRequest | None = None) -> dict[str, Any]:
    """Open a session: its id, its base URLs (OpenAI SDKs, the Anthropic SDK) and its key; ``pin``
    fixes the sampling of its turns (:class:`~agentrl.session.embedded.GatewayManager`)."""
    pinned = _pinned(sm, req.pin) if req is not None and req.pin is not None else None
    sid = await sm.create(req.session_id if req else None)
    if pinned is not None:
        sm.pin(sid, lambda turn: pinned[min(turn, len(pinned) - 1)])  # type: ignore[attr-defined]
    return {
        "id": sid,
        "base_url": f"/sessions/{sid}/v1",
        "anthropic_base_url": f"/sessions/{sid}",
        "api_key": sm.session_key(sid),
    }


def _pinned(sm: SessionManager, pin: list[dict[str, Any]]) -> list[SamplingParams]:
    from agentrl.session.embedded import GatewayManager

    if not isinstance(sm, GatewayManager):
        raise SessionRequestError("this session server does not pin sampling (pin needs a GatewayManager)")
    out = []
    for k, fields in enumerate(pin):
        try:
            out.append(SamplingParams.model_validate(fields))
        except pydantic.ValidationError as e:
            raise SessionRequestError(
                f"pin[{k}] is not a sampling setting: {e.errors()[0]['msg']} ({fields!r:.100})"
            ) from e
    return out


async def _turn(
    sm: SessionManager,
    sid: str,
    turn: TurnArgs,
    stream: bool,
    body: Callable[[ChatResult], dict[str, Any]],
    events: Callable[
        [TokenDelta | ChatResult, AsyncGenerator[TokenDelta | ChatResult, None]], AsyncIterator[str]
    ],
) -> Any:
    """Run one turn on the ledger, answered whole or streamed as the engine samples."""
    args = (sid, turn.messages, turn.tools, turn.sampling)
    if not stream:
        res = await sm.chat_completion(*args, stop=turn.stop, template_kwargs=turn.template_kwargs)
        return body(res)
    it = sm.chat_stream(*args, stop=turn.stop, template_kwargs=turn.template_kwargs)
    try:  # the first token (or the engine's refusal) before the status line: errors stay HTTP errors
        first = await anext(it)
    except BaseException:
        await it.aclose()
        raise
    return EventStream(events(first, it))


def _head(sm: SessionManager) -> dict[str, Any]:
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": sm.model_name}


async def _chat(sid: str, req: ChatCompletionRequest, request: Request, sm: SessionManager) -> Any:
    turn = TurnArgs(
        messages=[m.to_message() for m in req.messages],
        tools=req.tools,
        sampling=req.sampling(request.app.state.default_max_tokens),
        stop=req.stop_list(),
        template_kwargs=req.chat_template_kwargs,
        parse_tools=req.tool_choice != "none",
    )
    head = _head(sm)
    return await _turn(
        sm,
        sid,
        turn,
        bool(req.stream),
        lambda res: chat_body(sm, req, res, head),
        lambda first, rest: chat_events(sm, sid, req, head, first, rest),
    )


async def _responses(sid: str, req: ResponsesRequest, request: Request, sm: SessionManager) -> Any:
    turn = responses_turn(sm, sid, req, request.app.state.default_max_tokens)
    return await _turn(
        sm,
        sid,
        turn,
        bool(req.stream),
        lambda res: response_body(sm, sid, req, turn, res),
        lambda first, rest: response_events(sm, sid, req, turn, first, rest),
    )


async def _messages(sid: str, req: MessagesRequest, request: Request, sm: SessionManager) -> Any:
    turn = messages_turn(req, request.app.state.default_max_tokens)
    return await _turn(
        sm,
        sid,
        turn,
        bool(req.stream),
        lambda res: messages_body(sm, turn, res),
        lambda first, rest: messages_events(sm, sid, turn, first, rest),
    )


@router.post("/sessions/{session_id}/v1/chat/completions")
async def chat_completions(session_id: str, req: ChatCompletionRequest, request: Request, sm: Manager) -> Any:
    """One assistant turn in OpenAI's Chat Completions schema (``stream`` streams as sampled)."""
    authorize(request, sm, session_id)
    return await _chat(session_id, req, request, sm)


@router.post("/sessions/{session_id}/v1/responses")
async def responses(session_id: str, req: ResponsesRequest, request: Request, sm: Manager) -> Any:
    """One assistant turn in OpenAI's Responses schema."""
    authorize(request, sm, session_id)
    return await _responses(session_id, req, request, sm)


@router.post("/sessions/{session_id}/v1/messages")
async def messages(session_id: str, req: MessagesRequest, request: Request, sm: Manager) -> Any:
    """One assistant turn in Anthropic's Messages schema."""
    authorize(request, sm, session_id)
    return await _messages(session_id, req, request, sm)


@router.post("/v1/chat/completions")
async def gateway_chat(req: ChatCompletionRequest, request: Request, sm: Manager) -> Any:
    """Chat Completions for the session named by ``X-Session-ID`` or by its key."""
    return await _chat(resolve_session(request, sm), req, request, sm)


@router.post("/v1/responses")
async def gateway_responses(req: ResponsesRequest, request: Request, sm: Manager) -> Any:
    """Responses for the session named by ``X-Session-ID`` or by its key."""
    return await _responses(resolve_session(request, sm), req, request, sm)


@router.post("/v1/messages")
async def gateway_messages(req: MessagesRequest, request: Request, sm: Manager) -> Any:
    """Messages for the session named by ``X-Session-ID`` or by its key."""
    return await _messages(resolve_session(request, sm), req, request, sm)


def _models(sm: SessionManager) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": sm.model_name, "object": "model", "created": 0, "owned_by": "agentrl"}],
    }


@router.get("/v1/models")
async def models(sm: Manager) -> dict[str, Any]:
    return _models(sm)


@router.get("/sessions/{session_id}/v1/models")
async def session_models(session_id: str, request: Request, sm: Manager) -> dict[str, Any]:
    authorize(request, sm, session_id)
    return _models(sm)


@router.get("/sessions/{session_id}")
async def session_info(session_id: str, request: Request, sm: Manager) -> dict[str, Any]:
    authorize(request, sm, session_id)
    return sm.info(session_id)


def _trajectories(request: Request, session_id: str) -> list[dict[str, Any]]:
    """Every segment with turns as a Trajectory dict; with ``app.state.audit``, audited and recorded."""
    sm = manager(request)
    authorize(request, sm, session_id)
    out = []
    for seg in sm.ledger(session_id).segments:
        if not seg.turns:
            continue
        traj = seg.to_trajectory(session_id)
        if request.app.state.audit:
            report = audit_segment(sm.tok, seg)
            sm.record_audit(report)
            traj.metrics.update(report.metrics())
        out.append(traj.model_dump())
    return out


@router.get("/sessions/{session_id}/trajectory")
async def trajectory(session_id: str, request: Request) -> dict[str, Any]:
    trajs = _trajectories(request, session_id)
    if not trajs:
        raise SessionRequestError(f"session {session_id!r} has no turns yet; call chat/completions first")
    return trajs[-1]


@router.get("/sessions/{session_id}/trajectories")
async def trajectories(session_id: str, request: Request) -> dict[str, Any]:
    return {"id": session_id, "trajectories": _trajectories(request, session_id)}


@router.delete("/sessions/{session_id}")
async def delete_session(session_id: str, request: Request, sm: Manager) -> dict[str, Any]:
    trajs = _trajectories(request, session_id)
    await sm.close(session_id)
    return {"id": session_id, "deleted": True, "trajectories": trajs}


@router.get("/metrics")
async def metrics(sm: Manager) -> dict[str, float]:
    return sm.metrics()


@router.get("/health")
async def health(sm: Manager) -> dict[str, Any]:
    """Liveness plus what a remote trainer checks against its own copy of the model."""
    return {
        "ok": True,
        "sessions": sm.num_sessions,
        "family": sm.family.name,
        "model": sm.model_name,
        "vocab_size": len(sm.tok.tokenizer),
        "stop_token_ids": list(sm.tok.stop_token_ids),
        "weight_version": sm.engine.weight_version,
    }


@router.get("/get_model_info")
async def get_model_info(sm: Manager) -> dict[str, Any]:
    """The engine's model info (SGLang's shape) plus the session server's model name and family."""
    eng: Engine = sm.engine
    fn = getattr(eng, "model_info", None)
    info = fn() if fn is not None else {}
    if inspect.isawaitable(info):
        info = await info
    return {
        **dict(info),
        "model_path": sm.model_name,
        "is_generation": True,
        "family": sm.family.name,
        "weight_version": str(eng.weight_version),
    }
