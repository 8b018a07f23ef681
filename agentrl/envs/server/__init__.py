"""The env server: registered environments served as HTTP episodes, in agentrl's protocol and OpenEnv's.

::

    from agentrl.envs.server import ServerConfig, create_app, serve

    serve(ServerConfig(env_ids=["countdown-v0"], port=8000))     # or: agentrl serve-env countdown-v0

Modules: ``app`` (``create_app``, ``serve``), ``routes`` / ``fastpath`` / ``state`` / ``wire``
(agentrl's protocol), ``config``, ``workers`` (env code off the event loop), ``openenv`` and
``openenv_wire`` (OpenEnv's protocol), ``mcp`` (an episode's tools over MCP), ``images``
(one Docker image per env). The clients are in :mod:`agentrl.envs.remote`.
"""

from __future__ import annotations

from agentrl.envs.server.app import create_app, serve
from agentrl.envs.server.config import ServerConfig

__all__ = ["ServerConfig", "create_app", "serve"]
