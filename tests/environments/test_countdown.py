"""Countdown: exact-arithmetic scoring, answer format, generated tasks are solvable."""

from __future__ import annotations

import gymnasium
import pytest

import agentrl.envs as envs
from agentrl.types import Message
from environments.countdown.env import CountdownEnv, check_answer, solve


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


@pytest.mark.parametrize(
    ("text", "correct", "problem"),
    [
        ("<answer>(3+5)*2</answer>", True, None),
        ("thinking... <answer>2*(5+3)</answer>", True, None),
        ("<answer>1</answer> <answer>(5+3)*2</answer>", True, None),  # the last tag counts
        ("<answer>(3+5)*2 </answer>", True, None),
        ("<answer>3*5</answer>", False, None),
        ("<answer>(3+3)*2</answer>", False, "uses [3] beyond the given numbers [3, 5, 2]"),
        ("<answer>16</answer>", False, "uses [16] beyond the given numbers [3, 5, 2]"),
        ("<answer>5/(3-3)</answer>", False, "division by zero"),
        ("<answer>-3+5</answer>", False, "answer uses an unsupported construct (USub)"),
        ("<answer>3**2</answer>", False, "answer uses an unsupported construct (Pow)"),
        ("<answer>(3+5</answer>", False, "answer '(3+5' is not a valid expression"),
        (
            "<answer>(3+5)*2.0</answer>",
            False,
            "answer '(3+5)*2.0' must use only digits, + - * / and parentheses",
        ),
        ("(3+5)*2", False, "no <answer>...</answer> tag"),
    ],
)
def test_check_answer(text: str, correct: bool, problem: str | None) -> None:
    assert check_answer(text, [3, 5, 2], 16) == (correct, problem)


def test_exact_fractions_not_floats() -> None:
    assert check_answer("<answer>(1/3)*3*7</answer>", [1, 3, 3, 7], 7) == (True, None)
    assert check_answer("<answer>7/2*2</answer>", [7, 2, 2], 7) == (True, None)


def test_generated_tasks_are_solvable_and_rewarded_exactly() -> None:
    env = envs.make("countdown-v0")
    seen = set()
    for seed in range(200):
        messages, info = env.reset(seed=seed)
        assert len(info["numbers"]) == 3 and all(1 <= n <= 10 for n in info["numbers"])
        assert 1 <= info["target"] <= 100 and info["target"] not in info["numbers"]
        seen.add((tuple(info["numbers"]), info["target"]))
        result = env.step(env.oracle_action())
        assert (result.reward, result.terminated, result.info["correct"]) == (1.0, True, True)
    assert len(seen) > 150  # seeds give varied tasks


def test_wrong_and_format_rewards() -> None:
    env = CountdownEnv(format_reward=0.1)
    env.reset(options={"numbers": [3, 5, 2], "target": 16})
    assert env.step(say("<answer>3*5</answer>")).reward == 0.1
    env.reset(options={"numbers": [3, 5, 2], "target": 16})
    assert env.step(say("sixteen")).reward == 0.0


def test_difficulty_knobs_and_validation() -> None:
    env = envs.make("countdown", num_numbers=2, max_number=5, operations="+")
    messages, info = env.reset(seed=1)
    assert info["target"] == sum(info["numbers"])
    assert "Use + and parentheses" in (messages[0].content or "")
    with pytest.raises(ValueError, match="num_numbers must be 2..6, got 9"):
        CountdownEnv(num_numbers=9)
    with pytest.raises(ValueError, match="operations must be a non-empty subset"):
        CountdownEnv(operations="^")


def test_solver_for_pinned_tasks() -> None:
    assert solve([3, 5, 2], 16) is not None
    assert solve([1, 1], 7) is None
    env = CountdownEnv()
    env.reset(options={"numbers": [4, 6, 9], "target": 33})
    assert env.step(env.oracle_action()).reward == 1.0


def test_gymnasium_make_uses_agentrl_namespace() -> None:
    env = gymnasium.make("agentrl/countdown-v0")
    messages, _ = env.reset(seed=0)
    assert isinstance(env.unwrapped, CountdownEnv)
    assert env.step(env.unwrapped.oracle_action())[1] == 1.0  # type: ignore[attr-defined]
