"""Envs for the evaluation tests: every episode is solved whatever the model writes, except where
the env's infrastructure fails (an :class:`EnvInfraError` on every attempt of one seed)."""

from __future__ import annotations

from typing import Any

from agentrl.envs import Env, StepResult
from agentrl.envs.errors import EnvInfraError
from agentrl.types import Message

BROKEN_SEED = 1
"""The held-out seed (with ``--eval-seed-offset 0``) whose env server is down on every attempt."""


class AlwaysSolved(Env):
    """Any reply scores the maximum reward, 1."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if seed == BROKEN_SEED:
            raise EnvInfraError(f"the service behind seed {seed} is down")
        return super().reset(seed=seed, options=options)

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        return [Message(role="user", content="Say anything.")], {}

    def _step(self, action: Message) -> StepResult:
        return StepResult([], 1.0, True, False, {})

    def oracle_action(self) -> Message:
        return Message(role="assistant", content="anything")
