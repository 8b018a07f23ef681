"""Asynchronous rollout with a bounded staleness: the next steps' episodes play while the trainer updates.

With ``rollout.max_staleness = K > 0`` one background thread plays the rollouts of
steps in order, at most ``K`` steps ahead of the trainer::

    trainer:  [ train n-1 ][sync]      [ train n ][sync]      [ train n+1 ]...
    rollout:  [   rollout n    ][   rollout n+1    ][   rollout n+2   ]...     (K = 1)

The rollout of step ``s`` is submitted at the top of step ``s - K``, i.e. after the
trainer has synced ``s - K`` updates into the engine, so every token of it was sampled
by a policy at most ``K`` versions older than the one that trains on it (weights synced
while it runs reach the engine between two decode steps, and its later tokens carry the
newer version). The update corrects for the lag with the importance ratio against the
recorded rollout logprobs, which the PPO-style losses clip.

Evaluations go through the same thread (after the rollouts already queued), so the
session manager and the env factory are never driven from two threads at once.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any, TypeVar

from agentrl.errors import ConfigError
from agentrl.trainer.errors import TrainerError
from agentrl.trainer.rollout import RolloutResult

__all__ = ["RolloutAhead"]

T = TypeVar("T")


class RolloutAhead:
    """Rollouts of steps ``first .. end - 1`` produced by one thread, up to ``max_staleness`` steps ahead.

    ``produce(step)`` plays one step's rollout. :meth:`take` returns the steps' results in
    order; :meth:`call` runs anything else that needs the sessions (an evaluation) on the
    same thread. Every wait has a deadline of ``timeout_s`` per job queued ahead of it.
    """

    def __init__(
        self,
        produce: Callable[[int], RolloutResult],
        *,
        first: int,
        end: int,
        max_staleness: int,
        timeout_s: float,
    ) -> None:
        if max_staleness < 1:
            raise ConfigError(
                f"max_staleness={max_staleness}: RolloutAhead needs >= 1 (0 is the synchronous loop)"
            )
        self.produce, self.end, self.max_staleness, self.timeout_s = produce, end, max_staleness, timeout_s
        self._next = first  # the next step to submit
        self._futures: dict[int, concurrent.futures.Future[tuple[RolloutResult, float]]] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="agentrl-rollout"
        )

    def _timed(self, step: int) -> tuple[RolloutResult, float]:
        t0 = time.perf_counter()
        res = self.produce(step)
        return res, time.perf_counter() - t0

    def take(self, step: int) -> tuple[RolloutResult, float]:
        """Step ``step``'s rollout and the seconds it took to play; first queues the steps up to ``step + K``.

        Call it once per step, in order, after the previous step's weights were synced.
        """
        want = min(self._futures, default=self._next)
        if step != want:
            raise TrainerError(f"RolloutAhead.take({step}): steps are taken in order; the next one is {want}")
        for s in range(self._next, min(step + self.max_staleness, self.end - 1) + 1):
            self._futures[s] = self._pool.submit(self._timed, s)
            self._next = s + 1
        return self._wait(self._futures.pop(step), f"the rollout of step {step}", 1)

    def call(self, fn: Callable[[], T], what: str) -> T:
        """Run ``fn`` on the rollout thread after the rollouts queued so far; its result."""
        ahead = 1 + sum(not f.done() for f in self._futures.values())
        return self._wait(self._pool.submit(fn), what, ahead)

    def _wait(self, fut: concurrent.futures.Future[Any], what: str, ahead: int) -> Any:
        limit = self.timeout_s * ahead
        try:
            return fut.result(timeout=limit)
        except concurrent.futures.TimeoutError:
            raise TrainerError(
                f"{what} did not finish within {limit:g} s ({ahead} rollout-thread job(s) of at most "
                f"{self.timeout_s:g} s each); an episode or the engine is stuck: check the env and engine logs, "
                "or raise rollout.episode_timeout_s"
            ) from None

    def close(self) -> None:
        """Drop the queued rollouts; one already playing ends when the engine closes."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._futures.clear()
