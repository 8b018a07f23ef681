"""Errors raised by the sandbox clients (agentrl.sandbox).

::

    AgentRLError
    └── SandboxError
        ├── SandboxUnavailable             the backend cannot run here (bwrap missing, no Docker engine,
        │                                  image not built, unknown backend name); the message names the fix
        ├── SandboxInputError (ValueError) bad input to ``run`` (empty or binary code, huge files, bad paths)
        ├── SandboxLost (InfraError)       the sandbox died or broke its protocol; retry on a fresh one
        │                                  (an infrastructure failure: never score it as reward 0)
        └── LeaseExpired (InfraError)      the pool's lease TTL ran out and the sandbox was destroyed

What the *code* does inside the sandbox (crash, time out, blow the memory limit) is not an
exception: it is an :class:`~agentrl.sandbox.types.ExecResult` with a stop ``reason``.
"""

from __future__ import annotations

from agentrl.errors import AgentRLError, InfraError

__all__ = ["LeaseExpired", "SandboxError", "SandboxInputError", "SandboxLost", "SandboxUnavailable"]


class SandboxError(AgentRLError):
    """Base class of every error raised by agentrl.sandbox."""


class SandboxUnavailable(SandboxError):
    """The requested backend cannot run on this machine; the message says how to make it run."""


class SandboxInputError(SandboxError, ValueError):
    """``run`` got input it must refuse before starting anything."""


class SandboxLost(SandboxError, InfraError):
    """The sandbox process or container died, or answered something that is not the protocol."""


class LeaseExpired(SandboxError, InfraError):
    """A pooled sandbox was used after its lease TTL; it has been destroyed."""
