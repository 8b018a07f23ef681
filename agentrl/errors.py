"""The root of agentrl's exception tree.

Every error agentrl raises on purpose derives from :class:`AgentRLError`, so a
caller can catch the whole family with one clause. Each subpackage adds its own
branch in its ``errors.py``::

    AgentRLError
    ├── ConfigError              bad option, flag or config file (fail fast, before heavy work)
    ├── ModelError               (agentrl.models) unknown model name, corrupt cache, failed build
    ├── EnvError                 (agentrl.envs) registry, contract and env-server failures
    ├── SandboxError             (agentrl.envs.sandbox) backend unavailable, limits, bad input
    ├── EngineError              (agentrl.engines) bad request, engine failure, deadline
    ├── SessionError             (agentrl.session) template, divergence, unknown session
    └── TrainerError             (agentrl.trainer) rollout, backend, checkpoint failures

Messages say what failed, the value seen, and how to fix it.
"""

from __future__ import annotations

__all__ = ["AgentRLError", "ConfigError"]


class AgentRLError(Exception):
    """Base class of every error agentrl raises deliberately."""


class ConfigError(AgentRLError, ValueError):
    """An option, flag or config file is invalid; raised before any heavy work starts."""
