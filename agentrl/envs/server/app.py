"""The env server: registered environments as stateful HTTP episodes (FastAPI + uvicorn).

Endpoints (JSON; the OpenAPI schema at ``/openapi.json`` describes every body)::

    POST   /episodes                 {"env_id", "kwargs"}          -> 201 {"episode_id", "tools", ...}
    POST   /episodes/{id}/reset      {"seed", "options"}            -> {"messages", "info"}
    POST   /episodes/{id}/step       {"action": Message}            -> {"messages", "reward", "terminated", "truncated", "info"}
    GET    /episodes/{id}            the episode's state
    GET    /episodes/{id}/tools      {"tools": [ToolSpec]}
    POST   /episodes/{id}/oracle     {"action": Message}  (only with expose_oracle: it leaks the answer)
    DELETE /episodes/{id}            close it (idempotent: 404 only for ids never seen)
    /episodes/{id}/mcp               the episode's tools over MCP, streamable HTTP (agentrl.envs.server.mcp)
    GET    /envs  /health  /metrics

Guarantees:

- Env code runs off the event loop: sync ``reset``/``step`` on ``env_threads``
  worker threads (native async ``areset``/``astep`` overrides are awaited), so
  one slow env never stalls the others.
- Every reset/step has a deadline (``step_timeout_s``). Past it the client gets
  504 with ``infra_error: "timeout"``, the episode is marked failed and refuses
  further steps; the server keeps serving. (A sync env stuck in a thread cannot
  be killed; it is abandoned, and its thread is one of the pool's workers.)
- An exception raised by env code answers 422 with ``infra_error: "env_error"``
  naming the exception (a reset with bad options and an env bug look the same
  from here); after a failed step the episode refuses further steps.
- Idle episodes are closed after ``episode_ttl_s``; beyond ``max_episodes`` live
  episodes a create answers 429 with ``Retry-After``.
- Bad input is a 4xx whose ``detail`` names the problem: unknown env (404, with a
  did-you-mean), unknown episode (404), step before reset / after the end (409),
  a concurrent call on the same episode (409), a malformed body or action (422),
  a body over ``max_body_bytes`` (413).

With ``protocol="openenv"`` (or ``"both"``) the server also speaks OpenEnv's protocol for its one
env (:mod:`agentrl.envs.server.openenv`: ``/reset`` ``/step`` ``/state`` ``/schema`` ``/ws`` ``/mcp``).

Layout: :mod:`~agentrl.envs.server.state` holds the episodes and every rule above;
:mod:`~agentrl.envs.server.routes` the FastAPI routes (the OpenAPI schema) and error handlers;
:mod:`~agentrl.envs.server.fastpath` serves ``reset``/``step`` ahead of FastAPI;
:mod:`~agentrl.envs.server.wire` the bodies. This module builds the app and serves it;
:class:`agentrl.httpkit.BackgroundServer` runs it on a thread (tests, notebooks)::

    with BackgroundServer(create_app(ServerConfig(env_ids=["countdown-v0"]))) as srv:
        env = RemoteEnv(srv.url, "countdown-v0")
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI
from starlette.routing import Route

from agentrl.envs.server.config import ServerConfig
from agentrl.envs.server.fastpath import FrontDoor
from agentrl.envs.server.mcp import EpisodeMCP
from agentrl.envs.server.openenv import OPENAPI_VERSION, OpenEnvSurface, openenv_router
from agentrl.envs.server.routes import install_error_handlers, oracle_router, router
from agentrl.envs.server.state import ServerState

__all__ = ["ServerConfig", "create_app", "serve"]


def create_app(config: ServerConfig) -> FastAPI:
    """Build the ASGI app serving ``config.env_ids`` (each must be registered: an unknown id raises now)."""
    state = ServerState(config)
    mcp = EpisodeMCP(state)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=config.env_threads, thread_name_prefix="agentrl-env")
        loop.set_default_executor(executor)
        reaper = asyncio.create_task(state.reap())
        await mcp.start()
        try:
            yield
        finally:
            await mcp.stop()
            reaper.cancel()
            state.shutdown()
            executor.shutdown(wait=False, cancel_futures=True)

    openenv = config.protocol in ("openenv", "both")
    app = FastAPI(
        title="agentrl env server",
        version=OPENAPI_VERSION if openenv else "0.1.0",
        lifespan=lifespan,
        description="Stateful episodes of registered agentrl environments.",
    )
    app.state.agentrl = state
    if openenv:  # first, so its /health (OpenEnv's "healthy") answers in both modes
        app.state.openenv = OpenEnvSurface(state, next(iter(state.served)))
        app.include_router(openenv_router)
    if config.protocol in ("agentrl", "both"):
        app.include_router(router)
    if config.expose_oracle:
        app.include_router(oracle_router)
    install_error_handlers(app)
    app.router.routes.append(Route("/episodes/{episode_id}/mcp", mcp, methods=["GET", "POST", "DELETE"]))
    app.add_middleware(FrontDoor, limit=config.max_body_bytes, state=state)
    return app


def serve(
    config: ServerConfig, host: str = "127.0.0.1", port: int = 8100, log_level: str = "warning"
) -> None:
    """Run the env server in the foreground (uvicorn; uvloop and httptools when installed)."""
    import sys

    import uvicorn

    # A served process spends its time handing work between the event loop and env threads; a
    # shorter GIL switch interval (default 5 ms) cuts the wait at each hand-off under load.
    sys.setswitchinterval(0.001)
    app = create_app(config)
    print(
        f"agentrl env server: serving {config.env_ids} on http://{host}:{port} (docs at /docs; "
        "each episode's tools over MCP at /episodes/{id}/mcp)",
        flush=True,
    )
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        loop="auto",
        http="auto",
        backlog=4096,
        timeout_keep_alive=30,
    )
