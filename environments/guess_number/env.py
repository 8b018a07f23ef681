"""Guess the number: multi-turn, with higher/lower feedback.

The env picks a secret integer in ``1..high`` from the seed. Each turn the model
replies ``<guess>N</guess>``; the env answers "higher" or "lower" until the guess
is right (reward 1.0, terminated) or ``max_turns`` runs out (reward 0,
truncated). A reply without a valid guess gets feedback and is counted in
``info["invalid_guesses"]``. The default ``max_turns`` is what binary search
needs (⌊log2 high⌋ + 1) plus one spare, so the oracle — bisection over the
interval the feedback leaves — always wins.

``step_reward`` (default 0) adds an intermediate reward: a wrong guess inside the interval the
feedback leaves open (a guess that uses the feedback) earns it at once, so an episode's turns
are rewarded unevenly, the case turn-level credit (``--advantage-level turn``) is for.
"""

from __future__ import annotations

import re
from typing import Any

from agentrl.envs import Env, StepResult
from agentrl.types import Message

__all__ = ["GuessNumberEnv"]

_GUESS_RE = re.compile(r"<guess>\s*(-?\d+)\s*</guess>")


class GuessNumberEnv(Env):
    """Find a secret integer with higher/lower feedback."""

    reward_range = (0.0, 1.0)
    inline_steps = True  # pure computation in microseconds: no thread hand-off per step

    def __init__(self, high: int = 16, max_turns: int | None = None, step_reward: float = 0.0) -> None:
        if high < 2:
            raise ValueError(f"high must be ≥ 2, got {high}")
        if not 0 <= step_reward <= 1:
            raise ValueError(f"step_reward must lie in [0, 1], got {step_reward}")
        self.high = high
        self.max_turns = max_turns or high.bit_length() + 1
        self.step_reward = step_reward
        self.reward_range = (0.0, 1.0 + step_reward * (self.max_turns - 1))
        self.secret = 0
        self.lo, self.hi = 1, high
        self.invalid_guesses = 0

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        self.secret = int(options.get("secret", self.np_random.integers(1, self.high + 1)))
        self.lo, self.hi = 1, self.high
        self.invalid_guesses = 0
        prompt = (
            f"I am thinking of an integer from 1 to {self.high}. Guess it in at most {self.max_turns} tries. "
            "Reply with <guess>N</guess>; I will say higher or lower."
        )
        return [Message(role="user", content=prompt)], {"high": self.high}

    def _step(self, action: Message) -> StepResult:
        found = _GUESS_RE.findall(action.content or "")
        if not found or not 1 <= int(found[-1]) <= self.high:
            self.invalid_guesses += 1
            seen = found[-1] if found else (action.content or "")[:40]
            text = f"Invalid guess {seen!r}: reply with <guess>N</guess> where N is from 1 to {self.high}."
            return StepResult([Message(role="user", content=text)], 0.0, False, False, self._info())
        guess = int(found[-1])
        if guess == self.secret:
            return StepResult([], 1.0, True, False, self._info(solved=True))
        reward = self.step_reward if self.lo <= guess <= self.hi else 0.0
        if guess < self.secret:
            self.lo = max(self.lo, guess + 1)
            text = f"{guess} is too low: higher."
        else:
            self.hi = min(self.hi, guess - 1)
            text = f"{guess} is too high: lower."
        return StepResult([Message(role="user", content=text)], reward, False, False, self._info())

    def _info(self, solved: bool = False) -> dict[str, Any]:
        return {"solved": solved, "invalid_guesses": self.invalid_guesses}

    def oracle_action(self) -> Message:
        return Message(role="assistant", content=f"<guess>{(self.lo + self.hi) // 2}</guess>")
