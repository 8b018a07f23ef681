"""FrozenLake as a text env, through the gymnasium bridge.

Each episode draws a new solvable ``size``×``size`` map (gymnasium's
``generate_random_map``) from the seed. The lake is not slippery, so the gold
policy (a breadth-first shortest path to the goal) always reaches reward 1.
The model replies ``<action>left|down|right|up</action>``; anything else gets
feedback and counts as an invalid action.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import gymnasium
from gymnasium.envs.toy_text.frozen_lake import generate_random_map

from agentrl.envs.gym_bridge import GymnasiumTextEnv

__all__ = ["FrozenLakeEnv", "render", "shortest_path_action"]

ACTIONS = ["left", "down", "right", "up"]
_MOVES = [(0, -1), (1, 0), (0, 1), (-1, 0)]
INSTRUCTIONS = (
    "You are A on a frozen lake. Reach G without stepping into a hole H (F is safe ice). "
    "Reply with one move: <action>left</action>, <action>down</action>, <action>right</action> "
    "or <action>up</action>."
)


def _grid(env: gymnasium.Env[Any, Any]) -> list[list[str]]:
    return [[c.decode() for c in row] for row in env.unwrapped.desc]  # type: ignore[attr-defined]


def render(obs: Any, env: gymnasium.Env[Any, Any]) -> str:
    grid = _grid(env)
    ncol = len(grid[0])
    r, c = divmod(int(obs), ncol)
    grid[r][c] = "A"
    return "\n".join(" ".join(row) for row in grid)


def shortest_path_action(env: gymnasium.Env[Any, Any]) -> int:
    """First move of a shortest hole-free path from the agent to the goal."""
    grid = _grid(env)
    nrow, ncol = len(grid), len(grid[0])
    start = divmod(int(env.unwrapped.s), ncol)  # type: ignore[attr-defined]
    first: dict[tuple[int, int], int | None] = {start: None}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        if grid[r][c] == "G":
            move = first[(r, c)]
            assert move is not None, "the agent is already on the goal"
            return move
        for a, (dr, dc) in enumerate(_MOVES):
            nr, nc = r + dr, c + dc
            if 0 <= nr < nrow and 0 <= nc < ncol and grid[nr][nc] != "H" and (nr, nc) not in first:
                first[(nr, nc)] = a if first[(r, c)] is None else first[(r, c)]
                queue.append((nr, nc))
    raise ValueError("no path to the goal")


class FrozenLakeEnv(GymnasiumTextEnv):
    """A random non-slippery FrozenLake map per episode, played in text."""

    def __init__(self, size: int = 4, frozen_prob: float = 0.8, max_turns: int | None = None) -> None:
        if not 2 <= size <= 12:
            raise ValueError(f"size must be 2..12, got {size}")

        def build(seed: int) -> gymnasium.Env[Any, Any]:
            desc = generate_random_map(size=size, p=frozen_prob, seed=seed)
            return gymnasium.make("FrozenLake-v1", desc=desc, is_slippery=False)

        super().__init__(
            build,
            action_names=ACTIONS,
            render=render,
            instructions=INSTRUCTIONS,
            oracle=shortest_path_action,
            max_turns=max_turns or 2 * size * size,
        )
