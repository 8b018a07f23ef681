"""The online difficulty filter (``--difficulty-filter``): skip tasks whose last play taught nothing.

A group whose G episodes all got the same reward (all solved, all failed) has no advantage
signal: GRPO trains nothing on it. Where a task comes back — a dataset's row in its next epoch,
a mixture's dataset source — the filter remembers how its last group went, and when the
synchronous loop draws the next step's tasks it skips a task whose last group was such a
group, so the step's rollout goes to tasks that can still teach. Bounds, so the filter can
neither starve a step nor bury a task for good:

- a task is skipped at most ``max_skips`` times in a row (then it is played again, and
  re-enters if the model changed);
- a step skips at most ``tasks_per_step`` tasks (it looks at no more than twice its tasks).

Tasks are known by the env's ``task_key(seed)`` (:class:`~agentrl.envs.datasets.DatasetEnv`:
the row; :class:`~agentrl.envs.mixture.MixtureEnv`: the source and its key); an env without it
never repeats a task and cannot be filtered. Skips are counted (``rollout/tasks_skipped``), and
the filter's memory is part of the checkpoint, so a resumed run skips what the uninterrupted
one would have.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.envs import Env
    from agentrl.trainer.config import TrainConfig
    from agentrl.trainer.results import Episode

__all__ = ["TaskFilter", "task_filter"]


class TaskFilter:
    """Which tasks to skip, from how each task's last group went (module docstring)."""

    def __init__(self, key_of: Callable[[int], str | None] | None, max_skips: int = 2) -> None:
        self.key_of = key_of or (lambda seed: None)
        self.enabled = key_of is not None
        self.max_skips = max_skips
        self.flat: dict[str, int] = {}
        """task key -> times skipped in a row since its last group, for tasks whose last group was flat"""

    def draw(self, cursor: int, n: int) -> tuple[list[int], int, int]:
        """(the next ``n`` seeds to play from ``cursor``, the new cursor, how many were skipped)."""
        if not self.enabled:
            return list(range(cursor, cursor + n)), cursor + n, 0
        seeds: list[int] = []
        skipped = 0
        while len(seeds) < n:
            key = self.key_of(cursor)
            if key is not None and key in self.flat and self.flat[key] < self.max_skips and skipped < n:
                self.flat[key] += 1
                skipped += 1
            else:
                seeds.append(cursor)
            cursor += 1
        return seeds, cursor, skipped

    def observe(self, groups: Sequence[Sequence[Episode]]) -> None:
        """Remember, for each played group's task, whether all its rewards were equal."""
        for group in groups if self.enabled else ():
            if not group:
                continue
            key = self.key_of(group[0].seed)
            if key is None:
                continue
            if len({round(e.reward, 9) for e in group}) == 1 and len(group) > 1:
                self.flat[key] = 0
            else:
                self.flat.pop(key, None)

    def state(self) -> dict[str, Any]:
        return {"flat": dict(self.flat)}

    def load(self, state: dict[str, Any] | None) -> None:
        self.flat = {str(k): int(v) for k, v in ((state or {}).get("flat") or {}).items()}


def task_filter(cfg: TrainConfig, env_factory: Callable[[], Env], saved: dict[str, Any] | None) -> TaskFilter:
    """The run's filter (``data.difficulty_filter``), keyed by a local env's ``task_key``; a
    pass-through one (every seed in turn) when off."""
    if not cfg.data.difficulty_filter:
        return TaskFilter(None)
    from agentrl.errors import ConfigError

    env = env_factory()
    key_of = getattr(env, "task_key", None)
    if key_of is None:
        env.close()
        raise ConfigError(
            f"data.difficulty_filter={cfg.data.difficulty_filter}: the env {cfg.rollout.env!r} does not name its "
            "tasks (no task_key), so no task ever comes back to be skipped; it works with --dataset and "
            "mixtures of datasets (served in this process, not at --env-url)"
        )
    picker = TaskFilter(key_of, cfg.data.difficulty_filter)
    picker.load(saved)
    return picker
