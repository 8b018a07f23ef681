"""Any ASGI app served by uvicorn on a background thread: tests, notebooks, examples, benchmarks.

::

    with BackgroundServer(create_app(...)) as srv:
        httpx.get(srv.url + "/health")

The socket is bound in the constructor (``port=0`` picks a free port), so ``url`` is known
before the server starts and no other process can take the port in between. ``start`` (or
``with``) returns once uvicorn serves, running the app's lifespan (the env server's reaper and
worker threads start there); a server that dies or is not serving within ``start_timeout_s``
raises :class:`~agentrl.errors.ServerStartError` naming it. ``stop`` runs the lifespan's
shutdown and joins the thread under a deadline. A server in another process is started by its
CLI command (``agentrl serve-env``, ``serve-session``, ``serve-engine``); see
:func:`agentrl.engines.launcher.launch_server`.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from agentrl.errors import ServerStartError

__all__ = ["BackgroundServer"]


class BackgroundServer:
    """Serve ``app`` on ``host:port`` from a daemon thread until :meth:`stop` (see the module docstring)."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        name: str = "agentrl server",
        start_timeout_s: float = 30.0,
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
            uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=30)
        )
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name=name, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                why = (
                    f"did not start within {self.start_timeout_s:g} s"
                    if self._thread.is_alive()
                    else "exited before it started"
                )
                self.stop()
                raise ServerStartError(f"{self.name} on {self.url} {why}; see the server log on stderr")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Ask uvicorn to exit (it finishes the lifespan shutdown) and wait up to ``timeout`` s."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
