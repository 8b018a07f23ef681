"""How an agentrl env looks in OpenEnv's protocol: its action, observation and state models, and JSON-RPC.

OpenEnv (``openenv`` on PyPI, meta-pytorch/OpenEnv) types every env with three pydantic models:
an action the agent sends, an observation the env answers (``done``, ``reward``, ``metadata``
plus the env's fields) and a state. An agentrl env is a chat env, so the mapping is:

====================  ==========================================================================
OpenEnv               agentrl
====================  ==========================================================================
action                the assistant message of one turn: ``content``, ``tool_calls``,
                      ``reasoning_content`` (the role is always ``assistant``)
observation           ``messages`` the env appended (the prompt after a reset; tool results and
                      feedback after a step), the episode's ``tools`` (OpenAI function specs),
                      ``reward`` (``None`` after a reset), ``done`` (terminated or truncated);
                      ``metadata`` holds ``info``, ``terminated``, ``truncated``, ``turn`` and
                      the server's ``episode_id``
state                 ``episode_id``, ``step_count`` (assistant turns), ``env_id``, ``status``,
                      ``max_turns``, ``reward_range``, ``infra_error``
reset data            ``seed``; ``episode_id`` (HTTP only: which episode to reset); every other
                      key (and an ``options`` object) becomes the env's reset ``options``
====================  ==========================================================================

The wire bodies are OpenEnv's: ``{"observation", "reward", "done", "metadata"}`` for reset and
step, WebSocket frames ``{"type": ..., "data": ...}``, and JSON-RPC 2.0 on ``/mcp``.
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic

from agentrl.types import Message, ToolCall, ToolSpec

__all__ = [
    "JSONRPC_INVALID_PARAMS",
    "JSONRPC_INVALID_REQUEST",
    "JSONRPC_METHOD_NOT_FOUND",
    "JSONRPC_PARSE_ERROR",
    "JSONRPC_SERVER_ERROR",
    "OpenEnvAction",
    "OpenEnvObservation",
    "OpenEnvState",
    "observation_payload",
    "rpc_error",
    "rpc_result",
]

JSONRPC_PARSE_ERROR = -32700
JSONRPC_INVALID_REQUEST = -32600
JSONRPC_METHOD_NOT_FOUND = -32601
JSONRPC_INVALID_PARAMS = -32602
JSONRPC_SERVER_ERROR = -32000


class OpenEnvAction(pydantic.BaseModel):
    """One assistant turn, as an OpenEnv action (the role is implied: always ``assistant``)."""

    model_config = pydantic.ConfigDict(extra="forbid", title="AgentrlAction")

    content: str | None = pydantic.Field(None, description="what the assistant said")
    tool_calls: list[ToolCall] | None = pydantic.Field(
        None, description="OpenAI-style tool calls of this turn (see the observation's tools)"
    )
    reasoning_content: str | None = pydantic.Field(None, description="thinking text, if any")
    metadata: dict[str, Any] = pydantic.Field(default_factory=dict, description="ignored by the env")

    def message(self) -> Message:
        return Message(
            role="assistant",
            content=self.content,
            tool_calls=self.tool_calls,
            reasoning_content=self.reasoning_content,
        )


class OpenEnvObservation(pydantic.BaseModel):
    """What the env answers to a reset or a step."""

    model_config = pydantic.ConfigDict(extra="forbid", title="AgentrlObservation")

    messages: list[Message] = pydantic.Field(
        description="messages the env appended: the prompt after reset, tool results and feedback after a step"
    )
    tools: list[ToolSpec] = pydantic.Field(description="tools the assistant may call (OpenAI function specs)")
    done: bool = pydantic.Field(False, description="terminated or truncated")
    reward: float | None = pydantic.Field(None, description="reward of this env step (None after reset)")
    metadata: dict[str, Any] = pydantic.Field(
        default_factory=dict, description="info, terminated, truncated, turn, episode_id"
    )


class OpenEnvState(pydantic.BaseModel):
    """The state of one episode."""

    model_config = pydantic.ConfigDict(extra="forbid", title="AgentrlState")

    episode_id: str | None = None
    step_count: int = pydantic.Field(0, ge=0, description="assistant turns taken")
    env_id: str
    status: Literal["created", "running", "done", "failed"]
    max_turns: int
    reward_range: tuple[float, float]
    infra_error: str | None = None


def observation_payload(
    episode_id: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    step: dict[str, Any] | None,
    info: dict[str, Any],
    turn: int,
) -> dict[str, Any]:
    """OpenEnv's reset/step body ``{"observation", "reward", "done", "metadata"}`` (``step`` None after a reset).

    ``metadata`` appears both inside the observation and beside it, as OpenEnv's own server writes it.
    """
    terminated = bool(step and step["terminated"])
    truncated = bool(step and step["truncated"])
    metadata = {
        "episode_id": episode_id,
        "info": info,
        "terminated": terminated,
        "truncated": truncated,
        "turn": turn,
    }
    reward = None if step is None else step["reward"]
    done = terminated or truncated
    return {
        "observation": {"messages": messages, "tools": tools, "metadata": metadata},
        "reward": reward,
        "done": done,
        "metadata": metadata,
    }


def rpc_result(request_id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def rpc_error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
