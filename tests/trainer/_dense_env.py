"""A single-turn env with a dense reward even for random weights: the share of the reply's characters
that are lowercase vowels. Every group then has nonzero advantages, so an RL step moves the weights."""

from __future__ import annotations

from typing import Any

from agentrl.envs import Env, StepResult
from agentrl.types import Message


class VowelEnv(Env):
    """Reply with as many vowels as you can."""

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        n = int(self.np_random.integers(3, 9))
        return [Message(role="user", content=f"Write {n} vowels.")], {}

    def _step(self, action: Message) -> StepResult:
        text = action.content or ""
        return StepResult([], sum(c in "aeiou" for c in text) / max(1, len(text)), True, False, {})

    def oracle_action(self) -> Message:
        return Message(role="assistant", content="aeiou")
