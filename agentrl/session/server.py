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
"""

from __future__ import annotations

import inspect
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from agentrl.engines.errors import EngineError, EngineRequestError, WeightUpdateError
from agentrl.engines.server import add_weight_routes
from agentrl.session.audit import audit_segment
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
from agentrl.types import FunctionCall, Message, SamplingParams, ToolCall, ToolSpec

__all__ = ["BackgroundServer", "ChatCompletionRequest", "create_app"]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ContentPart(_In):
    type: Literal["text"]
    text: str


class FunctionCallIn(_In):
    name: str
    arguments: str = "{}"


class ToolCallIn(_In):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn
    index: int | None = None


class ChatMessageIn(_In):
    """An OpenAI chat message as agents send it (including fields the SDK echoes back)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    # echoed by agents that append the SDK's response message; ignored
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: Any = None
    function_call: Any = None

    def to_message(self) -> Message:
        content = self.content
        if isinstance(content, list):
            content = "".join(p.text for p in content)
        calls = None
        if self.tool_calls:
            calls = [
                ToolCall(id=c.id, function=FunctionCall(name=c.function.name, arguments=c.function.arguments))
                for c in self.tool_calls
            ]
        return Message(
            role="system" if self.role == "developer" else self.role,
            content=content,
            reasoning_content=self.reasoning_content,
            tool_calls=calls,
            tool_call_id=self.tool_call_id,
            name=self.name,
        )


class StreamOptions(_In):
    include_usage: bool | None = None


class ChatCompletionRequest(_In):
    """The OpenAI chat-completions request fields agentrl serves (unknown fields are rejected)."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    model: str | None = None
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=0)
    n: int | None = Field(None, ge=1, le=1)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def sampling(self, default_max: int) -> SamplingParams:
        fields: dict[str, Any] = {
            "max_new_tokens": self.max_completion_tokens or self.max_tokens or default_max
        }
        if self.temperature is not None:
            fields["temperature"] = self.temperature
        if self.top_p is not None:
            fields["top_p"] = self.top_p
        if self.top_k is not None:
            fields["top_k"] = self.top_k
        if self.seed is not None:
            fields["seed"] = self.seed
        return SamplingParams.model_validate(fields)


class TokenizeRequest(_In):
    messages: list[ChatMessageIn] | None = None
    text: str | None = None
    tools: list[ToolSpec] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


class CreateSessionRequest(_In):
    session_id: str | None = Field(None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")


def _error(
    status: int, message: str, kind: str, param: str | None = None, code: int | str | None = None
) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={
            "error": {"message": message, "type": kind, "param": param, "code": code or status},
            "detail": message,
        },
    )


def _validation_message(errors: list[Any]) -> tuple[str, str | None]:
    parts, first = [], None
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        field = ".".join(loc) or "<body>"
        first = first or field
        got = err.get("input")
        shown = repr(got) if not isinstance(got, (dict, list)) else type(got).__name__
        parts.append(f"{field}: {err.get('msg')} (got {shown})")
    return "invalid request: " + "; ".join(parts), first


def _sse(
    head: dict[str, Any],
    body: dict[str, Any],
    finish: str,
    logprobs: dict[str, Any] | None,
    usage: dict[str, int],
    include_usage: bool,
) -> Iterator[str]:
    """The finished turn as OpenAI stream chunks: the whole delta, then the finish, then usage.

    The ledger needs the complete reply before it can parse it, so the turn is generated
    first and streamed as one delta; clients that only speak streaming still work.
    """
    delta = dict(body)
    if "tool_calls" in delta:
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(delta["tool_calls"])]
    chunk = {**head, "object": "chat.completion.chunk"}
    first = {"index": 0, "delta": delta, "finish_reason": None, "logprobs": logprobs}
    yield f"data: {json.dumps({**chunk, 'choices': [first]})}\n\n"
    last = {"index": 0, "delta": {}, "finish_reason": finish, "logprobs": None}
    yield f"data: {json.dumps({**chunk, 'choices': [last]})}\n\n"
    if include_usage:
        yield f"data: {json.dumps({**chunk, 'choices': [], 'usage': usage})}\n\n"
    yield "data: [DONE]\n\n"


def create_app(manager: SessionManager, *, default_max_tokens: int = 256, audit: bool = False) -> FastAPI:
    """The FastAPI app over ``manager``. ``audit`` runs the canonical audit on every trajectory read."""
    app = FastAPI(title="agentrl session server", version="1")
    app.state.manager = manager

    @app.exception_handler(RequestValidationError)
    async def _on_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        msg, param = _validation_message(list(exc.errors()))
        return _error(422, msg, "invalid_request_error", param)

    @app.exception_handler(SessionError)
    async def _on_session_error(_: Request, exc: SessionError) -> JSONResponse:
        if isinstance(exc, UnknownSessionError):
            return _error(404, str(exc), "not_found_error")
        if isinstance(exc, ContextFullError):
            return _error(422, str(exc), "invalid_request_error", code="context_length_exceeded")
        if isinstance(exc, (SessionRequestError, TemplateError)):
            return _error(422, str(exc), "invalid_request_error")
        if isinstance(exc, SessionEngineError):
            return _error(424, str(exc), "engine_error")
        if isinstance(exc, LedgerError):
            return _error(409, f"ledger invariant broken (a bug, please report it): {exc}", "ledger_error")
        return _error(400, str(exc), "session_error")

    @app.exception_handler(EngineError)
    async def _on_engine_error(_: Request, exc: EngineError) -> JSONResponse:
        if isinstance(exc, (EngineRequestError, WeightUpdateError)):
            return _error(400, str(exc), type(exc).__name__)
        return _error(424, str(exc), type(exc).__name__)

    @app.exception_handler(Exception)
    async def _on_other(_: Request, exc: Exception) -> JSONResponse:  # never a 500
        return _error(400, f"request failed: {type(exc).__name__}: {exc}", "server_error")

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest) -> dict[str, Any]:
        if (req.messages is None) == (req.text is None):
            raise SessionRequestError("send exactly one of 'messages' or 'text'")
        if req.text is not None:
            ids = manager.tok.encode(req.text)
        else:
            ids = await manager.tokenize(
                [m.to_message() for m in req.messages or []],
                req.tools,
                add_generation_prompt=req.add_generation_prompt,
                template_kwargs=req.chat_template_kwargs,
            )
        return {"tokens": ids, "count": len(ids), "model": manager.model_name}

    @app.post("/sessions", status_code=201)
    async def create_session(req: CreateSessionRequest | None = None) -> dict[str, Any]:
        sid = await manager.create(req.session_id if req else None)
        return {"id": sid, "base_url": f"/sessions/{sid}/v1"}

    @app.post("/sessions/{session_id}/v1/chat/completions")
    async def chat_completions(session_id: str, req: ChatCompletionRequest) -> Any:
        manager.ledger(session_id)  # 404 before any work
        stop = [req.stop] if isinstance(req.stop, str) else req.stop
        res = await manager.chat_completion(
            session_id,
            [m.to_message() for m in req.messages],
            req.tools,
            req.sampling(default_max_tokens),
            stop=stop,
            template_kwargs=req.chat_template_kwargs,
        )
        msg = res.message
        if req.tool_choice == "none" and msg.tool_calls:  # the agent asked for no calls: return the text
            msg = Message(
                role="assistant",
                content=manager.tok.tokenizer.decode(
                    res.output_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
                ),
            )
        body: dict[str, Any] = {"role": "assistant", "content": msg.content}
        if msg.reasoning_content is not None:
            body["reasoning_content"] = msg.reasoning_content
        if msg.tool_calls:
            body["tool_calls"] = [c.model_dump() for c in msg.tool_calls]
        finish = "tool_calls" if msg.tool_calls else res.finish_reason
        logprobs: dict[str, Any] | None = None
        if req.logprobs:
            conv = manager.tok.tokenizer.convert_ids_to_tokens
            logprobs = {
                "content": [
                    {"token": str(conv(t)), "logprob": lp, "bytes": None, "top_logprobs": []}
                    for t, lp in zip(res.output_ids, res.logprobs, strict=True)
                ]
            }
        usage = {
            "prompt_tokens": res.prompt_tokens,
            "completion_tokens": res.completion_tokens,
            "total_tokens": res.prompt_tokens + res.completion_tokens,
        }
        head = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "created": int(time.time()),
            "model": manager.model_name,
        }
        extra = {"segment": res.segment, "diverged": res.diverged, "parse_failed": res.parse_failed}
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                _sse(head, body, finish, logprobs, usage, include_usage), media_type="text/event-stream"
            )
        return {
            **head,
            "object": "chat.completion",
            "choices": [{"index": 0, "message": body, "finish_reason": finish, "logprobs": logprobs}],
            "usage": usage,
            "agentrl": extra,
        }

    def _models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": manager.model_name, "object": "model", "created": 0, "owned_by": "agentrl"}],
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return _models()

    @app.get("/sessions/{session_id}/v1/models")
    async def session_models(session_id: str) -> dict[str, Any]:
        manager.ledger(session_id)
        return _models()

    @app.get("/sessions/{session_id}")
    async def session_info(session_id: str) -> dict[str, Any]:
        return manager.info(session_id)

    def _trajectories(session_id: str) -> list[dict[str, Any]]:
        led = manager.ledger(session_id)
        out = []
        for seg in led.segments:
            if not seg.turns:
                continue
            traj = seg.to_trajectory(session_id)
            if audit:
                report = audit_segment(manager.tok, seg)
                manager.record_audit(report)
                traj.metrics.update(report.metrics())
            out.append(traj.model_dump())
        return out

    @app.get("/sessions/{session_id}/trajectory")
    async def trajectory(session_id: str) -> dict[str, Any]:
        trajs = _trajectories(session_id)
        if not trajs:
            raise SessionRequestError(f"session {session_id!r} has no turns yet; call chat/completions first")
        return trajs[-1]

    @app.get("/sessions/{session_id}/trajectories")
    async def trajectories(session_id: str) -> dict[str, Any]:
        return {"id": session_id, "trajectories": _trajectories(session_id)}

    @app.delete("/sessions/{session_id}")
    async def delete_session(session_id: str) -> dict[str, Any]:
        trajs = _trajectories(session_id)
        await manager.close(session_id)
        return {"id": session_id, "deleted": True, "trajectories": trajs}

    @app.get("/metrics")
    async def metrics() -> dict[str, float]:
        return manager.metrics()

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness plus what a remote trainer checks against its own copy of the model."""
        return {
            "ok": True,
            "sessions": manager.num_sessions,
            "family": manager.family.name,
            "model": manager.model_name,
            "vocab_size": len(manager.tok.tokenizer),
            "stop_token_ids": list(manager.tok.stop_token_ids),
            "weight_version": manager.engine.weight_version,
        }

    add_weight_routes(app, manager.engine)

    @app.get("/get_model_info")
    async def get_model_info() -> dict[str, Any]:
        """The engine's model info (SGLang's shape) plus the session server's model name and family."""
        fn = getattr(manager.engine, "model_info", None)
        info = fn() if fn is not None else {}
        if inspect.isawaitable(info):
            info = await info
        return {
            **dict(info),
            "model_path": manager.model_name,
            "is_generation": True,
            "family": manager.family.name,
            "weight_version": str(manager.engine.weight_version),
        }

    return app


class BackgroundServer:
    """Run an ASGI app with uvicorn on a background thread (``port=0`` picks a free port).

    ``with BackgroundServer(app) as srv: httpx.get(srv.url + "/health")``.
    """

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, *, start_timeout_s: float = 30.0
    ) -> None:
        import uvicorn

        self._server = uvicorn.Server(
            uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        )
        self._thread = threading.Thread(target=self._server.run, name="agentrl-session-server", daemon=True)
        self.host = host
        self.start_timeout_s = start_timeout_s
        self.port = port

    def start(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise SessionError(
                    f"the session server did not start on {self.host}:{self.port} within "
                    f"{self.start_timeout_s:g}s (is the port in use?)"
                )
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
