"""DAPO's refill: with dynamic sampling, play new tasks until a step has ``tasks_per_step`` informative groups.

Dynamic sampling (``algo.dynamic_sampling``, :func:`agentrl.trainer.algorithm.advantages`) drops
the groups whose raw rewards are all equal: they have no signal. Without a refill a step would
then train on fewer groups, and fewer still as the policy gets most tasks always right or always
wrong. DAPO (Yu et al. 2025, Algorithm 1) keeps sampling until the batch is full; :func:`refill`
does that in bounded rounds (``algo.max_refill_rounds``)::

    res, cursor = refill(res, seeds, play, target=T, rounds=R, cursor=c, seed_limit=eval_seed_offset)

Each round plays new tasks, the next seeds of the run's task cursor: as many as the missing groups
divided by the share of informative groups so far (at most ``T`` a round, DAPO's generation batch),
until ``T`` groups are informative. A group lost to an infrastructure failure is missing too, and
is replaced the same way. Informative groups beyond ``T`` (a round's surplus) are played but not
trained, and counted. The cursor is the run's data position: a checkpoint saves it, so a resumed
run plays the same tasks, every task once. Metrics: ``rollout/refill_rounds``,
``rollout/groups_refilled`` (informative groups the refill added), ``rollout/groups_surplus`` and
``rollout/groups_informative`` (what the step trains on; below ``T`` only when the rounds ran out).

The asynchronous rollout (``rollout.max_staleness > 0``) does not refill: its groups are played
ahead by :mod:`agentrl.trainer.service` before the step filters them (the config refuses an
explicit ``max_refill_rounds`` there).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import torch

from agentrl.errors import ConfigError
from agentrl.trainer import losses as L
from agentrl.trainer.rollout import Episode, RolloutResult, merge_results

__all__ = ["informative", "refill"]


def informative(group: Sequence[Episode]) -> bool:
    """Whether dynamic sampling keeps ``group``: its episodes' raw rewards are not all equal."""
    rewards = torch.tensor([e.reward for e in group], dtype=torch.float64)
    return bool(L.dynamic_sampling_keep(rewards, torch.zeros(len(group), dtype=torch.long)).any())


def refill(
    res: RolloutResult,
    seeds: Sequence[int],
    play: Callable[[list[int]], list[RolloutResult]],
    *,
    target: int,
    rounds: int,
    cursor: int,
    seed_limit: int,
) -> tuple[RolloutResult, int]:
    """``res`` (the step's tasks ``seeds``) topped up to ``target`` informative groups; and the new cursor.

    ``play(seeds)`` plays those task seeds and returns every rank's share of the result (the same
    on every rank, so every rank takes the same decisions). ``cursor`` is the next task seed;
    seeds from ``seed_limit`` on are held out (evaluation), and reaching them is an error.
    """
    t0 = time.perf_counter()
    seconds = res.metrics.get("rollout/seconds", 0.0)
    all_seeds, played, done = list(seeds), len(seeds), 0
    have = sum(informative(g) for g in res.groups)
    first = have
    while have < target and done < rounds:
        n = min(target, math.ceil((target - have) * played / have) if have else target)
        new = list(range(cursor, cursor + n))
        if new[-1] >= seed_limit:
            raise ConfigError(
                f"the refill of dynamic sampling reached task seed {new[-1]}, where the held-out evaluation "
                f"seeds start (rollout.eval_seed_offset={seed_limit}); raise --eval-seed-offset or lower "
                "--max-refill-rounds"
            )
        parts = play(new)
        all_seeds += new
        cursor, played, done = cursor + n, played + n, done + 1
        res = merge_results([res, *parts], all_seeds)
        have = sum(informative(g) for g in res.groups)
    surplus = max(0, have - target)
    if surplus:  # the last informative groups played: a round's excess over the batch
        keep, drop = [], surplus
        for g in reversed(res.groups):
            if drop and informative(g):
                drop -= 1
                continue
            keep.append(g)
        res.set_aside += [g for g in res.groups if not any(g is k for k in keep)]
        res.groups = keep[::-1]
    res.metrics.update(
        {
            "rollout/seconds": seconds + (time.perf_counter() - t0 if done else 0.0),
            "rollout/refill_rounds": float(done),
            "rollout/groups_refilled": float(have - surplus - first),
            "rollout/groups_surplus": float(surplus),
            "rollout/groups_informative": float(have - surplus),
        }
    )
    return res, cursor
