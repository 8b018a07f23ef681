"""Rubrics: a reward as a weighted sum of named reward functions.

Each function receives, by parameter name, whatever the env passes to
:meth:`Rubric.score` (for example ``completion``, ``answer``, ``task``) and
returns a float. Only the arguments a function names are passed, so functions
stay small and reusable::

    rubric = Rubric([(correct, 1.0), (short, 0.1)])
    reward, parts = rubric.score(completion=text, answer=gold)   # parts: {"correct": 1.0, "short": 0.5}

A non-finite component is an error (it would poison training), never clipped.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.envs.errors import EnvContractError, EnvDefinitionError

__all__ = ["Rubric"]


class Rubric:
    """A weighted sum of reward functions; ``score`` returns (reward, {name: component})."""

    def __init__(self, funcs: Sequence[Callable[..., float] | tuple[Callable[..., float], float]]) -> None:
        self.funcs: list[tuple[str, Callable[..., float], float, set[str] | None]] = []
        for item in funcs:
            fn, weight = item if isinstance(item, tuple) else (item, 1.0)
            params = inspect.signature(fn).parameters
            names = None if any(p.kind is p.VAR_KEYWORD for p in params.values()) else set(params)
            self.funcs.append((getattr(fn, "__name__", repr(fn)), fn, float(weight), names))
        if not self.funcs:
            raise EnvDefinitionError(
                "a Rubric needs at least one reward function; pass Rubric([fn]) or Rubric([(fn, weight)])"
            )

    @property
    def bounds(self) -> tuple[float, float]:
        """The reward range if every component lies in [0, 1]."""
        lo = sum(min(0.0, w) for _, _, w, _ in self.funcs)
        hi = sum(max(0.0, w) for _, _, w, _ in self.funcs)
        return lo, hi

    def score(self, **context: Any) -> tuple[float, dict[str, float]]:
        parts: dict[str, float] = {}
        total = 0.0
        for name, fn, weight, names in self.funcs:
            kwargs = context if names is None else {k: v for k, v in context.items() if k in names}
            value = float(fn(**kwargs))
            if not math.isfinite(value):
                raise EnvContractError(f"reward function {name!r} returned {value!r}; rewards must be finite")
            parts[name] = value
            total += weight * value
        return total, parts
