"""Wire models of the env server: the JSON bodies its OpenAPI schema documents.

Unknown fields are rejected (``extra="forbid"``), so a typo in a client is a 422
naming the field, never a silently ignored option.
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic

from agentrl.types import Message, ToolSpec

__all__ = [
    "CreateEpisode",
    "EpisodeInfo",
    "ErrorResponse",
    "OracleResponse",
    "ResetRequest",
    "ResetResponse",
    "StepRequest",
    "StepResponse",
    "ToolsResponse",
]


class _Body(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")


class CreateEpisode(_Body):
    env_id: str = pydantic.Field(
        min_length=1, max_length=200, description="a served env id, e.g. countdown-v0"
    )
    kwargs: dict[str, Any] = pydantic.Field(
        default_factory=dict, description="constructor kwargs for the env"
    )


class EpisodeInfo(_Body):
    episode_id: str
    env_id: str
    status: Literal["created", "running", "done", "failed"]
    turn: int
    max_turns: int
    reward_range: tuple[float, float]
    tools: list[ToolSpec]
    infra_error: str | None = None


class ResetRequest(_Body):
    seed: int | None = pydantic.Field(None, ge=0, lt=2**63, description="same seed, same episode")
    options: dict[str, Any] | None = None


class ResetResponse(_Body):
    messages: list[Message]
    info: dict[str, Any]


class StepRequest(_Body):
    action: Message = pydantic.Field(description="the assistant message of this turn")


class StepResponse(_Body):
    messages: list[Message]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


class ToolsResponse(_Body):
    tools: list[ToolSpec]


class OracleResponse(_Body):
    action: Message


class ErrorResponse(_Body):
    detail: str
    infra_error: str | None = None
