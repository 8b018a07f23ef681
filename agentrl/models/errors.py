"""Errors of agentrl.models: unknown model names, corrupt caches, failed builds.

::

    AgentRLError
    └── ModelError               unknown model name, a build that failed, an unreadable model directory
"""

from __future__ import annotations

from agentrl.errors import AgentRLError

__all__ = ["ModelError"]


class ModelError(AgentRLError):
    """A model name could not be resolved, built or loaded."""
