"""Continuous rollout: groups stream from the engine into a buffer; the trainer takes whole batches.

With ``rollout.max_staleness = K > 0`` a :class:`RolloutService` keeps groups in flight on the
run's event loop all the time, while the trainer updates and syncs::

    engine:   ─g0─g1─g2──g3──────g4─g5─g6─g7─g8─ ...   groups start as soon as admitted,
    buffer:   complete groups, in any order             end whenever they end
    trainer:  take T ─ train ─ sync │ take T ─ train ─ sync │ ...

**Tasks.** Task ``k`` has seed ``k`` and *nominal step* ``k // T`` (``T = tasks_per_step``): the
step that plays it in the synchronous loop, and its sampling salt, so a task samples the same
seeds whichever mode plays it.

**Admission** (the bound of AReaL's ``max_head_offpolicyness``, Fu et al. 2025): once the engine
has taken ``n`` weight updates since the service started, another group may start while fewer
than ``(n + K + 1) * T + O`` have started (replays of a resume included), where ``O =
rollout.overprovision`` extra groups, and at most ``(K + 1) * T + O`` groups are started and not
yet trained. A task that starts at version ``v`` is normally trained by step ``v + K``, so its
tokens are at most ``K`` versions old; admission is paced, nothing is discarded for it.

**Take.** At step ``s`` (engine version ``v``) the batch is every group that started at version
``v - K`` or earlier (its first token is ``K`` versions old: it must be trained now, so the
trainer waits for it if it still plays), filled up to ``T`` groups with the complete groups of
lowest task id. A straggler therefore delays no batch for ``K`` steps (later groups that
finished are taken instead and it is carried over, ``rollout/groups_carried``), and is never
discarded: nothing is replayed, no token is trained more than ``K`` versions old, and a long
episode is not starved by restarts. Over-provisioned groups that come due together may make
a batch larger than ``T`` (``rollout/groups``). A group with an infrastructure failure is
dropped and counted, as in the synchronous loop. Weights synced while a group plays reach the
engine between two decode steps, and its later tokens carry the new version (partial rollout).

**Requeue** (``requeue_stale=True``, for strict on-policy runs: the tail batching of RollPacker,
Gao et al. 2025). No episode spans a weight update: when the engine's version moves past the
version a group started at, the group is aborted where it stands (its engine requests are
cancelled, its sessions and envs closed) and goes back to the front of the queue, to be replayed
from its start under the new weights (``rollout/groups_requeued``). Completed groups are still
taken within the bound ``K``, so every trained episode's tokens carry one version, at most ``K``
old. The price is the work thrown away, and it falls on the longest episodes (the ones still
playing when the weights change): they are the ones replayed, again and again if they are
longer than a step — the trainer waits for a due group, so a replay always ends, but the
default (carry over, partial rollouts) wastes nothing and is the one to use unless a strictly
single-version episode matters more than throughput.

**Mask** (``stale_tokens="mask"``: the trainer never waits for a straggler). The bound is kept
per token instead of per group: no group is ever due, every batch is the ``T`` complete groups of
lowest task id, and a group that ends after its first tokens fell more than ``K`` versions behind
is trained with those tokens masked out of the loss: they stay in the sequence as context, and
the tokens sampled since (by versions within ``K``, thanks to partial rollout) are trained with
the episode's reward (``rollout/stale_masked_frac``, the share of the batch's sampled tokens
masked). A complete group with no token left within the bound is replayed from its start
(``rollout/groups_requeued``), so nothing is lost. The trade: a long episode's early actions get
no gradient (the later ones are conditioned on them, sampled by recent weights, and are the
ones trained), against a trainer that no longer idles on the tail.

**Ranks.** Under ``torchrun`` every rank runs a service over its share of the tasks (``shard =
(rank, world)``: local task ``j`` is global task ``j * world + rank``) with its own engine, and
takes ``T / world`` groups a step; the trainer gathers the shares on its own thread, so no
collective ever runs on the rollout loop beside the training collectives.

**Checkpoint.** :meth:`RolloutService.state` is the next new task and the tasks started but not
yet trained; a resumed run replays those from their start (an episode's env and engine state
cannot be captured in general), then goes on from the next task, so every task is trained once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from agentrl.eventloop import LoopThread
from agentrl.trainer.errors import RolloutError, TrainerError
from agentrl.trainer.rollout import Episode, RolloutManager, RolloutResult, complete, summarize

__all__ = ["RolloutService"]


class RolloutService:
    """Groups of ``rollout`` played continuously on ``loop`` under a staleness bound (module docstring).

    ``version()`` reads the engine's weight version. ``next_task`` and ``replay`` restore a
    checkpoint's :meth:`state` (task ids local to this rank's shard). Every :meth:`take` has a
    deadline of ``timeout_s``.
    """

    def __init__(
        self,
        rollout: RolloutManager,
        loop: LoopThread,
        version: Callable[[], int],
        *,
        tasks_per_step: int,
        group_size: int,
        temperature: float,
        max_staleness: int,
        overprovision: int = 0,
        next_task: int = 0,
        replay: Sequence[int] = (),
        shard: tuple[int, int] = (0, 1),
        timeout_s: float = 600.0,
        requeue_stale: bool = False,
        stale_tokens: str = "wait",
    ) -> None:
        if max_staleness < 1:
            raise TrainerError(
                f"max_staleness={max_staleness}: the service needs >= 1 (0 is the synchronous loop)"
            )
        if stale_tokens not in ("wait", "mask"):
            raise TrainerError(f"stale_tokens={stale_tokens!r}: must be 'wait' or 'mask'")
        if stale_tokens == "mask" and requeue_stale:
            raise TrainerError("stale_tokens='mask' with requeue_stale=True: pick one way to keep the bound")
        self.rollout, self.loop, self.version = rollout, loop, version
        self.rank, self.world = shard
        if tasks_per_step % self.world:
            raise TrainerError(f"tasks_per_step={tasks_per_step} does not split across {self.world} ranks")
        self.T, self.G, self.temperature = tasks_per_step // self.world, group_size, temperature
        self.K, self.O, self.timeout_s = max_staleness, overprovision, timeout_s
        self.requeue_stale, self.mask_stale = requeue_stale, stale_tokens == "mask"
        self._requeued = 0  # groups aborted and requeued since the last take (counted there)
        self._queue: deque[int] = deque(sorted(replay))  # what a checkpoint left untrained: first in line
        self._next = next_task
        self._v0 = 0  # the engine's version when the service started (read on the loop, in _start)
        self._admitted = 0  # groups started by this service
        self._running: dict[int, asyncio.Task[list[Episode]]] = {}
        self._started: dict[int, float] = {}
        self._start_version: dict[int, int] = {}
        self._done: dict[int, list[Episode]] = {}
        self._dropped: list[list[Episode]] = []  # failed groups since the last take (counted there)
        self._error: BaseException | None = None  # a rollout bug, raised at the next take
        self._changed: asyncio.Event | None = None
        self._closed = False
        self.loop.run(self._start(), timeout_s=30.0, what="starting the rollout service")

    # ------------------------------------------------------------ on the loop

    async def _start(self) -> None:
        self._changed = asyncio.Event()
        self._v0 = self.version()
        self._admit()

    def _capacity_left(self) -> int:
        return (self.K + 1) * self.T + self.O - len(self._running) - len(self._done)

    def _admit(self, beyond_bound: int = 0) -> None:
        """Start every task the bound admits now (a resume's untrained tasks first, then new ones in order).

        ``beyond_bound`` more may start past the version bound: only when nothing is in flight
        and a batch cannot fill otherwise (dropped groups), when they would play at the very
        version that trains them.
        """
        v = self.version()
        if self.requeue_stale:
            self._requeue_older_than(v)
        while not self._closed and self._capacity_left() > 0:
            k = self._queue[0] if self._queue else self._next
            if self._admitted >= (v - self._v0 + self.K + 1) * self.T + self.O:
                if beyond_bound <= 0:
                    return
                beyond_bound -= 1
            if self._queue:
                self._queue.popleft()
            else:
                self._next += 1
            self._admitted += 1
            self._started[k] = time.perf_counter()
            self._start_version[k] = v
            seed = k * self.world + self.rank  # the global task id (= k on one process)
            task = asyncio.ensure_future(self.rollout.group(seed, self.G, self.temperature, salt=k // self.T))
            self._running[k] = task
            task.add_done_callback(functools.partial(self._finished, k))

    def _requeue_older_than(self, v: int) -> None:
        """Abort the groups in flight that started before version ``v``; they replay from their start."""
        stale = [k for k in self._running if self._start_version[k] < v]
        for k in stale:
            self._running.pop(k).cancel()
            self._requeue(k)

    def _requeue(self, k: int) -> None:
        del self._started[k], self._start_version[k]
        self._admitted -= 1  # its replay takes the place it held under the bound
        self._queue = deque(sorted([*self._queue, k]))
        self._requeued += 1

    def _finished(self, k: int, task: asyncio.Task[list[Episode]]) -> None:
        if self._running.get(k) is not task:  # aborted and requeued (its replay may be running)
            return
        del self._running[k]
        if task.cancelled():
            return
        exc = task.exception()
        group = task.result() if exc is None else []
        if exc is not None:  # a bug or a config error in the rollout itself: surface it at the next take
            self._error = exc
        elif self.requeue_stale and _spans_versions(group):  # ended after an update it had not seen yet
            self._requeue(k)
        elif complete(group):
            self._done[k] = group
        else:
            self._started.pop(k, None)
            self._start_version.pop(k, None)
            self._dropped.append(group)
        self._admit()
        if self._changed is not None:
            self._changed.set()

    async def _take(self, step: int) -> tuple[RolloutResult, float]:
        assert self._changed is not None
        t0 = time.perf_counter()
        while True:
            if self._error is not None:
                err, self._error = self._error, None
                raise err
            v = self.version()
            self._changed.clear()
            if self.mask_stale:
                self._requeue_expired(v)
            self._admit()
            if self.mask_stale:  # nothing is ever due: stale tokens are masked at the batch instead
                due: list[int] = []
            else:
                due = [k for k, sv in self._start_version.items() if sv <= v - self.K]
            if all(k in self._done for k in due):
                rest = sorted(k for k in self._done if k not in due)
                ready = sorted(due) + rest[: max(0, self.T - len(due))]
                if len(ready) >= self.T:
                    return self._batch(step, sorted(ready), v), time.perf_counter() - t0
            if not self._running:  # groups were dropped and the bound admits no more: play now, fresh
                self._admit(beyond_bound=self.T - len(self._done))
            if not self._running:
                raise RolloutError(
                    f"step {step}: {len(self._done)} of {self.T} groups complete and none can start"
                )
            await self._changed.wait()

    def _requeue_expired(self, v: int) -> None:
        """Replay the complete groups that kept no sampled token within ``K`` versions of ``v``."""
        for k in [k for k, g in self._done.items() if not _has_tokens_since(g, v - self.K)]:
            del self._done[k]
            self._requeue(k)

    def _batch(self, step: int, ready: list[int], v: int) -> RolloutResult:
        groups = [self._done.pop(k) for k in ready]
        masked = 0
        if self.mask_stale:
            groups, masked = _mask_older_than(groups, v - self.K)
        first = min(self._started.pop(k) for k in ready)
        for k in ready:
            del self._start_version[k]
        dropped, self._dropped = self._dropped, []
        res = summarize(groups + dropped, time.perf_counter() - first)
        lags: Counter[int] = Counter(v - ver for ver in _sampled_versions([e for g in groups for e in g]))
        total = max(sum(lags.values()), 1)
        if self.mask_stale:
            res.metrics["rollout/stale_masked_frac"] = masked / max(sum(lags.values()) + masked, 1)
        res.metrics.update({f"rollout/lag_{lag}_frac": lags[lag] / total for lag in range(self.K + 1)})
        mixed = sum(_spans_versions([e]) for g in groups for e in g)
        res.metrics["rollout/mixed_version_frac"] = mixed / max(sum(len(g) for g in groups), 1)
        res.metrics["rollout/groups_carried"] = float(len(self._done) + len(self._running))
        res.metrics["rollout/groups_requeued"] = float(self._requeued)
        self._requeued = 0
        self._admit()
        return res

    async def _state(self) -> dict[str, Any]:
        pending = sorted({*self._queue, *self._running, *self._done})
        return {"next_task": self._next, "pending": pending}

    async def _close(self) -> None:
        self._closed = True
        tasks = list(self._running.values())
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=10.0)

    # ------------------------------------------------------------ from the trainer's thread

    def take(self, step: int) -> tuple[RolloutResult, float]:
        """Step ``step``'s batch of ``T`` complete groups, and the seconds the trainer waited for it."""
        return self.loop.run(self._take(step), timeout_s=self.timeout_s, what=f"the batch of step {step}")

    def state(self) -> dict[str, Any]:
        """What a checkpoint needs to resume without losing or repeating a task."""
        return self.loop.run(self._state(), timeout_s=30.0, what="reading the rollout service's state")

    def close(self) -> None:
        """Cancel the groups in flight (their tasks are in :meth:`state` of the last checkpoint)."""
        if not self._closed:
            self.loop.run(self._close(), timeout_s=30.0, what="stopping the rollout service")


def _spans_versions(group: list[Episode]) -> bool:
    """Whether the sampled tokens of ``group`` carry more than one weight version."""
    return len(set(_sampled_versions(group))) > 1


def _has_tokens_since(group: list[Episode], oldest: int) -> bool:
    """Whether some sampled token of ``group`` carries version ``oldest`` or later."""
    return any(ver >= oldest for ver in _sampled_versions(group))


def _sampled_versions(episodes: list[Episode]) -> Iterator[int]:
    """The weight version of every trained (loss-masked) token of ``episodes``."""
    for e in episodes:
        for t in e.trajectories:
            yield from (ver for ver, m in zip(t.policy_versions, t.loss_mask, strict=True) if m)


def _mask_older_than(groups: list[list[Episode]], oldest: int) -> tuple[list[list[Episode]], int]:
    """``groups`` with every sampled token older than version ``oldest`` out of the loss (kept as
    context), and how many were masked. Episodes are copied, not changed in place."""
    out: list[list[Episode]] = []
    masked = 0
    for g in groups:
        new_group = []
        for e in g:
            trajs = []
            for t in e.trajectories:
                mask = [
                    m if ver >= oldest else 0 for ver, m in zip(t.policy_versions, t.loss_mask, strict=True)
                ]
                n = sum(t.loss_mask) - sum(mask)
                masked += n
                trajs.append(t.model_copy(update={"loss_mask": mask}) if n else t)
            new_group.append(dataclasses.replace(e, trajectories=trajs))
        out.append(new_group)
    return out, masked
