"""The gymnasium bridge: discrete gymnasium envs played in text; invalid actions are model errors."""

from __future__ import annotations

import gymnasium
import pytest

from agentrl.envs import GymnasiumTextEnv, check_env
from agentrl.types import Message


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


def taxi() -> GymnasiumTextEnv:
    return GymnasiumTextEnv(
        "Taxi-v4",
        action_names=["south", "north", "east", "west", "pickup", "dropoff"],
        instructions="Drive the taxi.",
        max_turns=5,
    )


def test_actions_by_name_tag_or_index_and_rendering() -> None:
    env = taxi()
    messages, info = env.reset(seed=3)
    assert messages[0].content is not None and messages[0].content.startswith("Drive the taxi.\n\n")
    assert env.parse_action("<action>North</action>") == 1
    assert env.parse_action("  east ") == 2
    assert env.parse_action("I pick 4") != 4 and env.parse_action("4") == 4
    obs, reward, terminated, truncated, info = env.step(say("<action>pickup</action>"))
    assert reward in (-1.0, -10.0) and (terminated, info["action"]) == (False, 4)  # Taxi's own rewards


def test_invalid_action_is_feedback_not_a_crash() -> None:
    env = taxi()
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(say("<action>fly</action>"))
    assert obs == [
        Message(
            role="user",
            content="Invalid action 'fly'. Reply with exactly one of: south, north, "
            "east, west, pickup, dropoff, e.g. <action>south</action>.",
        )
    ]
    assert (reward, terminated, truncated, info["invalid_actions"]) == (0.0, False, False, 1)
    env.step(say("99"))
    for _ in range(3):
        result = env.step(say("north"))
    assert result.truncated and result.info["invalid_actions"] == 2  # invalid turns count toward max_turns


def test_same_seed_same_episode() -> None:
    a, b = taxi(), taxi()
    assert a.reset(seed=11) == b.reset(seed=11)
    assert a.step(say("west")) == b.step(say("west"))


def test_non_discrete_action_space_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"GymnasiumTextEnv needs a Discrete action space, got Box"):
        GymnasiumTextEnv(gymnasium.make("MountainCarContinuous-v0"))
    with pytest.raises(ValueError, match="action_names has 2 names for 4 actions"):
        GymnasiumTextEnv("FrozenLake-v1", action_names=["a", "b"])


def test_env_without_oracle_fails_the_checker_with_its_reason() -> None:
    with pytest.raises(
        AssertionError,
        match=r"oracle: oracle_action\(\) at turn 1 raised NotImplementedError: "
        r"GymnasiumTextEnv was built without an oracle",
    ):
        check_env(lambda: GymnasiumTextEnv("CliffWalking-v1"))


def test_blackjack_tuple_observations_render_with_the_default_renderer() -> None:
    env = GymnasiumTextEnv("Blackjack-v1", action_names=["stick", "hit"], max_turns=10)
    messages, _ = env.reset(seed=5)
    assert messages[0].content is not None and messages[0].content.startswith("(")  # str of the tuple
    result = env.step(say("<action>stick</action>"))
    assert result.terminated and result.reward in (-1.0, 0.0, 1.0, 1.5)
