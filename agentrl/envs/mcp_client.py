"""The MCP client side of the tool sources: server specs, connections on one background loop, the pool.

:class:`MCPServer` says how to reach a server (a command for stdio, a URL for streamable
HTTP) and how long a connection lives; :class:`MCPConnection` is one live session with it,
opened, called and closed from sync code while it runs on the shared event loop (thread
``agentrl-mcp``) under deadlines; :func:`acquire` / :func:`release` hand connections to
episodes (fresh ones for ``"episode"`` servers, idle ones from the process-wide pool for
``"pooled"`` ones). What the env sees of all this is :mod:`agentrl.envs.mcp_tools`.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import re
import sys
import tempfile
import threading
import weakref
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from agentrl.envs.errors import EnvInfraError
from agentrl.errors import ConfigError, LoopError

if TYPE_CHECKING:
    from mcp import ClientSession, types

__all__ = ["MCPConnection", "MCPServer", "acquire", "close_all", "live_connections", "release"]

T = TypeVar("T")
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


def acquire(server: MCPServer) -> MCPConnection:
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


def release(conn: MCPConnection) -> None:
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
