"""The session server's routes (the app is built in :mod:`agentrl.session.server`).

Handlers are module-level and reach the :class:`~agentrl.session.manager.SessionManager`
through ``app.state.manager`` (the :func:`manager` dependency); ``app.state.default_max_tokens``
and ``app.state.audit`` hold the server's two settings. Errors are raised as
:mod:`agentrl.session.errors` / :mod:`agentrl.engines.errors` classes and answered in OpenAI's
body by the handlers :mod:`agentrl.session.server` installs.
"""

from __future__ import annotations

import inspect
import time
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from agentrl.engines.protocol import Engine
from agentrl.session.audit import audit_segment
from agentrl.session.errors import SessionRequestError
from agentrl.session.manager import SessionManager
from agentrl.session.server_wire import ChatCompletionRequest, CreateSessionRequest, TokenizeRequest, sse
from agentrl.types import Message

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
    sid = await sm.create(req.session_id if req else None)
    return {"id": sid, "base_url": f"/sessions/{sid}/v1"}


def _message_body(
    sm: SessionManager, req: ChatCompletionRequest, msg: Message, output_ids: list[int]
) -> dict[str, Any]:
    """The assistant message as OpenAI's ``message`` (tool_choice "none" returns calls as their text)."""
    if req.tool_choice == "none" and msg.tool_calls:  # the agent asked for no calls: return the text
        text = sm.tok.tokenizer.decode(
            output_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        msg = Message(role="assistant", content=text)
    body: dict[str, Any] = {"role": "assistant", "content": msg.content}
    if msg.reasoning_content is not None:
        body["reasoning_content"] = msg.reasoning_content
    if msg.tool_calls:
        body["tool_calls"] = [c.model_dump() for c in msg.tool_calls]
    return body


def _logprobs(sm: SessionManager, output_ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    conv = sm.tok.tokenizer.convert_ids_to_tokens
    return {
        "content": [
            {"token": str(conv(t)), "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(output_ids, logprobs, strict=True)
        ]
    }


@router.post("/sessions/{session_id}/v1/chat/completions")
async def chat_completions(session_id: str, req: ChatCompletionRequest, request: Request, sm: Manager) -> Any:
    """One assistant turn (OpenAI's schema; ``stream`` answers the finished turn as chunks)."""
    sm.ledger(session_id)  # 404 before any work
    stop = [req.stop] if isinstance(req.stop, str) else req.stop
    res = await sm.chat_completion(
        session_id,
        [m.to_message() for m in req.messages],
        req.tools,
        req.sampling(request.app.state.default_max_tokens),
        stop=stop,
        template_kwargs=req.chat_template_kwargs,
    )
    body = _message_body(sm, req, res.message, res.output_ids)
    finish = "tool_calls" if "tool_calls" in body else res.finish_reason
    logprobs = _logprobs(sm, res.output_ids, res.logprobs) if req.logprobs else None
    usage = {
        "prompt_tokens": res.prompt_tokens,
        "completion_tokens": res.completion_tokens,
        "total_tokens": res.prompt_tokens + res.completion_tokens,
    }
    head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": sm.model_name}
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(
            sse(head, body, finish, logprobs, usage, include_usage), media_type="text/event-stream"
        )
    return {
        **head,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": body, "finish_reason": finish, "logprobs": logprobs}],
        "usage": usage,
        "agentrl": {"segment": res.segment, "diverged": res.diverged, "parse_failed": res.parse_failed},
    }


def _models(sm: SessionManager) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": sm.model_name, "object": "model", "created": 0, "owned_by": "agentrl"}],
    }


@router.get("/v1/models")
async def models(sm: Manager) -> dict[str, Any]:
    return _models(sm)


@router.get("/sessions/{session_id}/v1/models")
async def session_models(session_id: str, sm: Manager) -> dict[str, Any]:
    sm.ledger(session_id)
    return _models(sm)


@router.get("/sessions/{session_id}")
async def session_info(session_id: str, sm: Manager) -> dict[str, Any]:
    return sm.info(session_id)


def _trajectories(request: Request, session_id: str) -> list[dict[str, Any]]:
    """Every segment with turns as a Trajectory dict; with ``app.state.audit``, audited and recorded."""
    sm = manager(request)
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
