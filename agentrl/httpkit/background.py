"""Any ASGI app served by uvicorn in this process: on a background thread, or on a given event loop.

::

    with BackgroundServer(create_app(...)) as srv:
        httpx.get(srv.url + "/health")

The socket is bound in the constructor (``port=0`` picks a free port), so ``url`` is known
before the server starts and no other process can take the port in between. ``start`` (or
``with``) returns once uvicorn serves, running the app's lifespan (the env server's reaper and
worker threads start there); a server that dies or is not serving within ``start_timeout_s``
raises :class:`~agentrl.errors.ServerStartError` naming it. ``stop`` runs the lifespan's
shutdown and waits for the server under a deadline.

By default the server gets a daemon thread of its own (tests, notebooks, examples,
benchmarks). Given ``loop`` (anything with ``submit(coroutine) -> concurrent.futures.Future``,
e.g. :class:`~agentrl.eventloop.LoopThread`), it serves as a task on that loop instead, beside
the code that shares its objects (the trainer's agent gateway,
:class:`~agentrl.session.embedded.EmbeddedGateway`). A server in another process is started
by its CLI command (``agentrl serve-env``, ``serve-session``, ``serve-engine``); see
:func:`agentrl.engines.launcher.launch_server`.
"""

from __future__ import annotations

import concurrent.futures
import socket
import threading
import time
from collections.abc import Coroutine
from typing import Any, Literal, Protocol

from agentrl.errors import ServerStartError

__all__ = ["BackgroundServer"]


class _Loop(Protocol):
    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]: ...


class BackgroundServer:
    """Serve ``app`` on ``host:port`` until :meth:`stop` (see the module docstring).

    ``lifespan`` is uvicorn's (``"auto"``, ``"on"``, ``"off"``).
    """

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        name: str = "agentrl server",
        start_timeout_s: float = 30.0,
        loop: _Loop | None = None,
        lifespan: Literal["auto", "on", "off"] = "auto",
    ) -> None:
        import uvicorn

        self.app, self.name, self.start_timeout_s = app, name, start_timeout_s
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as e:
            self._sock.close()
            raise ServerStartError(f"{name}: cannot bind {host}:{port}: {e} (is the port in use?)") from None
        self.host, self.port = host, int(self._sock.getsockname()[1])
        self._server = uvicorn.Server(
            uvicorn.Config(
                app, log_level="warning", access_log=False, timeout_keep_alive=30, lifespan=lifespan
            )
        )
        self._loop = loop
        self._task: concurrent.futures.Future[Any] | None = None
        self._thread: threading.Thread | None = None
        if loop is None:
            self._thread = threading.Thread(
                target=self._server.run, kwargs={"sockets": [self._sock]}, name=name, daemon=True
            )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _running(self) -> bool:
        if self._thread is not None:
            return self._thread.is_alive()
        return self._task is not None and not self._task.done()

    def start(self) -> BackgroundServer:
        if self._thread is not None:
            self._thread.start()
        else:
            assert self._loop is not None
            self._task = self._loop.submit(self._server.serve(sockets=[self._sock]))
        deadline = time.monotonic() + self.start_timeout_s
        while not self._server.started:
            if not self._running() or time.monotonic() > deadline:
                why = (
                    f"did not start within {self.start_timeout_s:g} s"
                    if self._running()
                    else "exited before it started"
                )
                self.stop()
                raise ServerStartError(f"{self.name} on {self.url} {why}; see the server log on stderr")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Ask uvicorn to exit (it finishes the lifespan shutdown) and wait up to ``timeout`` s (idempotent)."""
        self._server.should_exit = True
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout)
        if self._task is not None and not self._task.done():
            try:
                self._task.result(timeout=timeout)
            except Exception:  # noqa: BLE001 - stopping: a server that will not exit is cancelled
                self._task.cancel()
        self._sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
