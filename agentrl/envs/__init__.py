"""agentrl.envs: the environment contract, tools, registry and checker.

Public API::

    Env, ToolEnv, StepResult, tool              # write an environment
    register, make, spec, list_envs, EnvSpec    # the registry (ids like "countdown-v0")
    check_env                                   # the conformance checker

Importing this package loads the shipped environments (``environments.*``) and
entry-point plugins, and registers each id in gymnasium as ``agentrl/<id>``.
"""

from __future__ import annotations

from agentrl.envs.core import Env, MessageSpace, MessagesSpace, StepResult
from agentrl.envs.errors import (
    EnvCheckError,
    EnvConnectionError,
    EnvContractError,
    EnvError,
    EnvServerError,
    EnvTimeoutError,
    EpisodeDoneError,
    InvalidActionError,
    RegistrationError,
    RemoteEnvError,
    ResetNeededError,
    ServerBusyError,
    ToolError,
    UnknownEnvError,
)
from agentrl.envs.registry import EnvSpec, list_envs, load_errors, load_plugins, make, register, spec
from agentrl.envs.tools import Tool, ToolEnv, tool, tool_spec

__all__ = [
    "Env",
    "EnvCheckError",
    "EnvConnectionError",
    "EnvContractError",
    "EnvError",
    "EnvServerError",
    "EnvSpec",
    "EnvTimeoutError",
    "EpisodeDoneError",
    "InvalidActionError",
    "MessageSpace",
    "MessagesSpace",
    "RegistrationError",
    "RemoteEnvError",
    "ResetNeededError",
    "ServerBusyError",
    "StepResult",
    "Tool",
    "ToolEnv",
    "ToolError",
    "UnknownEnvError",
    "list_envs",
    "load_errors",
    "load_plugins",
    "make",
    "register",
    "spec",
    "tool",
    "tool_spec",
]

load_plugins()
