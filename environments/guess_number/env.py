"""Guess the number: multi-turn, with higher/lower feedback.

The env picks a secret integer in ``1..high`` from the seed. Each turn the model
replies ``<guess>N</guess>``; the env answers "higher" or "lower" until the guess
is right (reward 1.0, terminated) or ``max_turns`` runs out (reward 0,
truncated). A reply without a valid guess gets feedback and is counted in
``info["invalid_guesses"]``. The default ``max_turns`` is what binary search
needs (⌊log2 high⌋ + 1) plus one spare, so the oracle — bisection over the
interval the feedback leaves — always wins.

``step_reward`` (default 0) adds an intermediate reward for what each guess teaches: the bits
it cuts from the interval the feedback leaves open, ``step_reward * log2(before / after) /
log2(high)`` (the right guess cuts it to one number). The sum telescopes, so a solved episode
earns exactly ``1 + step_reward`` however many turns it took (potential-based shaping, Ng et al.
1999: no reward for dragging an episode out), while its turns are paid unevenly, when each
earned it: the case turn-level credit (``--advantage-level turn``) is for.
"""

from __future__ import annotations

import math
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
        self.reward_range = (0.0, 1.0 + step_reward)
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
        before = self.hi - self.lo + 1
        if guess == self.secret:
            return StepResult([], 1.0 + self._bits(before, 1), True, False, self._info(solved=True))
        if guess < self.secret:
            self.lo = max(self.lo, guess + 1)
            text = f"{guess} is too low: higher."
        else:
            self.hi = min(self.hi, guess - 1)
            text = f"{guess} is too high: lower."
        reward = self._bits(before, self.hi - self.lo + 1)
        return StepResult([Message(role="user", content=text)], reward, False, False, self._info())

    def _bits(self, before: int, after: int) -> float:
        """``step_reward`` times the share of the task's information a guess gained."""
        if not self.step_reward or after >= before:
            return 0.0
        return self.step_reward * math.log2(before / after) / math.log2(self.high)

    def _info(self, solved: bool = False) -> dict[str, Any]:
        return {"solved": solved, "invalid_guesses": self.invalid_guesses}

    def oracle_action(self) -> Message:
        return Message(role="assistant", content=f"<guess>{(self.lo + self.hi) // 2}</guess>")
