"""agentrl: train LLM agents with reinforcement learning.

The top-level namespace exports the wire types and the error root; each
subpackage (``agentrl.envs``, ``agentrl.session``, ``agentrl.engines``,
``agentrl.trainer``, ``agentrl.models``) has its own public API.
"""

from __future__ import annotations

__version__ = "0.1.0"

from agentrl.errors import AgentRLError, ConfigError, TrajectoryError
from agentrl.types import (
    FunctionCall,
    FunctionSpec,
    Message,
    SamplingParams,
    ToolCall,
    ToolSpec,
    Trajectory,
    TurnSpan,
)

__all__ = [
    "AgentRLError",
    "ConfigError",
    "FunctionCall",
    "FunctionSpec",
    "Message",
    "SamplingParams",
    "ToolCall",
    "ToolSpec",
    "Trajectory",
    "TrajectoryError",
    "TurnSpan",
    "__version__",
]
