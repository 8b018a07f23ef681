"""The OpenEnv protocol on the env server: one agentrl env served the way OpenEnv's server library serves its own.

``agentrl serve-env --env NAME --protocol openenv`` (or ``both``) mounts these routes, which
``openenv validate --url`` checks and OpenEnv's ``EnvClient`` drives::

    GET  /health  /metadata  /schema          {"status": "healthy"}, name/description, the three schemas
    POST /reset   {"seed", "episode_id", ...}  -> {"observation", "reward", "done", "metadata"}
    POST /step    {"action", "episode_id"}     -> the same body
    GET  /state?episode_id=ID                  -> the episode's state
    POST /mcp     JSON-RPC 2.0: initialize, tools/list, tools/call, openenv/session/create|close
    WS   /ws      one episode per connection: frames {"type": "reset"|"step"|"state"|"mcp"|"close", "data"}

What maps to what is in :mod:`agentrl.envs.server.openenv_wire`. Episodes are the server's own
(:class:`~agentrl.envs.server.state.ServerState`), so every guarantee of the env server holds
here too: env code off the event loop, a deadline on every reset/step, the live-episode cap, idle
episodes reaped after the TTL, bad input answered 4xx with a message.

Where OpenEnv's reference server and this one differ:

- Over HTTP, OpenEnv builds a fresh env for every ``/reset`` and ``/step`` call, so an HTTP
  client cannot play a multi-turn episode. Here ``/reset`` starts an episode (or resets the one
  named by ``episode_id``) and answers its id in ``metadata.episode_id``; ``/step`` and
  ``/state`` take that id. A ``/step`` without it is a 422 that says so.
- A WebSocket session is one episode; it is closed when the socket closes. ``/ws?session_id=ID``
  attaches the socket to the episode of an HTTP MCP session instead (what OpenEnv's
  ``MCPToolClient`` does); that episode lives on until ``openenv/session/close`` or the TTL.
- ``tools/call`` on ``/mcp`` is one env step (one assistant turn that calls one tool): it counts
  toward ``max_turns`` and its reward and ``done`` come back in the result's ``_meta``.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

import pydantic
from fastapi import APIRouter, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import Response

from agentrl import __version__
from agentrl.envs.registry import make
from agentrl.envs.server.openenv_wire import (
    JSONRPC_INVALID_PARAMS,
    JSONRPC_INVALID_REQUEST,
    JSONRPC_METHOD_NOT_FOUND,
    JSONRPC_PARSE_ERROR,
    JSONRPC_SERVER_ERROR,
    OpenEnvAction,
    OpenEnvObservation,
    OpenEnvState,
    observation_payload,
    rpc_error,
    rpc_result,
)
from agentrl.envs.server.state import Episode, ServerState
from agentrl.envs.server.wire import (
    CreateEpisode,
    EnvHTTPError,
    ResetRequest,
    StepRequest,
    json_bytes,
    json_response,
)
from agentrl.httpkit import validation_message
from agentrl.types import FunctionCall, Message, ToolCall

__all__ = ["OPENAPI_VERSION", "OpenEnvSurface", "openenv_router"]

OPENAPI_VERSION = "1.0.0"
"""The OpenEnv HTTP standard version the app declares in ``/openapi.json`` (``openenv-http/1.x``)."""


class OpenEnvSurface:
    """The one env the OpenEnv routes serve, over the server's :class:`ServerState`."""

    def __init__(self, state: ServerState, env_id: str) -> None:
        self.state = state
        self.env_id = env_id
        self.spec = state.served[env_id]
        self._tools: list[dict[str, Any]] | None = None
        self.attached: set[str] = set()
        """Episodes of HTTP MCP sessions a WebSocket is attached to (``/ws?session_id=``)."""

    # ---------------------------------------------------------- episodes
    async def create(self, episode_id: str | None = None) -> Episode:
        """A new episode of the served env, under ``episode_id`` when the client chose one."""
        info = await self.state.create_episode(CreateEpisode(env_id=self.env_id))
        ep = self.state.episodes[info["episode_id"]]
        if episode_id is not None and episode_id != ep.id:
            self.state.episodes.pop(ep.id)
            ep.id = episode_id
            self.state.episodes[episode_id] = ep
        return ep

    async def reset(self, ep: Episode, data: dict[str, Any]) -> dict[str, Any]:
        body = _reset_request(data)
        out = await self.state.reset_episode(ep.id, body)
        return observation_payload(ep.id, out["messages"], _tools(ep), None, out["info"], ep.env.turn)

    async def step(self, ep: Episode, action: Any) -> dict[str, Any]:
        if not isinstance(action, dict):
            raise EnvHTTPError(422, f"the action must be a JSON object, got {type(action).__name__}")
        try:
            message = OpenEnvAction.model_validate(action).message()
        except pydantic.ValidationError as e:
            raise EnvHTTPError(422, f"invalid action: {validation_message(e.errors())[0]}") from None
        out = await self.state.step_episode(ep.id, StepRequest(action=message))
        return observation_payload(ep.id, out["messages"], _tools(ep), out, out["info"], ep.env.turn)

    @staticmethod
    def state_of(ep: Episode) -> dict[str, Any]:
        info = ep.info()
        return OpenEnvState(
            episode_id=ep.id,
            step_count=info["turn"],
            env_id=info["env_id"],
            status=info["status"],
            max_turns=info["max_turns"],
            reward_range=info["reward_range"],
            infra_error=info["infra_error"],
        ).model_dump()

    def episode(self, episode_id: str | None, what: str) -> Episode:
        if not episode_id:
            raise EnvHTTPError(
                422,
                f"{what} over HTTP needs the episode_id that POST /reset answered (in metadata.episode_id); "
                "or play the episode over the WebSocket /ws, one episode per connection",
            )
        return self.state.get(episode_id)

    async def probe_tools(self) -> list[dict[str, Any]]:
        """The served env's tools without an episode (built once, then remembered)."""
        if self._tools is None:
            env = await asyncio.wait_for(
                asyncio.to_thread(make, self.env_id), self.state.config.step_timeout_s
            )
            try:
                self._tools = [t.model_dump(exclude_none=True) for t in env.tools]
            finally:
                env.close()
        return self._tools

    # ---------------------------------------------------------- JSON-RPC
    async def rpc(self, body: Any, session: Episode | None = None) -> dict[str, Any] | None:
        """Answer one JSON-RPC request (None for a notification); ``session`` is the WebSocket's episode."""
        if (
            not isinstance(body, dict)
            or body.get("jsonrpc") != "2.0"
            or not isinstance(body.get("method"), str)
        ):
            rid = body.get("id") if isinstance(body, dict) else None
            return rpc_error(
                rid, JSONRPC_INVALID_REQUEST, 'invalid request: send {"jsonrpc": "2.0", "method", "id"}'
            )
        method, rid, params = body["method"], body.get("id"), body.get("params", {})
        if "id" not in body:
            return None  # a notification (e.g. notifications/initialized) gets no answer
        if not isinstance(params, dict):
            return rpc_error(
                rid, JSONRPC_INVALID_PARAMS, f"params must be an object, got {type(params).__name__}"
            )
        try:
            return rpc_result(rid, await self._rpc_method(method, params, session))
        except _RpcError as e:
            return rpc_error(rid, e.code, e.message)
        except EnvHTTPError as e:
            code = (
                JSONRPC_INVALID_PARAMS if e.status < 500 and e.infra_error is None else JSONRPC_SERVER_ERROR
            )
            return rpc_error(rid, code, e.detail)

    async def _rpc_method(self, method: str, params: dict[str, Any], session: Episode | None) -> Any:
        if method == "initialize":
            return {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": f"agentrl:{self.env_id}", "version": __version__},
            }
        if method == "ping":
            return {}
        if method == "openenv/session/create":
            created = await self.create()
            await self.reset(created, {k: v for k, v in params.items() if k != "session_id"})
            return {"session_id": created.id}
        if method == "openenv/session/close":
            target = params.get("session_id")
            if not isinstance(target, str) or not target:
                raise _RpcError(JSONRPC_INVALID_PARAMS, "openenv/session/close needs params.session_id")
            if session is not None and target == session.id:
                raise _RpcError(
                    JSONRPC_INVALID_REQUEST, "close this WebSocket's own session by closing the socket"
                )
            return self.state.close_episode(target) | {"session_id": target}
        ep: Episode | None = session or self._session_param(params)
        if method == "tools/list":
            return {"tools": [_mcp_tool(t) for t in (_tools(ep) if ep else await self.probe_tools())]}
        if method == "tools/call":
            return await self._call_tool(ep, params)
        raise _RpcError(
            JSONRPC_METHOD_NOT_FOUND,
            f"method {method!r} not found; this server answers initialize, ping, tools/list, tools/call, "
            "openenv/session/create and openenv/session/close",
        )

    def _session_param(self, params: dict[str, Any]) -> Episode | None:
        sid = params.get("session_id")
        if sid is None:
            return None
        if not isinstance(sid, str):
            raise _RpcError(JSONRPC_INVALID_PARAMS, f"session_id must be a string, got {sid!r:.60}")
        return self.state.get(sid)

    async def _call_tool(self, ep: Episode | None, params: dict[str, Any]) -> dict[str, Any]:
        name, arguments = params.get("name"), params.get("arguments", {})
        if not isinstance(name, str) or not name:
            raise _RpcError(JSONRPC_INVALID_PARAMS, "tools/call needs params.name (a tool from tools/list)")
        if not isinstance(arguments, dict):
            raise _RpcError(JSONRPC_INVALID_PARAMS, "tools/call params.arguments must be an object")
        if ep is None:
            raise _RpcError(
                JSONRPC_INVALID_PARAMS,
                "tools/call runs inside an episode: pass params.session_id (from openenv/session/create), "
                "or send it over the WebSocket /ws after a reset",
            )
        call = ToolCall(
            id=f"call_{secrets.token_hex(4)}",
            function=FunctionCall(name=name, arguments=json.dumps(arguments)),
        )
        message = Message(role="assistant", content=None, tool_calls=[call])
        out = await self.state.step_episode(ep.id, StepRequest(action=message))
        texts = [m.get("content") or "" for m in out["messages"] if m.get("tool_call_id") == call.id]
        others = [m.get("content") or "" for m in out["messages"] if m.get("tool_call_id") != call.id]
        return {
            "content": [{"type": "text", "text": t} for t in texts + others],
            "isError": False,
            "_meta": {
                "reward": out["reward"],
                "done": bool(out["terminated"] or out["truncated"]),
                "terminated": out["terminated"],
                "truncated": out["truncated"],
            },
        }


class _RpcError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _tools(ep: Episode) -> list[dict[str, Any]]:
    return [t.model_dump(exclude_none=True) for t in ep.env.tools]


def _mcp_tool(spec: dict[str, Any]) -> dict[str, Any]:
    fn = spec["function"]
    return {
        "name": fn["name"],
        "description": fn.get("description") or "",
        "inputSchema": fn.get("parameters") or {"type": "object", "properties": {}},
    }


def _reset_request(data: dict[str, Any]) -> ResetRequest:
    """OpenEnv's reset data -> agentrl's: ``seed`` stays, every other key but ``episode_id`` is an option."""
    rest = {k: v for k, v in data.items() if k not in ("seed", "episode_id", "options")}
    options = data.get("options")
    if options is not None and not isinstance(options, dict):
        raise EnvHTTPError(422, f"reset options must be a JSON object, got {type(options).__name__}")
    merged = {**(options or {}), **rest}
    try:
        return ResetRequest(seed=data.get("seed"), options=merged or None)
    except pydantic.ValidationError as e:
        raise EnvHTTPError(422, f"invalid reset: {validation_message(e.errors())[0]}") from None


# ------------------------------------------------------------------ routes
openenv_router = APIRouter(tags=["OpenEnv"])


def _surface(request: Request | WebSocket) -> OpenEnvSurface:
    surface: OpenEnvSurface = request.app.state.openenv
    return surface


@openenv_router.get("/health")
async def openenv_health(request: Request) -> dict[str, Any]:
    st = _surface(request).state
    return {"status": "healthy", "envs": sorted(st.served), "live_episodes": len(st.episodes)}


@openenv_router.get("/metadata")
async def metadata(request: Request) -> dict[str, Any]:
    s = _surface(request)
    return {
        "name": s.spec.id,
        "description": s.spec.description or f"the agentrl env {s.spec.id}",
        "version": __version__,
        "author": None,
        "documentation_url": None,
        "readme_content": None,
    }


@openenv_router.get("/schema")
async def schema() -> dict[str, Any]:
    return {
        "action": OpenEnvAction.model_json_schema(),
        "observation": OpenEnvObservation.model_json_schema(),
        "state": OpenEnvState.model_json_schema(),
    }


class _ResetBody(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    seed: int | None = pydantic.Field(None, ge=0, description="same seed, same episode")
    episode_id: str | None = pydantic.Field(
        None, max_length=255, description="reset this live episode, or start one under this id"
    )


class _StepBody(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    action: dict[str, Any] = pydantic.Field(description="an AgentrlAction (see /schema)")
    episode_id: str | None = pydantic.Field(None, description="the episode_id POST /reset answered")
    timeout_s: float | None = pydantic.Field(
        None, gt=0, description="accepted; the server's deadline applies"
    )


@openenv_router.post("/reset")
async def reset(request: Request, body: _ResetBody | None = None) -> Response:
    s = _surface(request)
    data = (body or _ResetBody()).model_dump(exclude_none=True)
    eid = data.get("episode_id")
    ep = s.state.episodes.get(eid) if eid else None
    if ep is None:
        ep = await s.create(eid)
    return json_response(await s.reset(ep, data))


@openenv_router.post("/step")
async def step(request: Request, body: _StepBody) -> Response:
    s = _surface(request)
    return json_response(await s.step(s.episode(body.episode_id, "POST /step"), body.action))


@openenv_router.get("/state")
async def get_state(request: Request, episode_id: str | None = Query(None)) -> Response:
    s = _surface(request)
    return json_response(s.state_of(s.episode(episode_id, "GET /state")))


@openenv_router.post("/mcp")
async def mcp(request: Request) -> Response:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return json_response(rpc_error(None, JSONRPC_PARSE_ERROR, f"parse error: {e}"))
    answer = await _surface(request).rpc(body)
    if answer is None:
        return Response(status_code=202)
    return json_response(answer)


@openenv_router.websocket("/ws")
async def ws(websocket: WebSocket) -> None:
    """One episode per connection; every frame gets one answer frame, errors included."""
    s = _surface(websocket)
    await websocket.accept()
    attach = websocket.query_params.get("session_id")
    try:
        if attach:  # the episode of an HTTP MCP session (openenv/session/create): shared, not owned
            ep = s.state.get(attach)
            if attach in s.attached:
                raise EnvHTTPError(409, f"session {attach!r} already has a WebSocket attached; one at a time")
            s.attached.add(attach)
        else:
            ep = await s.create()
    except EnvHTTPError as e:
        await _send_error(websocket, e)
        await websocket.close()
        return
    limit = s.state.config.max_body_bytes
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            raw = message.get("text")
            if raw is None:  # a binary frame: JSON in UTF-8 is accepted too
                raw = (message.get("bytes") or b"").decode("utf-8", errors="replace")
            if len(raw) > limit:
                answer = _error_frame(
                    f"frame of {len(raw)} bytes exceeds the limit of {limit} bytes (serve-env --max-body-bytes)",
                    "VALIDATION_ERROR",
                )
            else:
                answer = await _frame(s, ep, raw)
            await websocket.send_text(json_bytes(answer).decode())
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass  # the client went away (mid-answer too): its episode is closed below
    except _Close:
        await websocket.close()
    finally:
        if attach:
            s.attached.discard(attach)  # the session lives on until openenv/session/close (or the TTL)
        elif ep.id in s.state.episodes:
            s.state.close_episode(ep.id)


class _Close(Exception):
    pass


async def _frame(s: OpenEnvSurface, ep: Episode, raw: str) -> dict[str, Any]:
    try:
        msg = json.loads(raw)
    except json.JSONDecodeError as e:
        return _error_frame(f"invalid JSON: {e}", "INVALID_JSON")
    kind = msg.get("type") if isinstance(msg, dict) else None
    data = msg.get("data", {}) if isinstance(msg, dict) else {}
    try:
        if kind == "reset":
            if not isinstance(data, dict):
                raise EnvHTTPError(422, "reset data must be a JSON object")
            return {"type": "observation", "data": await s.reset(ep, data)}
        if kind == "step":
            return {"type": "observation", "data": await s.step(ep, data)}
        if kind == "state":
            return {"type": "state", "data": s.state_of(ep)}
        if kind == "mcp":
            return {"type": "mcp", "data": await s.rpc(data, session=ep) or {}}
        if kind == "close":
            raise _Close
    except EnvHTTPError as e:
        return _error_frame(e.detail, _ws_code(e), e.infra_error)
    except (_Close, asyncio.CancelledError):
        raise
    except Exception as e:  # a bug here must not end the session without an answer
        return _error_frame(
            f"the server failed on this {kind} frame: {type(e).__name__}: {e}", "EXECUTION_ERROR"
        )
    return _error_frame(
        f"unknown message type {kind!r}; send reset, step, state, mcp or close", "UNKNOWN_TYPE"
    )


def _ws_code(e: EnvHTTPError) -> str:
    if e.status == 429:
        return "CAPACITY_REACHED"
    if e.infra_error is not None:
        return "EXECUTION_ERROR"
    if e.status == 422:
        return "VALIDATION_ERROR"
    return "SESSION_ERROR"


def _error_frame(message: str, code: str, infra_error: str | None = None) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code, "infra_error": infra_error}}


async def _send_error(websocket: WebSocket, e: EnvHTTPError) -> None:
    await websocket.send_text(json_bytes(_error_frame(e.detail, _ws_code(e), e.infra_error)).decode())
