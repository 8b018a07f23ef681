"""The environment contract: :class:`Env`, a text (chat-message) ``gymnasium.Env``.

An episode is ``reset`` followed by ``step`` calls, one per assistant turn::

    messages, info = env.reset(seed=7)                  # list[Message]: the prompt
    messages, reward, terminated, truncated, info = env.step(assistant_message)

``messages`` returned by ``step`` are what the environment appends to the
conversation (tool results, user feedback); they may be empty. ``reward`` is the
reward of that env step, computed by the environment and never by anything the
agent controls. ``terminated`` means the task is over (solved or failed);
``truncated`` means the turn limit ``max_turns`` was hit first.

Subclasses implement two hooks and leave ``reset``/``step`` to the base class,
which enforces the lifecycle (no step before reset or after the end, turn
counting, truncation, finite rewards)::

    class Echo(Env):
        def _reset(self, options):        # self.np_random is already seeded
            return [Message(role="user", content="say hi")], {}
        def _step(self, action):
            return StepResult([], float(action.content == "hi"), True)
        def oracle_action(self):
            return Message(role="assistant", content="hi")

Class attributes every subclass may set (defaults in brackets):

- ``max_turns`` [1]: assistant turns before the episode is truncated.
- ``reward_range`` [(0.0, 1.0)]: bounds of every step reward *and* of the episode
  return (sum of step rewards); the oracle episode must reach the upper bound.
- ``deterministic`` [True]: same seed ⇒ same episode (``check_env`` verifies it).

``oracle_action()`` returns the gold assistant message for the current state, so a
gold episode is ``reset`` then ``step(oracle_action())`` until done. It feeds the
trainer's supervised warm start and ``check_env``.

``areset``/``astep`` run the sync methods in a worker thread so a slow env never
blocks an event loop; an env with native async code overrides them.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, ClassVar, NamedTuple

import gymnasium
import numpy as np

from agentrl.envs.errors import (
    EnvContractError,
    EpisodeDoneError,
    InvalidActionError,
    ResetNeededError,
)
from agentrl.types import Message, ToolSpec

__all__ = ["Env", "MessageSpace", "MessagesSpace", "StepResult", "coerce_action"]


class StepResult(NamedTuple):
    """What ``Env.step`` returns; a plain 5-tuple, so ``obs, r, term, trunc, info = env.step(a)`` works."""

    messages: list[Message]
    reward: float
    terminated: bool
    truncated: bool = False
    info: dict[str, Any] = {}  # never mutated: Env.step always returns a fresh dict


class MessageSpace(gymnasium.spaces.Space[Message]):
    """The action space of every agentrl env: one assistant :class:`Message`."""

    def __init__(self) -> None:
        super().__init__(shape=None, dtype=None)

    def contains(self, x: Any) -> bool:
        return isinstance(x, Message) and x.role == "assistant"

    def sample(self, mask: Any = None, probability: Any = None) -> Message:
        return Message(role="assistant", content="")

    def __repr__(self) -> str:
        return "MessageSpace()"


class MessagesSpace(gymnasium.spaces.Space[list[Message]]):
    """The observation space of every agentrl env: a list of :class:`Message`."""

    def __init__(self) -> None:
        super().__init__(shape=None, dtype=None)

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and all(isinstance(m, Message) for m in x)

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        return []

    def __repr__(self) -> str:
        return "MessagesSpace()"


def coerce_action(action: Any) -> Message:
    """Accept a :class:`Message` or its dict form; anything else (or a non-assistant role) is an error."""
    if isinstance(action, dict):
        try:
            action = Message.model_validate(action)
        except ValueError as e:
            raise InvalidActionError(f"the action is not a valid Message: {e}") from None
    if not isinstance(action, Message):
        raise InvalidActionError(
            f"step() takes an assistant Message, got {type(action).__name__}: {action!r:.80}; "
            "wrap text as Message(role='assistant', content=...)"
        )
    if action.role != "assistant":
        raise InvalidActionError(
            f"step() takes an assistant message, got role={action.role!r}; the action is what the model said"
        )
    return action


class Env(gymnasium.Env[list[Message], Message]):
    """A text environment: observations are lists of chat messages, actions are assistant messages."""

    max_turns: int = 1
    reward_range: tuple[float, float] = (0.0, 1.0)
    deterministic: bool = True
    inline_steps: ClassVar[bool] = False
    """True when ``reset`` and ``step`` are pure computation well under a millisecond (no I/O,
    no sleeps, no subprocesses, no tools that wait): ``areset``/``astep`` then run them on the
    caller's event loop instead of handing each call to a worker thread. Leave it False for
    anything that may block; a blocking step set inline stalls every episode of the loop."""
    observation_space = MessagesSpace()
    action_space = MessageSpace()

    # Lifecycle state; instance attributes once reset() ran.
    _turn: int = 0
    _started: bool = False
    _done: bool = False

    # ------------------------------------------------------------------ hooks
    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        """Start a new episode; ``self.np_random`` is seeded. Return the prompt messages and info."""
        raise NotImplementedError(f"{type(self).__name__} must implement _reset(options)")

    def _step(self, action: Message) -> StepResult:
        """Apply one assistant turn; the base class handles turn counting and truncation."""
        raise NotImplementedError(f"{type(self).__name__} must implement _step(action)")

    def oracle_action(self) -> Message:
        """The gold assistant message for the current state (used for warm starts and ``check_env``)."""
        raise NotImplementedError(f"{type(self).__name__} has no oracle_action()")

    @property
    def tools(self) -> list[ToolSpec]:
        """Tools the model may call, as OpenAI function specs; plain envs have none."""
        return []

    # --------------------------------------------------------------- contract
    @property
    def turn(self) -> int:
        """Assistant turns taken in the current episode."""
        return self._turn

    @property
    def done(self) -> bool:
        """True once the current episode terminated or was truncated."""
        return self._done

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        super().reset(seed=seed)
        self._turn = 0
        self._done = False
        self._started = True
        out = self._reset(dict(options or {}))
        if not (isinstance(out, tuple) and len(out) == 2):
            raise EnvContractError(
                f"{type(self).__name__}._reset must return (list[Message], dict), got {type(out).__name__}"
            )
        messages, info = out
        _check_messages(self, "_reset", messages)
        return list(messages), dict(info)

    def step(self, action: Message) -> StepResult:
        if not self._started:
            raise ResetNeededError(
                f"{type(self).__name__}.step() called before reset(); call env.reset(seed=...) first"
            )
        if self._done:
            raise EpisodeDoneError(
                f"{type(self).__name__}.step() called after the episode ended at turn {self._turn}; "
                "call env.reset() to start a new episode"
            )
        action = coerce_action(action)
        self._turn += 1
        out = self._step(action)
        if not (isinstance(out, tuple) and len(out) == 5):
            raise EnvContractError(
                f"{type(self).__name__}._step must return a StepResult, got {type(out).__name__}"
            )
        messages, reward, terminated, truncated, info = out
        _check_messages(self, "_step", messages)
        if isinstance(reward, (bool, np.bool_)) or not isinstance(reward, (int, float, np.number)):
            raise EnvContractError(
                f"{type(self).__name__}._step returned reward {reward!r}; it must be a float"
            )
        reward = float(reward)
        if not math.isfinite(reward):
            raise EnvContractError(
                f"{type(self).__name__}._step returned a non-finite reward {reward!r}; rewards must be finite"
            )
        terminated, truncated = bool(terminated), bool(truncated)
        if not terminated and self._turn >= self.max_turns:
            truncated = True
        info = dict(info)
        info.setdefault("turn", self._turn)
        self._done = terminated or truncated
        return StepResult(list(messages), reward, terminated, truncated, info)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """``reset`` in a worker thread, so sync env code never blocks the event loop (inline if ``inline_steps``)."""
        if self.inline_steps:
            return self.reset(seed=seed, options=options)
        return await asyncio.to_thread(self.reset, seed=seed, options=options)

    async def astep(self, action: Message) -> StepResult:
        """``step`` in a worker thread, so sync env code never blocks the event loop (inline if ``inline_steps``)."""
        if self.inline_steps:
            return self.step(action)
        return await asyncio.to_thread(self.step, action)


def _check_messages(env: Env, where: str, messages: Any) -> None:
    if not isinstance(messages, list) or not all(isinstance(m, Message) for m in messages):
        raise EnvContractError(
            f"{type(env).__name__}.{where} must return a list of agentrl.Message, got {messages!r:.120}"
        )
