"""The root of agentrl's exception tree.

Every error agentrl raises on purpose derives from :class:`AgentRLError`, so a
caller can catch the whole family with one clause. Each subpackage adds its own
branch in its ``errors.py``::

    AgentRLError
    ├── ConfigError              bad option, flag or config file (fail fast, before heavy work)
    ├── InfraError               marker: the infrastructure failed, not the model (a sandbox died,
    │                            an env service is down); retried on a fresh env, never scored.
    │                            ``EnvInfraError`` and the sandbox's ``SandboxLost``/``LeaseExpired``
    │                            derive from it, so the sandbox never imports ``agentrl.envs``
    ├── ServerStartError         (RuntimeError) an in-process server (``BackgroundServer``) did not start
    ├── TrajectoryError          (ValueError) an update to a Trajectory breaks its invariants
    ├── LoopError                (RuntimeError) the run's event loop (agentrl.eventloop): closed,
    │   │                        or called from its own thread
    │   └── LoopTimeoutError     (TimeoutError) a coroutine run on it missed its deadline
    ├── ModelError               (agentrl.models) unknown model name, corrupt cache, failed build
    ├── EnvError                 (agentrl.envs) registry, contract and env-server failures
    ├── SandboxError             (agentrl.sandbox) backend unavailable, limits, bad input
    ├── EngineError              (agentrl.engines) bad request, engine failure, deadline
    ├── SessionError             (agentrl.session) template, divergence, unknown session
    ├── TrainerError             (agentrl.trainer) rollout, backend, checkpoint failures
    └── ViewerError              (agentrl.viewer, ValueError) a run directory that is none, a bad query

Deliberate raises of bare builtins (``ValueError``, ``RuntimeError``, ...) are not allowed in
``agentrl/``; a class here subclasses the builtin it replaces where callers may catch that
(``tests/test_errors.py`` enforces both).

Messages say what failed, the value seen, and how to fix it.
"""

from __future__ import annotations

__all__ = [
    "AgentRLError",
    "ConfigError",
    "InfraError",
    "LoopError",
    "LoopTimeoutError",
    "ServerStartError",
    "TrajectoryError",
]


class AgentRLError(Exception):
    """Base class of every error agentrl raises deliberately."""


class ConfigError(AgentRLError, ValueError):
    """An option, flag or config file is invalid; raised before any heavy work starts."""


class InfraError(AgentRLError):
    """The infrastructure failed, not the model: a sandbox died, a service an env calls is down.

    A marker shared by the packages that run things for an episode (``agentrl.envs``'
    :class:`~agentrl.envs.errors.EnvInfraError`, ``agentrl.sandbox``'s ``SandboxLost`` and
    ``LeaseExpired``). Raised inside an env step (a ``@tool`` included), it aborts the episode
    instead of answering the model; the trainer retries the episode on a fresh env with the same
    seed and counts it, never scoring it as reward 0. Catch this class for "any infrastructure failure".
    """


class ServerStartError(AgentRLError, RuntimeError):
    """An in-process server (:class:`agentrl.httpkit.BackgroundServer`) could not bind its port,
    died while starting, or was not serving by its deadline."""


class TrajectoryError(AgentRLError, ValueError):
    """``Trajectory.model_copy(update=...)`` produced a trajectory that breaks its invariants.

    (A non-finite reward, an unknown status, misaligned per-token lists, an unknown field.)
    Building a ``Trajectory`` directly raises pydantic's ``ValidationError`` as usual.
    """


class LoopError(AgentRLError, RuntimeError):
    """Work was handed to a closed :class:`~agentrl.eventloop.LoopThread`, or ``run`` called on its own thread."""


class LoopTimeoutError(LoopError, TimeoutError):
    """A coroutine run through :meth:`~agentrl.eventloop.LoopThread.run` missed its deadline (it was cancelled)."""
