"""Sandboxes for model-written code: one ``run`` interface over a bubblewrap and a Docker backend.

::

    from agentrl.sandbox import SandboxPool

    with SandboxPool("process", size=4) as pool, pool.lease() as sb:
        r = sb.run("print(6 * 7)", timeout=5)
        assert r.ok and r.stdout == "42\\n"
        sb.run("x = 1", persistent=True); sb.run("print(x + 1)", persistent=True)   # state survives

``make_backend(name).create()`` gives a sandbox without a pool. The threat model, what each
backend guarantees and how to pick one: ``docs/sandbox.md``.
"""

from __future__ import annotations

from agentrl.sandbox.base import PythonSession, Sandbox
from agentrl.sandbox.errors import (
    LeaseExpired,
    SandboxError,
    SandboxInputError,
    SandboxLost,
    SandboxUnavailable,
)
from agentrl.sandbox.pool import BACKENDS, Backend, PoolStats, SandboxPool, make_backend
from agentrl.sandbox.types import ExecResult, Limits, StopReason

__all__ = [
    "BACKENDS",
    "Backend",
    "ExecResult",
    "LeaseExpired",
    "Limits",
    "PoolStats",
    "PythonSession",
    "Sandbox",
    "SandboxError",
    "SandboxInputError",
    "SandboxLost",
    "SandboxPool",
    "SandboxUnavailable",
    "StopReason",
    "make_backend",
]
