"""The Engine protocol: token ids in, sampled token ids with logprobs out.

Engines never see chat text; the session server owns tokenization. Every
sampled token carries the weight version that produced it, so the trainer can
bound staleness and correct off-policy tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from agentrl.types import SamplingParams

__all__ = ["Engine", "FinishReason", "Generation"]

FinishReason = Literal["stop", "length", "abort"]


@dataclass
class Generation:
    """The result of one ``generate`` call.

    ``logprobs[i]`` is the log-probability of ``output_ids[i]`` under the
    distribution it was sampled from (see docs/engines.md). ``weight_versions[i]``
    is the engine's weight version when token ``i`` was sampled;
    ``weight_version`` is the version at the end of the request.
    """

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    weight_version: int
    weight_versions: list[int] = field(default_factory=list)
    request_id: str = ""
    prompt_tokens: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    """What every inference engine offers (embedded HF engine, SGLang adapter, ...)."""

    @property
    def weight_version(self) -> int: ...

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, request_id: str | None = None
    ) -> Generation: ...

    async def update_weights(self, *args: Any, **kwargs: Any) -> int: ...

    async def abort(self, request_id: str) -> bool: ...

    async def health(self) -> dict[str, Any]: ...
