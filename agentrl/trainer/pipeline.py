"""Asynchronous rollout with a bounded staleness: the next steps' episodes play while the trainer updates.

With ``rollout.max_staleness = K > 0`` the run's event loop (a
:class:`~agentrl.eventloop.LoopThread`) plays the rollouts of steps in order, one after the
other, at most ``K`` steps ahead of the trainer::

    trainer:  [ train n-1 ][sync]      [ train n ][sync]      [ train n+1 ]...
    rollout:  [   rollout n    ][   rollout n+1    ][   rollout n+2   ]...     (K = 1)

The rollout of step ``s`` is submitted at the top of step ``s - K``, i.e. after the
trainer has synced ``s - K`` updates into the engine, so every token of it was sampled
by a policy at most ``K`` versions older than the one that trains on it (weights synced
while it runs reach the engine between two decode steps, and its later tokens carry the
newer version). The update corrects for the lag with the importance ratio against the
recorded rollout logprobs, which the PPO-style losses clip.

Evaluations are queued the same way (after the rollouts already queued), so a rollout and an
evaluation never share the engine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from agentrl.errors import ConfigError
from agentrl.eventloop import LoopThread
from agentrl.trainer.errors import TrainerError

__all__ = ["RolloutAhead"]

T = TypeVar("T")
R = TypeVar("R")


class RolloutAhead:
    """Rollouts of steps ``first .. end - 1`` played on ``loop``, in order, up to ``max_staleness`` steps ahead.

    ``produce(step)`` is the coroutine of one step's rollout. :meth:`take` returns the steps'
    results in order; :meth:`call` queues any other coroutine that needs the engine (an
    evaluation) behind them. Every wait has a deadline of ``timeout_s`` per job queued ahead of it.
    """

    def __init__(
        self,
        produce: Callable[[int], Coroutine[Any, Any, Any]],
        loop: LoopThread,
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
        self.produce, self.loop = produce, loop
        self.end, self.max_staleness, self.timeout_s = end, max_staleness, timeout_s
        self._next = first  # the next step to submit
        self._futures: dict[int, concurrent.futures.Future[tuple[Any, float]]] = {}
        self._last: concurrent.futures.Future[Any] | None = None  # the job queued last

    def _queue(self, job: Callable[[], Awaitable[R]]) -> concurrent.futures.Future[R]:
        """Run ``job()`` on the loop once the job queued before it has ended (however it ended)."""
        before = self._last

        async def after() -> R:
            if before is not None:
                await asyncio.wait([asyncio.wrap_future(before)])
            return await job()

        fut = self.loop.submit(after())
        self._last = fut
        return fut

    async def _timed(self, step: int) -> tuple[Any, float]:
        t0 = time.perf_counter()
        res = await self.produce(step)
        return res, time.perf_counter() - t0

    def take(self, step: int) -> tuple[Any, float]:
        """Step ``step``'s rollout and the seconds it took to play; first queues the steps up to ``step + K``.

        Call it once per step, in order, after the previous step's weights were synced.
        """
        want = min(self._futures, default=self._next)
        if step != want:
            raise TrainerError(f"RolloutAhead.take({step}): steps are taken in order; the next one is {want}")
        for s in range(self._next, min(step + self.max_staleness, self.end - 1) + 1):
            self._futures[s] = self._queue(lambda s=s: self._timed(s))  # type: ignore[misc]
            self._next = s + 1
        return self._wait(self._futures.pop(step), f"the rollout of step {step}", 1)

    def call(self, job: Callable[[], Coroutine[Any, Any, T]], what: str) -> T:
        """Run the coroutine ``job()`` on the loop after the rollouts queued so far; its result."""
        ahead = 1 + sum(not f.done() for f in self._futures.values())
        return self._wait(self._queue(job), what, ahead)

    def _wait(self, fut: concurrent.futures.Future[Any], what: str, ahead: int) -> Any:
        limit = self.timeout_s * ahead
        try:
            return fut.result(timeout=limit)
        except concurrent.futures.TimeoutError:
            raise TrainerError(
                f"{what} did not finish within {limit:g} s ({ahead} queued rollout job(s) of at most "
                f"{self.timeout_s:g} s each); an episode or the engine is stuck: check the env and engine logs, "
                "or raise rollout.episode_timeout_s"
            ) from None

    def close(self) -> None:
        """Cancel the queued rollouts and the one playing (the loop itself belongs to the run)."""
        for fut in self._futures.values():
            fut.cancel()
        if self._last is not None:
            self._last.cancel()
        self._futures.clear()
