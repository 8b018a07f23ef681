"""Errors of the rollout store.

::

    AgentRLError
    └── RolloutStoreError          a run directory without a store, a half-written or foreign file
        └── RolloutSchemaError     a file written under another SCHEMA_VERSION
"""

from __future__ import annotations

from agentrl.errors import AgentRLError

__all__ = ["RolloutSchemaError", "RolloutStoreError"]


class RolloutStoreError(AgentRLError, ValueError):
    """The store cannot be read as asked: no ``rollouts/`` in the run directory, or a file that is not a
    complete Parquet file of this schema (the message names it and says how to go on)."""


class RolloutSchemaError(RolloutStoreError):
    """A file of the store was written under another schema version than this agentrl reads."""
