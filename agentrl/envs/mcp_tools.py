"""MCP tool sources: a :class:`~agentrl.envs.tools.ToolEnv` whose tools come from MCP servers.

An env names its servers and gets their tools::

    class Shop(ToolEnv):
        mcp_servers = [MCPServer(command=[sys.executable, "-m", "my_pkg.shop_server"])]
        # or MCPServer(url="http://127.0.0.1:9000/mcp") for a streamable-HTTP server

What maps to what:

- ``tools/list`` → the env's ``tools`` (``ToolSpec``: name, description, ``inputSchema`` as the
  parameters), next to its ``@tool`` methods. A name OpenAI refuses (``[A-Za-z0-9_-]{1,64}``) is
  rewritten (other characters become ``_``); ``prefix`` namespaces a server's tools; a clash
  with another tool is an :class:`EnvDefinitionError` at connect time.
- an assistant tool call → ``tools/call`` with the parsed JSON arguments (the server validates
  them against its schema) → one ``role="tool"`` message. Text content is joined with newlines;
  structured content without text is sent as JSON; images, audio and binary resources cannot
  travel in a text message and are replaced by a ``[... not shown]`` note, counted in
  ``info["mcp_content_dropped"]``.
- ``isError: true``, or a JSON-RPC error answered by a live server (unknown tool, bad arguments),
  is the model's error: an ``error: ...`` tool message, counted in ``info["tool_errors"]``.
- a server that cannot be started, does not answer within ``call_timeout_s``, or dies (closed
  pipe, refused connection) is an infrastructure failure: :class:`EnvInfraError` leaves ``step``,
  the episode is aborted and retried on a fresh env, never scored; the connection is discarded.

Lifetime (``MCPServer.lifetime``): ``"episode"`` starts a fresh server (or HTTP session) at every
``reset`` and stops it at the next ``reset`` or ``close`` (state cannot leak between episodes);
``"pooled"`` keeps idle connections in a process-wide pool and hands one to each episode (for
stateless servers: one process serves many episodes, one episode at a time). A connection is
released on ``env.close()``, when the env is garbage-collected, and at interpreter exit; a stdio
server whose parent dies sees its stdin close and exits. :func:`live_connections` counts open ones.

The SDK is async; env steps are sync and run in worker threads. Every connection lives on one
background event loop (thread ``agentrl-mcp``) and a step waits for its call there under a
deadline, so steps of many episodes share the loop without blocking each other or the caller's loop.
That client side (server specs, connections, the pool) is :mod:`agentrl.envs.mcp_client`; this
module is the env's tool set over it.
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrl.envs.errors import EnvDefinitionError
from agentrl.envs.mcp_client import MCPConnection, MCPServer, acquire, close_all, live_connections, release
from agentrl.types import FunctionSpec, ToolCall, ToolSpec

if TYPE_CHECKING:
    from mcp import types

__all__ = ["MCPServer", "MCPToolset", "attach", "close_all", "live_connections"]

_NAME_OK = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _exposed_name(server: MCPServer, name: str) -> str:
    if _NAME_OK.fullmatch(server.prefix + name):
        return server.prefix + name
    return (server.prefix + re.sub(r"[^A-Za-z0-9_-]", "_", name))[:64] or "_"


@dataclass
class _Route:
    index: int  # which server
    name: str  # the tool's name on that server
    spec: ToolSpec


class MCPToolset:
    """The MCP tools of one env instance: its servers' connections and the name → server routes.

    ``reserved`` are the env's own ``@tool`` names (an MCP tool may not shadow one). Used by
    :class:`~agentrl.envs.tools.ToolEnv`; all methods are sync and safe to call from worker threads.
    """

    def __init__(self, servers: Sequence[MCPServer], reserved: set[str], env_name: str) -> None:
        bad = [s for s in servers if not isinstance(s, MCPServer)]
        if bad:
            raise EnvDefinitionError(
                f"{env_name}.mcp_servers must hold MCPServer(...) entries, got {bad[0]!r}; "
                "e.g. mcp_servers = [MCPServer(command=[sys.executable, 'server.py'])]"
            )
        self.servers, self.reserved, self.env_name = list(servers), reserved, env_name
        self.conns: list[MCPConnection | None] = [None] * len(self.servers)
        self.routes: dict[str, _Route] = {}
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    @property
    def specs(self) -> list[ToolSpec]:
        if not self.routes:  # connects once; a broken connection is replaced at the next reset, not here
            self.connect()
        return [r.spec for r in self.routes.values()]

    def connect(self) -> None:
        """Make sure every server has a healthy connection (opening the missing ones)."""
        with self._lock:
            changed = False
            for i, server in enumerate(self.servers):
                conn = self.conns[i]
                if conn is None or conn.broken:
                    self.conns[i] = None
                    self.conns[i] = acquire(server)
                    changed = True
            if changed or not self.routes:
                self._route()

    def begin_episode(self) -> None:
        """At ``reset``: an ``episode``-lifetime server that served an episode is replaced by a fresh one."""
        with self._lock:
            for i, conn in enumerate(self.conns):
                if conn is not None and (conn.broken or (conn.used and conn.server.lifetime == "episode")):
                    release(conn)
                    self.conns[i] = None
        self.connect()
        for conn in self.conns:
            if conn is not None:
                conn.used = True
        self.counts.clear()

    def close(self) -> None:
        """Give every connection back (an ``episode`` one is stopped, a healthy ``pooled`` one returns)."""
        with self._lock:
            conns, self.conns = self.conns, [None] * len(self.servers)
        for conn in conns:
            if conn is not None:
                release(conn)

    def _route(self) -> None:
        routes: dict[str, _Route] = {}
        for i, conn in enumerate(self.conns):
            assert conn is not None
            for t in conn.tools:
                exposed = _exposed_name(conn.server, t.name)
                clash = exposed in self.reserved or exposed in routes
                if clash:
                    where = "a @tool method" if exposed in self.reserved else "another MCP tool"
                    raise EnvDefinitionError(
                        f"{self.env_name}: MCP tool {t.name!r} of {conn.server.label!r} is exposed as "
                        f"{exposed!r}, which {where} already uses; give the server a prefix "
                        "(MCPServer(..., prefix='name_'))"
                    )
                schema = dict(t.inputSchema or {}) or {"type": "object", "properties": {}}
                spec = ToolSpec(
                    function=FunctionSpec(name=exposed, description=t.description or "", parameters=schema)
                )
                routes[exposed] = _Route(i, t.name, spec)
        self.routes = routes

    def call(self, call: ToolCall) -> tuple[str, bool]:
        """Run one tool call: ``(content, is_error)``; EnvInfraError when the server failed."""
        route = self.routes[call.function.name]
        try:
            arguments = json.loads(call.function.arguments or "{}")
        except json.JSONDecodeError as e:
            return f"arguments are not valid JSON ({e.msg} at char {e.pos})", True
        if not isinstance(arguments, dict):
            return f"arguments must be a JSON object, got {type(arguments).__name__}", True
        conn = self.conns[route.index]
        if conn is None:
            self.connect()
            conn = self.conns[route.index]
            assert conn is not None
        from mcp import McpError

        try:
            result = conn.call(route.name, arguments)
        except McpError as e:  # a live server refused the call (unknown tool, invalid params)
            return f"MCP error {e.error.code}: {e.error.message}", True
        text = self._text(result)
        return text, bool(result.isError)

    def _text(self, result: types.CallToolResult) -> str:
        from mcp import types

        parts: list[str] = []
        for block in result.content:
            if isinstance(block, types.TextContent):
                parts.append(block.text)
            elif isinstance(block, types.EmbeddedResource) and isinstance(
                block.resource, types.TextResourceContents
            ):
                parts.append(block.resource.text)
            elif isinstance(block, types.ResourceLink):
                parts.append(f"[resource {block.uri}]")
            else:
                mime = getattr(block, "mimeType", None) or getattr(
                    getattr(block, "resource", None), "mimeType", None
                )
                parts.append(
                    f"[{block.type} content ({mime or 'unknown type'}) not shown: tool messages are text]"
                )
                self.counts["mcp_content_dropped"] += 1
        if not parts and result.structuredContent is not None:
            parts.append(json.dumps(result.structuredContent))
        return "\n".join(parts)


def attach(env: Any, servers: Sequence[MCPServer], reserved: set[str]) -> MCPToolset:
    """The tool set of ``env`` (a ToolEnv); its connections are given back when ``env`` is collected."""
    name = type(env).__name__
    if getattr(env, "inline_steps", False):
        raise EnvDefinitionError(
            f"{name} sets inline_steps = True and has mcp_servers; an MCP call waits on a server, "
            "so its steps must run in worker threads: remove inline_steps"
        )
    toolset = MCPToolset(servers, reserved, name)
    weakref.finalize(env, toolset.close)
    return toolset
