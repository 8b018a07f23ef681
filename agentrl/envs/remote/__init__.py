"""Clients of env servers: an episode on a server, used like a local :class:`~agentrl.envs.Env`.

``RemoteEnv`` speaks agentrl's protocol (:mod:`agentrl.envs.remote.client`, through agentrl's one
HTTP client, :class:`agentrl.httpkit.HTTPClient`, on its lean HTTP/1.1 transport); ``OpenEnvRemoteEnv`` speaks OpenEnv's
(:mod:`agentrl.envs.remote.openenv`). Both are re-exported by :mod:`agentrl.envs` (loaded on first use).
"""

from __future__ import annotations

from agentrl.envs.remote.client import RemoteEnv
from agentrl.envs.remote.openenv import OpenEnvRemoteEnv

__all__ = ["OpenEnvRemoteEnv", "RemoteEnv"]
