"""The gymnasium bridge: a discrete-action ``gymnasium.Env`` played as a text env.

:class:`GymnasiumTextEnv` renders each observation as a user message and parses
the assistant's reply into an action. The reply names the action inside
``<action>...</action>`` (or as the whole reply): by name (case-insensitive) or
by index. A reply that names no valid action is a *model* error: the model gets
a user message saying what was wrong and which actions exist, the episode goes
on (the turn still counts toward ``max_turns``), and ``info["invalid_actions"]``
counts it. Rewards are the wrapped env's rewards.

The wrapped env may be given as an instance, or as a function ``seed -> env``
called on every reset (so each episode can have, e.g., a new random map). Its
``reset`` gets a seed drawn from ``self.np_random``, so ``reset(seed=s)`` replays
the same episode.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np

from agentrl.envs.core import Env, StepResult
from agentrl.envs.errors import EnvDefinitionError
from agentrl.types import Message

__all__ = ["GymnasiumTextEnv"]

_ACTION_RE = re.compile(r"<action>(.*?)</action>", re.S | re.I)


class GymnasiumTextEnv(Env):
    """Wrap a gymnasium env with a ``Discrete`` action space as a chat env.

    Args:
        env: a gymnasium env, a gymnasium id, or a function ``seed -> env`` called at every reset.
        action_names: one name per action index (default: the indices as strings).
        render: observation → text (default ``str(obs)``); it also receives the wrapped env.
        instructions: text placed before the first observation.
        oracle: wrapped env → gold action index, for warm starts and ``check_env``.
        max_turns: assistant turns before truncation.
        reward_range: declared bounds of the reward.
    """

    def __init__(
        self,
        env: gymnasium.Env[Any, Any] | str | Callable[[int], gymnasium.Env[Any, Any]],
        *,
        action_names: list[str] | None = None,
        render: Callable[[Any, gymnasium.Env[Any, Any]], str] | None = None,
        instructions: str = "",
        oracle: Callable[[gymnasium.Env[Any, Any]], int] | None = None,
        max_turns: int = 20,
        reward_range: tuple[float, float] = (0.0, 1.0),
    ) -> None:
        if isinstance(env, str):
            env = gymnasium.make(env)
        self._factory = None if isinstance(env, gymnasium.Env) else env
        self.inner: gymnasium.Env[Any, Any] = env if isinstance(env, gymnasium.Env) else env(0)
        space = self.inner.action_space
        if not isinstance(space, gymnasium.spaces.Discrete):
            raise EnvDefinitionError(
                f"GymnasiumTextEnv needs a Discrete action space, got {space}; "
                "continuous or composite actions have no single-token text form"
            )
        self.n_actions = int(space.n)
        self.start = int(space.start)
        names = action_names or [str(self.start + i) for i in range(self.n_actions)]
        if len(names) != self.n_actions:
            raise EnvDefinitionError(
                f"action_names has {len(names)} names for {self.n_actions} actions; pass one name per action"
            )
        self.action_names = list(names)
        self._render = render or (lambda obs, _env: str(obs))
        self.instructions = instructions
        self._oracle = oracle
        self.max_turns = max_turns
        self.reward_range = reward_range
        self.invalid_actions = 0

    def parse_action(self, text: str) -> int | str:
        """The action index named in ``text``, or a message saying why there is none."""
        found = _ACTION_RE.findall(text)
        choice = (found[-1] if found else text).strip().lower()
        for i, name in enumerate(self.action_names):
            if choice == name.lower():
                return self.start + i
        if re.fullmatch(r"-?\d+", choice) and self.start <= int(choice) < self.start + self.n_actions:
            return int(choice)
        options = ", ".join(self.action_names)
        return (
            f"Invalid action {choice[:40]!r}. Reply with exactly one of: {options}, "
            f"e.g. <action>{self.action_names[0]}</action>."
        )

    def _reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        seed = int(self.np_random.integers(2**31 - 1))
        if self._factory is not None:
            self.inner.close()
            self.inner = self._factory(seed)
        obs, info = self.inner.reset(seed=seed, options=options or None)
        self.invalid_actions = 0
        text = self._render(obs, self.inner)
        prompt = f"{self.instructions}\n\n{text}" if self.instructions else text
        return [Message(role="user", content=prompt)], {"inner_info": _jsonable(info)}

    def _step(self, action: Message) -> StepResult:
        parsed = self.parse_action(action.content or "")
        if isinstance(parsed, str):
            self.invalid_actions += 1
            feedback = Message(role="user", content=parsed)
            return StepResult([feedback], 0.0, False, False, {"invalid_actions": self.invalid_actions})
        obs, reward, terminated, truncated, info = self.inner.step(parsed)
        messages = (
            [] if terminated or truncated else [Message(role="user", content=self._render(obs, self.inner))]
        )
        info = {"invalid_actions": self.invalid_actions, "action": parsed, "inner_info": _jsonable(info)}
        return StepResult(messages, float(reward), bool(terminated), bool(truncated), info)

    def oracle_action(self) -> Message:
        if self._oracle is None:
            raise NotImplementedError(f"{type(self).__name__} was built without an oracle")
        index = self._oracle(self.inner)
        return Message(role="assistant", content=f"<action>{self.action_names[index - self.start]}</action>")

    def close(self) -> None:
        self.inner.close()


def _jsonable(info: dict[str, Any]) -> dict[str, Any]:
    """The JSON-safe part of a gymnasium info dict (numpy scalars and arrays converted)."""
    out: dict[str, Any] = {}
    for k, v in info.items():
        if isinstance(v, np.ndarray):
            v = v.tolist()
        elif isinstance(v, np.generic):
            v = v.item()
        if isinstance(v, (str, int, float, bool, list)) or v is None:
            out[str(k)] = v
    return out
