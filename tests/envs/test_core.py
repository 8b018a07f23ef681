"""The Env lifecycle the base class enforces: seeding, turn limit, errors, async."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from agentrl.envs import (
    Env,
    EnvContractError,
    EpisodeDoneError,
    InvalidActionError,
    ResetNeededError,
    StepResult,
)
from agentrl.types import Message


class Counter(Env):
    """Multi-turn: say the next number; reward 1 when reaching `goal`."""

    max_turns = 3

    def __init__(self, goal: int = 2, bad_reward: float | None = None) -> None:
        self.goal, self.bad_reward = goal, bad_reward

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        self.n = int(self.np_random.integers(100))
        self.count = 0
        return [Message(role="user", content=f"start {self.n}")], {"n": self.n}

    def _step(self, action: Message) -> StepResult:
        if self.bad_reward is not None:
            return StepResult([], self.bad_reward, True)
        self.count += 1
        done = self.count >= self.goal
        return StepResult([Message(role="user", content="more")], float(done), done)

    def oracle_action(self) -> Message:
        return Message(role="assistant", content="next")


A = Message(role="assistant", content="x")


def test_same_seed_same_episode_and_step_returns_five_tuple() -> None:
    env = Counter()
    first = env.reset(seed=3)
    assert env.reset(seed=3) == first
    obs, reward, terminated, truncated, info = env.step(A)
    assert obs == [Message(role="user", content="more")]
    assert (reward, terminated, truncated, info["turn"]) == (0.0, False, False, 1)


def test_turn_limit_truncates_and_step_after_end_is_an_error() -> None:
    env = Counter(goal=10)
    env.reset(seed=0)
    results = [env.step(A) for _ in range(3)]
    assert [r.truncated for r in results] == [False, False, True]
    assert not results[-1].terminated and env.done
    with pytest.raises(EpisodeDoneError, match=r"Counter.step\(\) called after the episode ended at turn 3"):
        env.step(A)
    env.reset(seed=0)  # a new episode starts cleanly
    assert env.turn == 0 and not env.done


def test_step_before_reset_and_bad_actions() -> None:
    with pytest.raises(ResetNeededError, match="called before reset"):
        Counter().step(A)
    env = Counter()
    env.reset(seed=0)
    with pytest.raises(InvalidActionError, match="got role='user'"):
        env.step(Message(role="user", content="hi"))
    with pytest.raises(InvalidActionError, match="got str"):
        env.step("hi")  # type: ignore[arg-type]
    assert env.step({"role": "assistant", "content": "x"}).reward == 0.0  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_reward_is_a_contract_error(bad: float) -> None:
    env = Counter(bad_reward=bad)
    env.reset(seed=0)
    with pytest.raises(EnvContractError, match="non-finite reward"):
        env.step(A)


class Slow(Counter):
    in_flight = 0
    most_in_flight = 0
    lock = threading.Lock()

    def _step(self, action: Message) -> StepResult:
        with Slow.lock:
            Slow.in_flight += 1
            Slow.most_in_flight = max(Slow.most_in_flight, Slow.in_flight)
        time.sleep(0.2)  # sync, blocking code
        with Slow.lock:
            Slow.in_flight -= 1
        return StepResult([], 1.0, True)


def test_async_methods_run_sync_code_off_the_event_loop() -> None:
    async def main() -> tuple[float, int]:
        envs = [Slow() for _ in range(4)]
        for e in envs:
            await e.areset(seed=1)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.create_task(ticker())
        start = time.perf_counter()
        results = await asyncio.gather(*(e.astep(A) for e in envs))
        elapsed = time.perf_counter() - start
        t.cancel()
        assert all(r.reward == 1.0 for r in results)
        return elapsed, ticks

    Slow.most_in_flight = 0
    _, ticks = asyncio.run(main())
    assert Slow.most_in_flight == 4  # the four blocking steps overlapped (counted, not timed)
    assert ticks >= 5  # the loop kept running while env code slept
    assert threading.main_thread().is_alive()
