"""Rubric: weighted reward functions with arguments injected by name."""

from __future__ import annotations

import pytest

from agentrl.envs import EnvContractError, Rubric


def correct(completion: str, answer: str) -> float:
    return float(completion.strip() == answer)


def short(completion: str) -> float:
    return 1.0 if len(completion) < 5 else 0.0


def test_weighted_sum_and_components() -> None:
    rubric = Rubric([(correct, 1.0), (short, 0.25)])
    assert rubric.score(completion="42", answer="42", task={"unused": 1}) == (
        1.25,
        {"correct": 1.0, "short": 1.0},
    )
    assert rubric.score(completion="forty-two", answer="42") == (0.0, {"correct": 0.0, "short": 0.0})
    assert rubric.bounds == (0.0, 1.25)


def test_non_finite_component_is_an_error() -> None:
    with pytest.raises(EnvContractError, match="reward function 'nan_fn' returned nan"):
        Rubric([lambda **kw: 1.0, nan_fn]).score(completion="x")
    with pytest.raises(ValueError, match="at least one reward function"):
        Rubric([])


def nan_fn() -> float:
    return float("nan")


def test_tool_env_scores_its_final_answer_with_a_rubric() -> None:
    from typing import Any

    from agentrl.envs import ToolEnv
    from agentrl.types import Message

    def exact(completion: str, env: Any) -> float:
        return float(completion == env.gold)

    class Graded(ToolEnv):
        rubric = Rubric([(exact, 1.0), (short, 0.5)])

        def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
            self.gold = "42"
            return [Message(role="user", content="answer")], {}

    env = Graded()
    env.reset(seed=0)
    result = env.step(Message(role="assistant", content="42"))
    assert (result.reward, result.info["reward_components"]) == (1.5, {"exact": 1.0, "short": 1.0})
