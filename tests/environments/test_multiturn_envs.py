"""calculator, guess-number and frozenlake: rewards, feedback and counted model errors."""

from __future__ import annotations

import json
import math

import pytest

import agentrl.envs as envs
from agentrl.types import FunctionCall, Message, ToolCall
from environments.calculator.env import evaluate
from environments.frozenlake.env import FrozenLakeEnv


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


def calc(expr: str, id: str = "c1") -> Message:
    call = ToolCall(
        id=id, function=FunctionCall(name="calculate", arguments=json.dumps({"expression": expr}))
    )
    return Message(role="assistant", tool_calls=[call])


def test_calculator_tool_then_answer() -> None:
    env = envs.make("calculator-v0")
    env.reset(seed=4)
    obs, reward, terminated, _, info = env.step(calc("(12+3)*4"))
    assert (obs[0].content, reward, terminated) == ("60", 0.0, False)
    obs, _, _, _, info = env.step(calc("1/0", "c2"))
    assert obs[0].content == "error: division by zero" and info["tool_errors"] == 1
    result = env.step(say(f"<answer>{env.solution}</answer>"))  # type: ignore[attr-defined]
    assert (result.reward, result.terminated, result.info["tool_calls"]) == (1.0, True, 2)


def test_calculator_wrong_answer_and_turn_limit() -> None:
    env = envs.make("calculator-v0")
    env.reset(seed=4)
    assert env.step(say("<answer>-1</answer>")).reward == 0.0
    env.reset(seed=4)
    results = [env.step(calc("1+1", f"c{i}")) for i in range(4)]
    assert results[-1].truncated and not results[-1].terminated and results[-1].reward == 0.0


@pytest.mark.parametrize(
    ("expr", "value"), [("2*(3+4)", 14), ("-3+5", 2), ("7/2", 3.5), ("1.5*2", 3), ("10 ÷ 4", 2.5)]
)
def test_calculator_evaluates_exactly(expr: str, value: float) -> None:
    assert evaluate(expr) == value


@pytest.mark.parametrize("expr", ["import os", "2**10", "x+1", "(1+", "abs(-1)"])
def test_calculator_rejects_non_arithmetic(expr: str) -> None:
    from agentrl.envs import ToolError

    with pytest.raises(ToolError):
        evaluate(expr)


def test_calculator_tasks_vary_and_answers_are_integers() -> None:
    env = envs.make("calculator-v0")
    seen = set()
    for seed in range(60):
        messages, info = env.reset(seed=seed)
        seen.add(info["question"])
        assert env.solution > 0  # type: ignore[attr-defined]
    assert len(seen) == 60


def test_guess_number_feedback_invalid_guesses_and_truncation() -> None:
    env = envs.make("guess-number-v0")
    env.reset(seed=0, options={"secret": 11})
    assert env.step(say("<guess>5</guess>")).messages[0].content == "5 is too low: higher."
    assert env.step(say("<guess>13</guess>")).messages[0].content == "13 is too high: lower."
    bad = env.step(say("eleven"))
    assert bad.messages[0].content == (
        "Invalid guess 'eleven': reply with <guess>N</guess> where N is from 1 to 16."
    )
    assert bad.info["invalid_guesses"] == 1
    win = env.step(say("<guess>11</guess>"))
    assert (win.reward, win.terminated, win.info["solved"]) == (1.0, True, True)
    env.reset(seed=0, options={"secret": 1})
    results = [env.step(say("<guess>16</guess>")) for _ in range(env.max_turns)]
    assert results[-1].truncated and sum(r.reward for r in results) == 0.0


def test_guess_number_oracle_wins_for_every_secret() -> None:
    env = envs.make("guess-number", high=100)
    for secret in range(1, 101):
        env.reset(seed=0, options={"secret": secret})
        while not env.done:
            result = env.step(env.oracle_action())
        assert result.reward == 1.0 and result.terminated


def test_frozenlake_hole_ends_with_zero_and_maps_vary() -> None:
    env = FrozenLakeEnv()
    maps = {env.reset(seed=s)[0][0].content for s in range(20)}
    assert len(maps) > 10
    for seed in range(50):  # find a map with a hole next to the start, and fall in
        env.reset(seed=seed)
        grid = env.inner.unwrapped.desc  # type: ignore[attr-defined]
        if grid[1][0] == b"H":
            result = env.step(say("<action>down</action>"))
            assert (result.reward, result.terminated, result.messages) == (0.0, True, [])
            return
    pytest.fail("no map with a hole below the start in 50 seeds")


def test_calculator_easy_setting_restricts_kinds_and_numbers() -> None:
    env = envs.make("calculator-v0", templates=[0], operand_range=[2, 10])
    for seed in range(30):
        _, info = env.reset(seed=seed)
        a, b = (int(x) for x in env.expression.split("*"))  # type: ignore[attr-defined]
        assert 2 <= a < 10 and 2 <= b < 10 and info["question"].startswith("A crate holds")
    default = envs.make("calculator-v0")
    default.reset(seed=4)
    assert default.expression == "5076/94"  # type: ignore[attr-defined]  # the default tasks are unchanged
    for bad in ({"templates": []}, {"templates": [7]}, {"operand_range": [5, 5]}, {"operand_range": [0, 3]}):
        with pytest.raises(ValueError):
            envs.make("calculator-v0", **bad)


def _oracle_episode(env, seed: int):  # type: ignore[no-untyped-def]
    env.reset(seed=seed)
    turns, result = 0, None
    while result is None or not (result.terminated or result.truncated):
        result = env.step(env.oracle_action())
        turns += 1
    return turns, result


def test_calculator_mixed_oracle_uses_the_tool_on_its_share_of_seeds_and_guesses_otherwise() -> None:
    env = envs.make("calculator-v0", templates=[0], operand_range=[10, 60], oracle_tool_rate=0.3)
    plain = envs.make("calculator-v0", templates=[0], operand_range=[10, 60])
    with_tool, guessed = 0, 0
    for seed in range(200):
        plain.reset(seed=seed)
        turns, result = _oracle_episode(env, seed)
        assert env.expression == plain.expression  # type: ignore[attr-defined]  # same questions as the plain oracle
        if turns == 2:  # tool call, then the answer
            with_tool += 1
            assert result.reward == 1.0 and result.info["tool_calls"] == 1
        else:  # answered at once with the sum of the question's numbers: wrong for a product of these sizes
            guessed += 1
            a, b = (int(x) for x in env.expression.split("*"))  # type: ignore[attr-defined]
            assert (turns, result.reward, result.info["tool_calls"]) == (1, 0.0, 0)
            assert env.guess == a + b  # type: ignore[attr-defined]
    assert 40 <= with_tool <= 80 and with_tool + guessed == 200  # about 30 % of 200 seeds
    assert all(
        _oracle_episode(plain, s)[1].reward == 1.0 for s in range(20)
    )  # the default oracle always solves
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="oracle_tool_rate"):
            envs.make("calculator-v0", oracle_tool_rate=bad)


def test_guess_number_step_reward_pays_the_bits_each_guess_cuts() -> None:
    env = envs.make("guess-number-v0", step_reward=0.1)
    env.reset(seed=0, options={"secret": 11})
    assert env.step(say("<guess>8</guess>")).reward == pytest.approx(0.1 / 4)  # 16 -> 8 numbers: 1 of 4 bits
    assert env.step(say("<guess>3</guess>")).reward == 0.0  # already ruled out: nothing learnt
    assert env.step(say("<guess>eleven</guess>")).reward == 0.0  # invalid
    assert env.step(say("<guess>14</guess>")).reward == pytest.approx(0.1 * math.log2(8 / 5) / 4)  # 9..13
    win = env.step(say("<guess>11</guess>"))
    assert win.reward == pytest.approx(1.0 + 0.1 * math.log2(5) / 4)
    # however it gets there, a solved episode earns 1 + step_reward: the guesses' bits add up to 4
    env.reset(seed=0, options={"secret": 11})
    assert env.step(say("<guess>11</guess>")).reward == pytest.approx(1.1)
    assert envs.make("guess-number-v0").step_reward == 0.0  # off by default  # type: ignore[attr-defined]
