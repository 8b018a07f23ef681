"""OpenEnvRemoteEnv against envs written with OpenEnv's own server library, served on 127.0.0.1 in the test."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

from agentrl.envs import EnvConnectionError, EnvServerError, ServerBusyError, make
from agentrl.envs.remote.openenv import OpenEnvRemoteEnv, detect_protocol, discover, render
from agentrl.envs.server import ServerConfig
from agentrl.envs.server import create_app as agentrl_app
from agentrl.httpkit import BackgroundServer
from agentrl.types import FunctionCall, Message, ToolCall


# ---------------------------------------------------------------- two OpenEnv envs
class WordAction(Action):
    text: str


class WordObservation(Observation):
    prompt: str


class ReverseWord(Environment[WordAction, WordObservation, State]):
    """Reply with the word reversed: one turn, reward 1 when right."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State()
        self.word = ""

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> WordObservation:
        self.word = random.Random(seed).choice(["abc", "hello", "rl", "token", "agent"])
        self._state = State(episode_id=episode_id, step_count=0)
        return WordObservation(prompt=f"Reverse the word {self.word!r}; reply with the reversed word only.")

    def step(self, action: WordAction, timeout_s: float | None = None, **kw: Any) -> WordObservation:
        self._state.step_count += 1
        right = action.text.strip() == self.word[::-1]
        return WordObservation(prompt="right" if right else "wrong", reward=float(right), done=True)

    @property
    def state(self) -> State:
        return self._state


class MoveAction(Action):
    dx: int
    dy: int


class GridObservation(Observation):
    x: int
    y: int
    goal: list[int]


class Walk(Environment[MoveAction, GridObservation, State]):
    """Walk to a goal with unit moves; reward 1 on arrival; a move longer than 1 raises (an env error)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.pos, self.goal, self._state = [0, 0], [2, 1], State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> GridObservation:
        self.pos, self.goal = [0, 0], list(kw.get("goal", [2, 1]))
        return GridObservation(x=0, y=0, goal=self.goal)

    def step(self, action: MoveAction, timeout_s: float | None = None, **kw: Any) -> GridObservation:
        if abs(action.dx) + abs(action.dy) > 1:
            raise RuntimeError("moves are one cell at a time")
        self.pos = [self.pos[0] + action.dx, self.pos[1] + action.dy]
        arrived = self.pos == self.goal
        return GridObservation(
            x=self.pos[0], y=self.pos[1], goal=self.goal, reward=float(arrived), done=arrived
        )

    @property
    def state(self) -> State:
        return self._state


@pytest.fixture(scope="module")
def reverse_url() -> Iterator[str]:
    app = create_fastapi_app(ReverseWord, WordAction, WordObservation, max_concurrent_envs=64)
    with BackgroundServer(app) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def walk_url() -> Iterator[str]:
    with BackgroundServer(
        create_fastapi_app(Walk, MoveAction, GridObservation, max_concurrent_envs=8)
    ) as srv:
        yield srv.url


def move(dx: int, dy: int, call_id: str = "c1") -> Message:
    args = json.dumps({"dx": dx, "dy": dy})
    return Message(
        role="assistant", tool_calls=[ToolCall(id=call_id, function=FunctionCall(name="act", arguments=args))]
    )


# ---------------------------------------------------------------- tests
def test_schema_becomes_one_tool_and_plain_text_fills_a_single_string_action(reverse_url: str) -> None:
    spec = discover(reverse_url)
    assert spec.text_field == "text" and not spec.passthrough
    assert spec.tool.function.name == "act"
    assert spec.tool.function.parameters["properties"] == {"text": {"title": "Text", "type": "string"}}
    assert detect_protocol(reverse_url) == "openenv"

    env = OpenEnvRemoteEnv(reverse_url, max_turns=1)
    try:
        for seed in range(4):
            messages, _ = env.reset(seed=seed)
            word = messages[0].content.split("'")[1]  # type: ignore[union-attr]
            assert messages == [
                Message(role="user", content=f"Reverse the word {word!r}; reply with the reversed word only.")
            ]
            out = env.step(Message(role="assistant", content=word[::-1]))
            assert (out.reward, out.terminated, out.messages[0].content) == (1.0, True, "right")
        env.reset(seed=0)
        out = env.step(Message(role="assistant", content="nope"))
        assert (out.reward, out.terminated, out.info["reward_given"]) == (0.0, True, True)
    finally:
        env.close()


def test_multi_turn_tool_episode_with_model_errors_as_data(walk_url: str) -> None:
    env = OpenEnvRemoteEnv(walk_url, max_turns=6, reset_options={"goal": [1, 1]})
    try:
        messages, _ = env.reset(seed=0)
        assert json.loads(messages[0].content or "") == {"goal": [1, 1], "x": 0, "y": 0}
        assert env.tools[0].function.parameters["required"] == ["dx", "dy"]
        # the model's mistakes are answered and the episode goes on, at reward 0
        no_action = env.step(Message(role="assistant", content="I will move right"))
        assert (
            no_action.reward == 0.0
            and not no_action.terminated
            and "call the tool 'act'" in (no_action.messages[0].content or "")
        )
        bad = Message(
            role="assistant",
            tool_calls=[ToolCall(id="x", function=FunctionCall(name="act", arguments='{"dx": "far"}'))],
        )
        invalid = env.step(bad)
        assert invalid.messages[0].role == "tool" and invalid.messages[0].tool_call_id == "x"
        assert (
            "invalid action" in (invalid.messages[0].content or "")
            and invalid.info["model_error"] == "invalid_action"
        )
        wrong_tool = env.step(
            Message(role="assistant", tool_calls=[ToolCall(id="y", function=FunctionCall(name="fly"))])
        )
        assert "unknown tool 'fly'" in (wrong_tool.messages[0].content or "")
        step = env.step(move(1, 0))
        assert (step.reward, step.terminated) == (0.0, False)
        assert step.messages[0].tool_call_id == "c1" and json.loads(step.messages[0].content or "")["x"] == 1
        calls = [c for cid in ("a", "b") for c in move(0, 1, cid).tool_calls or []]
        two = Message(role="assistant", tool_calls=calls)
        last = env.step(two)
        assert (last.reward, last.terminated) == (1.0, True)
        assert [m.tool_call_id for m in last.messages] == ["a", "b"] and "one action per turn" in (
            last.messages[1].content or ""
        )
    finally:
        env.close()


def test_env_errors_and_dead_servers_are_infrastructure_errors(walk_url: str) -> None:
    env = OpenEnvRemoteEnv(walk_url)
    try:
        env.reset(seed=0)
        with pytest.raises(EnvServerError, match="moves are one cell at a time") as e:
            env.step(move(5, 5))
        assert e.value.infra_error == "env_error"
    finally:
        env.close()
    dead = OpenEnvRemoteEnv("http://127.0.0.1:9", retries=1, backoff_s=0.01, connect_timeout=1)
    with pytest.raises(EnvConnectionError, match="cannot reach the OpenEnv server"):
        dead.reset(seed=0)


@pytest.mark.slow
def test_many_async_episodes_at_once(reverse_url: str) -> None:
    async def play(seed: int) -> float:
        env = OpenEnvRemoteEnv(reverse_url, max_turns=1)
        try:
            messages, _ = await env.areset(seed=seed)
            word = (messages[0].content or "").split("'")[1]
            return (await env.astep(Message(role="assistant", content=word[::-1]))).reward
        finally:
            await env.aclose()

    async def run() -> list[float]:
        return await asyncio.gather(*(play(s) for s in range(32)))

    assert asyncio.run(run()) == [1.0] * 32


def test_agentrl_env_through_its_own_openenv_surface_is_unchanged() -> None:
    """serve-env --protocol openenv, then driven back over OpenEnv's protocol: the checker still passes."""
    with BackgroundServer(agentrl_app(ServerConfig(env_ids=["calculator-v0"], protocol="openenv"))) as srv:
        assert detect_protocol(srv.url) == "openenv"
        remote = OpenEnvRemoteEnv(srv.url, max_turns=4)
        try:
            assert remote.server is None
            messages, _ = remote.reset(seed=3)
            local = make("calculator-v0")
            assert messages == local.reset(seed=3)[0] and remote.tools == local.tools
            total, done = 0.0, False
            while not done:
                a = local.oracle_action()
                local.step(a)
                out = remote.step(a)
                total, done = total + out.reward, out.terminated or out.truncated
            assert total == 1.0
        finally:
            remote.close()
    with BackgroundServer(agentrl_app(ServerConfig(env_ids=["countdown-v0"], protocol="both"))) as srv:
        assert detect_protocol(srv.url) == "agentrl"


def test_render_is_the_lone_string_or_sorted_json() -> None:
    assert render({"prompt": "hi", "metadata": {"x": 1}}) == "hi"
    assert render({"b": 1, "a": "x"}) == '{"a":"x","b":1}'


def test_a_full_openenv_server_is_busy_then_retried() -> None:
    with BackgroundServer(
        create_fastapi_app(Walk, MoveAction, GridObservation, max_concurrent_envs=1)
    ) as srv:
        first = OpenEnvRemoteEnv(srv.url)
        second = OpenEnvRemoteEnv(srv.url, retries=1, backoff_s=0.01)
        try:
            first.reset(seed=0)
            with pytest.raises(ServerBusyError, match="CAPACITY_REACHED"):
                second.reset(seed=0)
            first.close()
            deadline = (
                time.monotonic() + 10
            )  # the slot frees once the server handled the first socket's close
            while True:
                try:
                    messages, _ = second.reset(seed=0)
                    break
                except ServerBusyError:
                    assert time.monotonic() < deadline, "the closed session's slot was never freed"
            assert json.loads(messages[0].content or "")["x"] == 0
        finally:
            first.close()
            second.close()
