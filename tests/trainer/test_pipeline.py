"""Asynchronous rollout: rollouts run ahead of the trainer, never more than max_staleness versions."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from rich.console import Console

from agentrl.eventloop import LoopThread
from agentrl.trainer.config import resolve
from agentrl.trainer.errors import TrainerError
from agentrl.trainer.loop import train
from agentrl.trainer.metrics import read_jsonl, summary_table
from agentrl.trainer.pipeline import RolloutAhead


class _Trainer:
    """A stand-in trainer: ``version`` counts the updates synced so far."""

    def __init__(self) -> None:
        self.version = 0
        self.started: dict[int, int] = {}  # step -> version when its rollout began
        self.threads: set[str] = set()

    async def produce(self, step: int) -> tuple[str, int]:
        self.started[step] = self.version
        self.threads.add(threading.current_thread().name)
        await asyncio.sleep(0.01)
        return ("rollout", step)


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    with LoopThread("agentrl-rollout") as lt:
        yield lt


def _now(value_of):
    """``produce`` for tests: an async function returning ``value_of(step)``."""

    async def produce(step):
        return value_of(step)

    return produce


@pytest.mark.parametrize("k", [1, 2])
def test_rollouts_run_ahead_by_at_most_k_versions(k, loop):
    tr = _Trainer()
    ahead = RolloutAhead(tr.produce, loop, first=0, end=6, max_staleness=k, timeout_s=30)
    try:
        for step in range(6):
            res, seconds = ahead.take(step)
            assert res == ("rollout", step) and seconds > 0
            time.sleep(0.1)  # the update
            tr.version += 1  # the sync
    finally:
        ahead.close()
    assert sorted(tr.started) == list(range(6))  # nothing past the last step was played
    lag = {s: s - v for s, v in tr.started.items()}
    assert max(lag.values()) <= k, lag
    assert lag[k] == k, lag  # it did run ahead: step k's rollout began before any update was synced
    assert tr.threads == {next(iter(tr.threads))} and "agentrl-rollout" in next(iter(tr.threads))


def test_a_call_runs_after_the_rollouts_already_queued(loop):
    order: list[object] = []

    async def produce(step):
        await asyncio.sleep(0.01 * (3 - step))  # later steps are quicker: only the queue orders them
        order.append(step)

    async def evaluate():
        order.append("eval")
        return "done"

    ahead = RolloutAhead(produce, loop, first=0, end=10, max_staleness=2, timeout_s=30)
    try:
        ahead.take(0)  # queues steps 0, 1, 2
        assert ahead.call(evaluate, "the eval") == "done"
    finally:
        ahead.close()
    assert order == [0, 1, 2, "eval"]


def test_a_failing_rollout_surfaces_at_its_step(loop):
    async def produce(step: int) -> int:
        if step == 1:
            raise RuntimeError("env server down")
        return step

    ahead = RolloutAhead(produce, loop, first=0, end=4, max_staleness=1, timeout_s=30)
    try:
        assert ahead.take(0)[0] == 0
        with pytest.raises(RuntimeError, match="env server down"):
            ahead.take(1)
    finally:
        ahead.close()


def test_a_stuck_rollout_hits_the_deadline_and_close_does_not_wait_for_it(loop):
    release = threading.Event()
    ahead = RolloutAhead(
        lambda s: asyncio.to_thread(release.wait, 30), loop, first=0, end=3, max_staleness=1, timeout_s=0.2
    )
    t0 = time.perf_counter()
    with pytest.raises(
        TrainerError, match=r"the rollout of step 0 did not finish within 0.2 s .*episode_timeout_s"
    ):
        ahead.take(0)
    ahead.close()
    assert time.perf_counter() - t0 < 5
    release.set()


def test_steps_are_taken_in_order_and_k_zero_is_the_synchronous_loop(loop):
    with pytest.raises(ValueError, match="max_staleness=0"):
        RolloutAhead(_now(lambda s: s), loop, first=0, end=3, max_staleness=0, timeout_s=1)
    ahead = RolloutAhead(_now(lambda s: s), loop, first=0, end=5, max_staleness=1, timeout_s=30)
    try:
        with pytest.raises(TrainerError, match=r"take\(3\): steps are taken in order; the next one is 0"):
            ahead.take(3)
        assert ahead.take(0)[0] == 0  # queues steps 0 and 1
        with pytest.raises(TrainerError, match=r"take\(2\): steps are taken in order; the next one is 1"):
            ahead.take(2)
        assert ahead.take(1)[0] == 1
    finally:
        ahead.close()


def test_async_training_trains_on_one_step_old_tokens_and_evaluates(tmp_path, slow_updates):
    cfg = resolve(
        model="tiny-qwen3",
        group_size=2,
        tasks_per_step=2,
        max_new_tokens=6,
        eval_episodes=4,
        sft_steps=3,
        sft_batch_size=4,
        eval_every=2,
        progress=False,
        tensorboard=False,
        steps=4,
        max_staleness=1,
        run_dir=str(tmp_path),
    )
    s = train(cfg, console=Console(file=open("/dev/null", "w")))  # noqa: SIM115
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    steps = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [0, 2, 4]
    # step 0's rollout played before any update; each later one during the previous update
    assert [r["train/staleness_max"] for r in steps] == [0, 1, 1, 1]
    assert all(r["rollout/episodes_ok"] == cfg.batch_size for r in steps)
    assert all(r["time/rollout_wait"] <= r["time/step"] for r in steps)
    assert steps[-1]["sync/version"] == 4  # every update reached the engine
    assert s.eval_end is not None
    out = Console(record=True, width=120)
    out.print(summary_table(tmp_path / "metrics.jsonl"))
    assert "staleness, max (policy versions)" in out.export_text()
