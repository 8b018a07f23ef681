"""MCP out: each episode's tools served over MCP (streamable HTTP) at ``/episodes/{id}/mcp``.

An agent that speaks MCP instead of agentrl's step protocol plays an episode like this::

    POST /episodes {"env_id": "calculator-v0"}        -> episode_id      (agentrl's HTTP routes)
    POST /episodes/{id}/reset {"seed": 7}               -> the prompt
    MCP  http://HOST/episodes/{id}/mcp                  tools/list, tools/call (any MCP client)
    POST /episodes/{id}/step {"action": {...}}          the final answer, scored by the env

What maps to what:

- ``tools/list`` → the episode's ``env.tools``: name, description, and the parameters' JSON
  Schema as ``inputSchema``.
- ``tools/call`` → one env step: an assistant message with that single tool call (id
  ``mcp-<n>``, arguments as JSON). It counts as a turn against ``max_turns``, exactly as the same
  call sent to ``/step`` would; the env sees it, and its reward is the episode's like any other
  step. The step's messages come back as text content (the tool's reply first; any other message
  the env appended as ``<role>: <content>``). ``isError`` is set when the env counted the call as a
  tool error (``info["tool_errors"]`` grew). ``_meta`` carries ``agentrl/reward``,
  ``agentrl/terminated``, ``agentrl/truncated`` and ``agentrl/turn``; once an episode is over,
  further calls are refused.
- what cannot go through MCP: the reset (the prompt) and the final answer (a message without
  tool calls) stay on the agentrl routes; MCP has no notion of either.

Errors: an unknown episode answers HTTP 404 (the env server's ``{"detail"}`` body) before any MCP
handling. A call the server refuses (before reset, after the end, a concurrent call on the same
episode, a failed episode) and an infrastructure failure of the step (its deadline passed, the env
raised) answer a JSON-RPC error whose ``data`` holds the HTTP ``status`` and ``infra_error`` the
step route would have answered; the episode is marked exactly as there.

The endpoint is stateless (no MCP session id: every request is scoped by its URL, and nothing
outlives it), so one server process serves any number of episodes' MCP clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from typing import TYPE_CHECKING, Any

from agentrl.envs.server.state import ServerState
from agentrl.envs.server.wire import EnvHTTPError, StepRequest, error_payload, json_bytes
from agentrl.types import FunctionCall, Message, ToolCall

if TYPE_CHECKING:
    from mcp import types

__all__ = ["EpisodeMCP"]

_JSONRPC_CODE = {404: -32602, 409: -32600, 422: -32603, 504: -32603}


class EpisodeMCP:
    """The ASGI endpoint of ``/episodes/{episode_id}/mcp`` and its MCP server (one for all episodes)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.ids = itertools.count()
        self.manager: Any = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.available = True
        try:
            self._build()
        except ImportError:  # the mcp SDK is an extra: the route then says how to get it
            self.available = False

    def _build(self) -> None:
        from mcp import types
        from mcp.server.lowlevel import Server
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

        server: Server[Any, Any] = Server("agentrl-env-server")
        # raw handlers: each episode has its own tools, so the SDK's per-server tool cache is bypassed
        server.request_handlers[types.ListToolsRequest] = self._list_tools
        server.request_handlers[types.CallToolRequest] = self._call_tool
        self.server = server
        self.manager = StreamableHTTPSessionManager(server, json_response=True, stateless=True)

    # ------------------------------------------------------------ lifecycle (the app's lifespan)
    async def start(self) -> None:
        if self.available:
            started = asyncio.get_running_loop().create_future()
            self._task = asyncio.create_task(self._run(started))
            await started

    async def _run(self, started: asyncio.Future[None]) -> None:
        async with self.manager.run():
            started.set_result(None)
            await self._stop.wait()

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._task, 5.0)

    # ------------------------------------------------------------ ASGI
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        episode_id = scope.get("path_params", {}).get("episode_id", "")
        try:
            if not self.available:
                raise EnvHTTPError(
                    501,
                    "this env server has no MCP support: install the mcp SDK (pip install 'agentrl[mcp]')",
                )
            self.state.get(episode_id)  # 404 for an unknown or closed episode, before any MCP handling
        except EnvHTTPError as e:
            self.state.counters[f"http_{e.status}"] += 1
            body = json_bytes(error_payload(e.detail, e.infra_error))
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": e.status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        self.state.counters["mcp_requests"] += 1
        await self.manager.handle_request(scope, receive, send)

    # ------------------------------------------------------------ MCP handlers
    def _episode_id(self) -> str:
        request = self.server.request_context.request
        return str(request.path_params["episode_id"]) if request is not None else ""

    def _episode(self) -> Any:
        from mcp import McpError, types

        try:
            return self.state.get(self._episode_id())
        except EnvHTTPError as e:  # closed between the HTTP check and this message
            raise McpError(types.ErrorData(code=types.INVALID_PARAMS, message=e.detail)) from None

    async def _list_tools(self, req: types.ListToolsRequest) -> types.ServerResult:
        from mcp import McpError, types

        ep = self._episode()
        timeout_s = self.state.config.step_timeout_s
        try:  # an MCP-backed env may connect here: off the loop, under the step deadline
            specs = await asyncio.wait_for(asyncio.to_thread(lambda: ep.env.tools), timeout_s)
        except Exception as e:
            message = f"episode {ep.id!r}: listing its tools failed: {type(e).__name__}: {e}"
            if isinstance(e, TimeoutError):
                message = f"episode {ep.id!r}: listing its tools exceeded the {timeout_s:g} s deadline"
            data = {"status": 504 if isinstance(e, TimeoutError) else 422, "infra_error": "env_error"}
            raise McpError(types.ErrorData(code=types.INTERNAL_ERROR, message=message, data=data)) from None
        tools = [
            types.Tool(
                name=s.function.name,
                description=s.function.description or None,
                inputSchema=s.function.parameters or {"type": "object", "properties": {}},
            )
            for s in specs
        ]
        return types.ServerResult(types.ListToolsResult(tools=tools))

    async def _call_tool(self, req: types.CallToolRequest) -> types.ServerResult:
        from mcp import McpError, types

        ep = self._episode()
        name, arguments = req.params.name, req.params.arguments or {}
        call = ToolCall(
            id=f"mcp-{next(self.ids)}", function=FunctionCall(name=name, arguments=json.dumps(arguments))
        )
        errors_before = getattr(ep.env, "tool_errors", None)
        try:
            out = await self.state.step_episode(
                ep.id, StepRequest(action=Message(role="assistant", tool_calls=[call]))
            )
        except EnvHTTPError as e:
            self.state.counters["mcp_call_errors"] += 1
            code = _JSONRPC_CODE.get(e.status, types.INTERNAL_ERROR)
            data = {"status": e.status, "infra_error": e.infra_error}
            raise McpError(types.ErrorData(code=code, message=e.detail, data=data)) from None
        self.state.counters["mcp_tool_calls"] += 1
        info = out["info"]
        errors_after = info.get("tool_errors")
        is_error = (
            isinstance(errors_before, int) and isinstance(errors_after, int) and errors_after > errors_before
        )
        replies = [m for m in out["messages"] if m.get("tool_call_id") == call.id]
        others = [m for m in out["messages"] if m.get("tool_call_id") != call.id]
        texts = [str(m.get("content") or "") for m in replies]
        texts += [f"{m.get('role')}: {m.get('content') or ''}" for m in others]
        result = types.CallToolResult(
            content=[types.TextContent(type="text", text=t) for t in texts],
            isError=is_error,
            _meta={
                "agentrl/reward": out["reward"],
                "agentrl/terminated": out["terminated"],
                "agentrl/truncated": out["truncated"],
                "agentrl/turn": info.get("turn"),
            },
        )
        return types.ServerResult(result)
