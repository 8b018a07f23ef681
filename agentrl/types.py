"""Wire types shared by every agentrl component.

These pydantic models are what crosses process and HTTP boundaries: chat
messages and tool calls in the OpenAI shape, tool specs (OpenAI function tools),
sampling parameters, and the :class:`Trajectory` the trainer consumes. Unknown
fields are rejected everywhere (``extra="forbid"``) so a typo in a client never
silently turns into a default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentrl.errors import TrajectoryError

__all__ = [
    "FunctionCall",
    "FunctionSpec",
    "Message",
    "Role",
    "SamplingParams",
    "ToolCall",
    "ToolSpec",
    "Trajectory",
    "TrajectoryStatus",
    "TurnSpan",
]

Role = Literal["system", "user", "assistant", "tool"]
TrajectoryStatus = Literal["ok", "model_error", "infra_error"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionCall(_Strict):
    """The function part of a tool call. ``arguments`` is a JSON string, as in the OpenAI API."""

    name: str
    arguments: str = "{}"


class ToolCall(_Strict):
    """One tool call made by the assistant (OpenAI ``tool_calls[i]``)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Strict):
    """One chat message in the OpenAI shape, plus ``reasoning_content`` for thinking models.

    Invariants: ``tool_calls`` only on assistant messages; ``tool_call_id`` only
    on tool messages.
    """

    role: Role
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _check_role_fields(self) -> Message:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"tool_calls are only allowed on assistant messages, not role={self.role!r}")
        if self.tool_call_id is not None and self.role != "tool":
            raise ValueError(f"tool_call_id is only allowed on tool messages, not role={self.role!r}")
        return self


class FunctionSpec(_Strict):
    """An OpenAI function-tool definition; ``parameters`` is a JSON Schema object."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None


class ToolSpec(_Strict):
    """A tool as the OpenAI API declares it: ``{"type": "function", "function": {...}}``."""

    type: Literal["function"] = "function"
    function: FunctionSpec


class SamplingParams(_Strict):
    """How an engine samples one completion.

    ``temperature == 0`` means greedy decoding. ``top_k <= 0`` and ``top_p == 1``
    disable those filters. ``seed`` makes one request reproducible regardless of
    what else is batched with it.
    """

    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = -1
    max_new_tokens: int = Field(128, ge=1)
    stop_token_ids: list[int] = Field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False
    """Keep sampling past the model's EOS ids (``stop_token_ids`` still stop); SGLang's field of that name."""

    @field_validator("temperature")
    @classmethod
    def _finite_temperature(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"temperature must be finite, got {v!r}")
        return v


class TurnSpan(_Strict):
    """A half-open range ``[start, end)`` of token positions sampled in one assistant turn."""

    start: int = Field(ge=0)
    end: int = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> TurnSpan:
        if self.end < self.start:
            raise ValueError(f"turn span end {self.end} < start {self.start}")
        return self


class Trajectory(_Strict):
    """One training sample: the exact tokens of an episode (or of one segment of it).

    All per-token lists have the same length ``T = len(token_ids)``.
    ``loss_mask[t] == 1`` exactly where token ``t`` was sampled by the engine;
    ``rollout_logprobs[t]`` and ``policy_versions[t]`` are meaningful only there
    (0.0 and -1 elsewhere). ``turn_spans`` are the sampled ranges, in order.
    ``status`` classifies a failure: a ``model_error`` keeps its reward (the model
    did something wrong), an ``infra_error`` must never be trained on as reward 0.

    ``model_copy(update=...)`` re-validates (pydantic's skips validation), so a
    trainer stamping a NaN reward or an unknown status gets a :class:`TrajectoryError`.
    """

    token_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    policy_versions: list[int]
    reward: float = 0.0
    group_id: str = ""
    episode_id: str = ""
    segment: int = 0
    turn_spans: list[TurnSpan] = Field(default_factory=list)
    num_turns: int = 0
    truncated: bool = False
    status: TrajectoryStatus = "ok"
    error: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> Trajectory:
        n = len(self.token_ids)
        for name in ("loss_mask", "rollout_logprobs", "policy_versions"):
            got = len(getattr(self, name))
            if got != n:
                raise ValueError(f"{name} has {got} entries but token_ids has {n}; they must align")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss_mask entries must be 0 or 1")
        if not math.isfinite(self.reward):
            raise ValueError(f"reward must be finite, got {self.reward!r}")
        for span in self.turn_spans:
            if span.end > n:
                raise ValueError(f"turn span [{span.start}, {span.end}) exceeds {n} tokens")
        if self.status != "ok" and not self.error:
            raise ValueError(f"status={self.status!r} needs an error reason")
        return self

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with ``update`` applied and every field and invariant validated again."""
        if not update:
            return super().model_copy(deep=deep)
        try:
            new = self.model_validate({**dict(self), **update})
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(map(str, err['loc'])) or 'trajectory'}: {err['msg']}"
                for err in e.errors(include_url=False)
            )
            raise TrajectoryError(
                f"Trajectory.model_copy(update=...) with fields {sorted(update)} gives an invalid "
                f"trajectory ({problems}); fix the values the caller stamps"
            ) from e
        new.__pydantic_fields_set__ = self.model_fields_set | set(update)  # as pydantic's model_copy
        return super(Trajectory, new).model_copy(deep=True) if deep else new

    @property
    def num_sampled(self) -> int:
        return sum(self.loss_mask)
