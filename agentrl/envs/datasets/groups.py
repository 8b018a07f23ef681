"""Group rewards: a reward function that scores a task's G completions together (a group judge).

A reward function whose ``group_reward`` attribute is true (``GroupJudgeReward`` sets it) is not
called once per episode: the dataset env's episodes of one task (same split and row) that finish
on the same event loop wait for each other, and the function is called once with their
completions as one batch, when ``group_size`` have arrived or ``window_s`` after the latest
arrival, whichever comes first. A group thus grades together even when its episodes end at
different times; an episode retried after an infrastructure failure, or played alone (a greedy
evaluation), is graded with whatever else of its task arrives in its window, or alone.
A failure of the call is every waiting episode's failure.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass, field
from typing import Any

from agentrl.envs.datasets.rewards import RewardFn, call_reward

__all__ = ["grouped_call", "is_group_reward"]

WINDOW_S = 2.0
"""how long a partial group waits for the next of its episodes before it is graded as it is"""


def is_group_reward(reward: RewardFn) -> bool:
    return bool(getattr(reward.fn, "group_reward", False))


@dataclass
class _Batch:
    completions: list[Any] = field(default_factory=list)
    prompts: list[Any] = field(default_factory=list)
    columns: list[dict[str, list[Any]]] = field(default_factory=list)
    futures: list[asyncio.Future[float]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


_batches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Any, ...], _Batch]] = (
    weakref.WeakKeyDictionary()
)


async def grouped_call(
    reward: RewardFn,
    key: tuple[Any, ...],
    completion: Any,
    prompt: Any,
    columns: dict[str, list[Any]],
    where: str,
    group_size: int,
    window_s: float | None = None,
) -> float:
    """This episode's score from one call over its task's group (see the module docstring)."""
    loop = asyncio.get_running_loop()
    pending = _batches.setdefault(loop, {})
    key = (id(reward.fn), *key)
    batch = pending.get(key)
    if batch is None:
        batch = pending[key] = _Batch()
    future: asyncio.Future[float] = loop.create_future()
    batch.completions.append(completion)
    batch.prompts.append(prompt)
    batch.columns.append(columns)
    batch.futures.append(future)
    if batch.timer is not None:
        batch.timer.cancel()
    if len(batch.futures) >= group_size:
        _start(loop, pending, key, reward, where)
    else:
        wait = WINDOW_S if window_s is None else window_s
        batch.timer = loop.call_later(wait, _start, loop, pending, key, reward, where)
    return await future


def _start(
    loop: asyncio.AbstractEventLoop,
    pending: dict[tuple[Any, ...], _Batch],
    key: tuple[Any, ...],
    reward: RewardFn,
    where: str,
) -> None:
    batch = pending.pop(key, None)
    if batch is not None:
        loop.create_task(_grade(batch, reward, where))


async def _grade(batch: _Batch, reward: RewardFn, where: str) -> None:
    names = batch.columns[0].keys()
    columns = {k: [v for c in batch.columns for v in c.get(k, [None])] for k in names}
    try:
        scores = await call_reward(
            reward, batch.completions, batch.prompts, columns, f"{where} (a group of {len(batch.futures)})"
        )
    except BaseException as e:  # noqa: BLE001 - every waiting episode gets the failure
        for f in batch.futures:
            if not f.done():
                f.set_exception(e)
        return
    for f, score in zip(batch.futures, scores, strict=True):
        if not f.done():  # an episode cancelled (its deadline) while it waited
            f.set_result(score)
