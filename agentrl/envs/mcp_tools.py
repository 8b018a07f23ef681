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
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import json
import re
import sys
import tempfile
import threading
import weakref
from collections import Counter
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from agentrl.envs.errors import EnvDefinitionError, EnvInfraError
from agentrl.errors import ConfigError, LoopError
from agentrl.types import FunctionSpec, ToolCall, ToolSpec

if TYPE_CHECKING:
    from mcp import ClientSession, types

__all__ = ["MCPServer", "MCPToolset", "attach", "close_all", "live_connections"]

T = TypeVar("T")
_NAME_OK = re.compile(r"[A-Za-z0-9_-]{1,64}")
_CLOSE_TIMEOUT_S = 10.0  # the SDK gives a stdio server 2 s to exit on EOF, then terminates it


@dataclass(frozen=True)
class MCPServer:
    """One MCP server an env takes tools from: a stdio ``command`` or a streamable-HTTP ``url``."""

    command: Sequence[str] | None = None
    """Program and arguments of a stdio server, e.g. ``[sys.executable, "-m", "pkg.server"]``."""
    url: str | None = None
    """Endpoint of a streamable-HTTP server, e.g. ``http://127.0.0.1:9000/mcp``."""
    env: dict[str, str] | None = field(default=None, hash=False)
    """Extra environment variables of a stdio server (added to the SDK's safe default set)."""
    cwd: str | None = None
    """Working directory of a stdio server."""
    headers: dict[str, str] | None = field(default=None, hash=False)
    """HTTP headers sent with every request to a ``url`` server (an auth token, a session header)."""
    prefix: str = ""
    """Put in front of every tool name of this server (to tell apart two servers' tools)."""
    lifetime: Literal["episode", "pooled"] = "episode"
    """``episode``: a fresh server per episode; ``pooled``: connections reused across episodes."""
    connect_timeout_s: float = 30.0
    """Deadline to start the server, ``initialize`` and ``tools/list``."""
    call_timeout_s: float = 30.0
    """Deadline of one ``tools/call``; past it the episode fails as an infrastructure error."""

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ConfigError(
                f"MCPServer needs exactly one of command=[...] (stdio) or url='http://...' (streamable "
                f"HTTP), got command={self.command!r}, url={self.url!r}"
            )
        if self.command is not None:
            if (
                isinstance(self.command, str)
                or not self.command
                or not all(isinstance(c, str) for c in self.command)
            ):
                raise ConfigError(
                    f"MCPServer command must be a non-empty list of strings (program, *args), got "
                    f"{self.command!r}; e.g. command=[sys.executable, 'server.py']"
                )
            object.__setattr__(self, "command", tuple(self.command))
        if self.url is not None and not re.match(r"https?://", self.url):
            raise ConfigError(f"MCPServer url must start with http:// or https://, got {self.url!r}")
        if self.headers is not None and self.url is None:
            raise ConfigError("MCPServer headers go with url=...; a stdio server takes env={...} instead")
        if self.lifetime not in ("episode", "pooled"):
            raise ConfigError(f"MCPServer lifetime must be 'episode' or 'pooled', got {self.lifetime!r}")
        if self.prefix and not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", self.prefix):
            raise ConfigError(f"MCPServer prefix must match [A-Za-z0-9_-]{{1,32}}, got {self.prefix!r}")
        for name in ("connect_timeout_s", "call_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ConfigError(f"MCPServer {name} must be > 0 seconds, got {value!r}")

    @property
    def label(self) -> str:
        """How messages name this server: its URL, or its command line."""
        return self.url or " ".join(self.command or ())


# ------------------------------------------------------------------ the background loop
class _Loop:
    """The event loop every MCP connection of this process lives on (a daemon thread)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="agentrl-mcp", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run ``coro`` on the loop and wait for it; past ``timeout_s`` it is cancelled (TimeoutError)."""
        if threading.current_thread() is self.thread:
            coro.close()
            raise LoopError("an MCP call was made from the MCP loop itself; it would wait for itself")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError from None


_loop_lock = threading.Lock()
_the_loop: _Loop | None = None


def _background() -> _Loop:
    global _the_loop
    with _loop_lock:
        if _the_loop is None:
            _the_loop = _Loop()
        return _the_loop


# ------------------------------------------------------------------ one connection
def _infra_code(e: BaseException) -> bool:
    """Whether an error from the SDK means the server is gone or silent (not an answer from it)."""
    from mcp import McpError
    from mcp.types import CONNECTION_CLOSED

    if isinstance(e, McpError):
        return e.error.code in (CONNECTION_CLOSED, 408)  # 408: the SDK's read timeout
    return True


class MCPConnection:
    """An initialized client session with one server, owned by one episode at a time."""

    def __init__(self, server: MCPServer) -> None:
        self.server = server
        self.session: ClientSession | None = None
        self.tools: list[types.Tool] = []
        self.broken: str | None = None  # why it may not be used again
        self.used = False  # an episode ran on it (an "episode"-lifetime connection is not reused)
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        # a stdio server's stderr, kept to quote in errors; closed with the connection
        self._stderr = tempfile.TemporaryFile(mode="w+") if server.command else None  # noqa: SIM115

    # -- on the loop
    async def _main(self, ready: asyncio.Future[None]) -> None:
        from mcp import ClientSession

        self._stop = asyncio.Event()
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await self._transport(stack)
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                tools: list[types.Tool] = []
                cursor: str | None = None
                while True:  # tools/list is paginated
                    page = await session.list_tools(cursor)
                    tools += page.tools
                    cursor = page.nextCursor
                    if not cursor:
                        break
                self.session, self.tools = session, tools
                ready.set_result(None)
                await self._stop.wait()
        except asyncio.CancelledError:
            if not ready.done():
                ready.cancel()
            raise
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on it, or recorded
            if not ready.done():
                ready.set_exception(e)
            else:
                self.broken = self.broken or _describe(e)
        finally:
            self.session = None
            self.broken = self.broken or "closed"

    async def _transport(self, stack: contextlib.AsyncExitStack) -> tuple[Any, Any]:
        s = self.server
        if s.command is not None:
            from mcp import StdioServerParameters
            from mcp.client.stdio import stdio_client

            params = StdioServerParameters(
                command=s.command[0], args=list(s.command[1:]), env=s.env, cwd=s.cwd
            )
            errlog = self._stderr if self._stderr is not None else sys.stderr
            read, write = await stack.enter_async_context(stdio_client(params, errlog=errlog))
            return read, write
        import httpx
        from mcp.client.streamable_http import streamable_http_client

        # connect/write deadlines from the server config; reads are bounded per call by call_timeout_s
        timeout = httpx.Timeout(s.connect_timeout_s, read=s.call_timeout_s + 5)
        client = await stack.enter_async_context(httpx.AsyncClient(timeout=timeout, headers=s.headers))
        read, write, _ = await stack.enter_async_context(
            streamable_http_client(s.url or "", http_client=client)
        )
        return read, write

    async def _call(
        self, session: ClientSession, name: str, arguments: dict[str, Any]
    ) -> types.CallToolResult:
        """``tools/call``, cut short when the connection's task ends (an HTTP transport that lost its
        server ends it without answering the calls in flight)."""
        deadline = timedelta(seconds=self.server.call_timeout_s)
        call = asyncio.ensure_future(session.call_tool(name, arguments, read_timeout_seconds=deadline))
        try:
            assert self._task is not None
            await asyncio.wait({call, self._task}, return_when=asyncio.FIRST_COMPLETED)
            if call.done():
                return call.result()
            raise ConnectionError(f"the connection ended ({self.broken or 'closed'})")
        finally:
            if not call.done():
                call.cancel()

    async def _start(self) -> None:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._main(ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.server.connect_timeout_s)
        except BaseException:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._task, _CLOSE_TIMEOUT_S)
            raise

    async def _finish(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), _CLOSE_TIMEOUT_S)
            except TimeoutError:
                self._task.cancel()

    # -- from any thread
    def open(self) -> MCPConnection:
        """Start the server (stdio) or session (HTTP), ``initialize`` and list its tools, under the deadline."""
        s = self.server
        try:
            _background().run(self._start(), s.connect_timeout_s + _CLOSE_TIMEOUT_S)
        except TimeoutError:
            tail = self._discard()
            raise EnvInfraError(
                f"MCP server {s.label!r} did not start and list its tools within connect_timeout_s="
                f"{s.connect_timeout_s:g} s{tail}"
            ) from None
        except Exception as e:
            tail = self._discard()
            raise EnvInfraError(
                f"MCP server {s.label!r} could not be started: {_describe(e)}{tail}"
            ) from None
        _live.add(self)
        return self

    def call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """``tools/call``; raises EnvInfraError when the server is gone or silent, McpError when it refused."""
        s, session = self.server, self.session
        if self.broken or session is None:
            raise EnvInfraError(f"MCP server {s.label!r} is not connected ({self.broken or 'closed'})")
        try:
            return _background().run(self._call(session, name, arguments), s.call_timeout_s + 5)
        except Exception as e:
            if not _infra_code(e):
                raise  # an McpError answered by a live server: the model's call was refused
            self.broken = f"tools/call {name!r} failed: {_describe(e)}"
            tail = self._stderr_tail()
            self.close()
            raise EnvInfraError(
                f"MCP server {s.label!r}: tools/call {name!r} failed ({_describe(e)}); the server is "
                f"discarded and the episode must be retried{tail}"
            ) from None

    def alive(self) -> bool:
        """Whether the server answers a ``ping`` within 5 s (checked before a pooled connection is reused)."""
        session = self.session
        if self.broken or session is None:
            return False
        try:
            _background().run(session.send_ping(), 5.0)
        except Exception:
            self.broken = "did not answer a ping"
            return False
        return True

    def close(self) -> None:
        """Stop the session (and the stdio server process); idempotent, bounded by a deadline."""
        _live.discard(self)
        self.broken = self.broken or "closed"
        if self._task is not None and not self._task.done():
            with contextlib.suppress(Exception):
                _background().run(self._finish(), _CLOSE_TIMEOUT_S + 1)
        if self._stderr is not None:
            with contextlib.suppress(Exception):
                self._stderr.close()
            self._stderr = None

    def _discard(self) -> str:
        """Forget a connection that never opened; returns the tail of its stderr for the message."""
        self.broken = self.broken or "failed to start"
        tail = self._stderr_tail()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        return tail

    def _stderr_tail(self) -> str:
        if self._stderr is None or self._stderr.closed:
            return ""
        with contextlib.suppress(Exception):
            self._stderr.seek(0)
            tail = self._stderr.read()[-600:].strip()
            if tail:
                return f"; its stderr ends with: {tail}"
        return ""


def _describe(e: BaseException) -> str:
    if isinstance(e, BaseExceptionGroup) and e.exceptions:  # anyio task groups wrap the cause
        return _describe(e.exceptions[0])
    text = str(e) or "(no message)"
    return f"{type(e).__name__}: {text}"


# ------------------------------------------------------------------ registry and pool
_live: weakref.WeakSet[MCPConnection] = weakref.WeakSet()
_pool: dict[MCPServer, list[MCPConnection]] = {}
_pool_lock = threading.Lock()


def live_connections() -> int:
    """How many MCP connections (stdio processes, HTTP sessions) this process holds open, pooled ones included."""
    return len(_live)


def _acquire(server: MCPServer) -> MCPConnection:
    while server.lifetime == "pooled":  # the most recently used first; one that died idle is dropped
        with _pool_lock:
            idle = _pool.get(server)
            conn = idle.pop() if idle else None
        if conn is None:
            break
        if conn.alive():
            return conn
        conn.close()
    return MCPConnection(server).open()


def _release(conn: MCPConnection) -> None:
    if conn.server.lifetime == "pooled" and not conn.broken:
        with _pool_lock:
            _pool.setdefault(conn.server, []).append(conn)
        return
    conn.close()


def close_all() -> None:
    """Close every MCP connection of this process, pooled ones included (runs at interpreter exit)."""
    with _pool_lock:
        _pool.clear()
    for conn in list(_live):
        conn.close()


atexit.register(close_all)


# ------------------------------------------------------------------ the env's tool set
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
                    self.conns[i] = _acquire(server)
                    changed = True
            if changed or not self.routes:
                self._route()

    def begin_episode(self) -> None:
        """At ``reset``: an ``episode``-lifetime server that served an episode is replaced by a fresh one."""
        with self._lock:
            for i, conn in enumerate(self.conns):
                if conn is not None and (conn.broken or (conn.used and conn.server.lifetime == "episode")):
                    _release(conn)
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
                _release(conn)

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
