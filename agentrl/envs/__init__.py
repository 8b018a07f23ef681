"""agentrl.envs: the environment contract, tools, registry and checker.

Public API::

    Env, ToolEnv, StepResult, tool, Rubric      # write an environment
    MCPServer                                   # a ToolEnv's tools from an MCP server (mcp_servers = [...])
    GymnasiumTextEnv                            # play a discrete-action gymnasium env in text
    register, make, spec, list_envs, EnvSpec    # the registry (ids like "countdown-v0")
    resolve_env, import_modules                 # "module:Class" / "file.py:Class" / --import MODULE
    register_namespace, list_namespaces         # "prefix:NAME" references (reasoning-gym:leg_counting)
    check_env, CheckReport                      # the conformance checker
    RemoteEnv                                   # an episode on an env server, used like a local Env
    OpenEnvRemoteEnv                            # an episode on an OpenEnv env server, used the same way

The env server lives in ``agentrl.envs.server`` (imported on demand: FastAPI), its clients in
``agentrl.envs.remote``.

Importing this package registers nothing: the shipped environments (``environments.*``) and
entry-point plugins load on the registry's first use (``make``, ``spec``, ``list_envs``, or
``load_plugins()``), which also registers each id in gymnasium as ``agentrl/<id>``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentrl.envs.core import Env, MessageSpace, MessagesSpace, StepResult
from agentrl.envs.errors import (
    EnvCheckError,
    EnvConnectionError,
    EnvContractError,
    EnvDefinitionError,
    EnvError,
    EnvInfraError,
    EnvReferenceError,
    EnvServerError,
    EnvTimeoutError,
    EpisodeDoneError,
    EpisodeTimeoutError,
    InvalidActionError,
    RegistrationError,
    RemoteEnvError,
    ResetNeededError,
    ServerBusyError,
    ToolError,
    UnknownEnvError,
)
from agentrl.envs.gym_bridge import GymnasiumTextEnv
from agentrl.envs.mcp_tools import MCPServer
from agentrl.envs.namespaces import EnvNamespace, list_namespaces, register_namespace
from agentrl.envs.registry import (
    EnvSpec,
    import_modules,
    list_envs,
    load_errors,
    load_plugins,
    make,
    register,
    resolve_env,
    spec,
)
from agentrl.envs.rubric import Rubric
from agentrl.envs.tools import Tool, ToolEnv, tool, tool_spec

__all__ = [
    "CheckReport",
    "Env",
    "EnvCheckError",
    "EnvConnectionError",
    "EnvContractError",
    "EnvDefinitionError",
    "EnvError",
    "EnvInfraError",
    "EnvNamespace",
    "EnvReferenceError",
    "EnvServerError",
    "EnvSpec",
    "EnvTimeoutError",
    "EpisodeDoneError",
    "EpisodeTimeoutError",
    "GymnasiumTextEnv",
    "InvalidActionError",
    "MCPServer",
    "MessageSpace",
    "MessagesSpace",
    "OpenEnvRemoteEnv",
    "RegistrationError",
    "RemoteEnv",
    "RemoteEnvError",
    "ResetNeededError",
    "Rubric",
    "ServerBusyError",
    "StepResult",
    "Tool",
    "ToolEnv",
    "ToolError",
    "UnknownEnvError",
    "check_env",
    "import_modules",
    "list_envs",
    "list_namespaces",
    "load_errors",
    "load_plugins",
    "make",
    "register",
    "register_namespace",
    "resolve_env",
    "spec",
    "tool",
    "tool_spec",
]

if TYPE_CHECKING:
    from agentrl.envs.checker import CheckReport, check_env
    from agentrl.envs.remote.client import RemoteEnv
    from agentrl.envs.remote.openenv import OpenEnvRemoteEnv

# Imported on first use: they pull in jsonschema and httpx, which `agentrl --help` does not need.
_LAZY = {
    "CheckReport": "agentrl.envs.checker",
    "check_env": "agentrl.envs.checker",
    "RemoteEnv": "agentrl.envs.remote.client",
    "OpenEnvRemoteEnv": "agentrl.envs.remote.openenv",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'agentrl.envs' has no attribute {name!r}")
