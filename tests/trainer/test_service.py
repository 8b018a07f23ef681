"""Continuous rollout: admission under the staleness bound, stragglers carried over, resume without loss.

The unit tests drive a :class:`RolloutService` with a scripted rollout whose groups take chosen
times and stamp their tokens with the version in force when they end; the training tests run the
real loop on the tiny model.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from rich.console import Console

from agentrl.errors import ConfigError
from agentrl.eventloop import LoopThread
from agentrl.trainer.config import resolve
from agentrl.trainer.errors import RolloutError, TrainerError
from agentrl.trainer.loop import train
from agentrl.trainer.metrics import read_jsonl, summary_table
from agentrl.trainer.rollout import Episode
from agentrl.trainer.service import RolloutService
from agentrl.types import Trajectory


class Scripted:
    """A rollout whose group ``k`` takes ``seconds(k)``; its one token carries the version at its start."""

    def __init__(self, seconds=lambda k: 0.01, fails=()) -> None:
        self.version = 0
        self.seconds, self.fails = seconds, set(fails)
        self.started: dict[int, int] = {}  # task -> version at its (last) start
        self.starts: list[int] = []

    async def group(self, seed: int, group_size: int, temperature: float, salt: int = 0) -> list[Episode]:
        self.started[seed] = self.version
        self.starts.append(seed)
        v = self.version
        await asyncio.sleep(self.seconds(seed))
        if seed in self.fails:
            return [Episode(seed, f"s{seed}", 0.0, [], "infra_error", "env down")] * group_size
        traj = Trajectory(
            token_ids=[1, 2], loss_mask=[0, 1], rollout_logprobs=[0.0, -1.0], policy_versions=[-1, v]
        )
        return [Episode(seed, f"s{seed}", 1.0, [traj], completion_tokens=1)] * group_size


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    with LoopThread("agentrl-rollout-test") as lt:
        yield lt


def _service(rollout: Scripted, loop: LoopThread, **kw) -> RolloutService:
    args = {
        "tasks_per_step": 4,
        "group_size": 2,
        "temperature": 1.0,
        "max_staleness": 1,
        "timeout_s": 30,
    } | kw
    return RolloutService(rollout, loop, lambda: rollout.version, **args)  # type: ignore[arg-type]


def _train_steps(svc: RolloutService, rollout: Scripted, steps: int) -> list[list[int]]:
    batches = []
    for step in range(steps):
        res, _ = svc.take(step)
        batches.append([int(g[0].group_id[1:]) for g in res.groups])
        lags = {rollout.version - rollout.started[k] for k in batches[-1]}
        assert max(lags) <= svc.K, (step, lags)
        time.sleep(0.02)  # the update
        rollout.version += 1  # the sync
    return batches


@pytest.mark.parametrize("k", [1, 2])
def test_admission_keeps_every_trained_group_within_k_versions(loop, k):
    rollout = Scripted()
    svc = _service(rollout, loop, max_staleness=k)
    try:
        batches = _train_steps(svc, rollout, 6)
    finally:
        svc.close()
    assert [b for bs in batches for b in bs] == list(range(24))  # in order when nothing straggles
    # it did run ahead: the first step after the start trained groups started k versions earlier
    assert max(s - rollout.started[t] for s, b in enumerate(batches) for t in b) == k
    # and never started a task past the bound (k steps ahead, T tasks a step)
    assert all(t < (rollout.started[t] + k + 1) * 4 for t in rollout.started)


def test_a_straggler_does_not_gate_its_batch_and_is_trained_later(loop):
    rollout = Scripted(seconds=lambda k: 0.6 if k == 1 else 0.01)
    svc = _service(rollout, loop, max_staleness=2, overprovision=2)
    try:
        res, _ = svc.take(0)
        first = [int(g[0].group_id[1:]) for g in res.groups]
        assert 1 not in first and first == [0, 2, 3, 4]  # the next complete group took its place
        assert res.metrics["rollout/groups_carried"] >= 1
        rollout.version += 1
        time.sleep(0.7)  # the straggler ends during the update
        res, _ = svc.take(1)
        assert [int(g[0].group_id[1:]) for g in res.groups][0] == 1  # taken as soon as it ended
    finally:
        svc.close()


def test_a_straggler_is_waited_for_only_when_it_comes_due_and_never_restarted(loop):
    rollout = Scripted(seconds=lambda k: 0.5 if k == 0 else 0.01)
    svc = _service(rollout, loop, max_staleness=1)
    try:
        res, waited0 = svc.take(0)  # group 0 straggles: the batch takes the next complete groups
        assert [int(g[0].group_id[1:]) for g in res.groups] == [1, 2, 3, 4]
        rollout.version += 1
        res, waited1 = svc.take(1)  # now group 0 is K versions old: the trainer waits for it
        assert 0 in [int(g[0].group_id[1:]) for g in res.groups]
        assert waited1 > 0.3 > waited0  # it did wait, for the straggler only
        assert rollout.starts.count(0) == 1  # played once: nothing is discarded or restarted
        assert max(res.metrics[f"rollout/lag_{n}_frac"] for n in (0, 1)) > 0
    finally:
        svc.close()


def test_dropped_groups_are_counted_and_the_batch_still_fills(loop):
    rollout = Scripted(fails={1, 2})
    svc = _service(rollout, loop, max_staleness=1)
    try:
        res, _ = svc.take(0)
        assert [int(g[0].group_id[1:]) for g in res.groups] == [0, 3, 4, 5]
        assert res.metrics["rollout/groups_dropped"] == 2 and res.dropped == [1, 2]
        assert res.metrics["rollout/groups_dropped_frac"] == 2 / 6  # of the tasks this batch accounts for
    finally:
        svc.close()


def test_state_resumes_every_task_once(loop):
    rollout = Scripted(seconds=lambda k: 0.3 if k == 5 else 0.01)
    svc = _service(rollout, loop, max_staleness=1)
    trained = _train_steps(svc, rollout, 1)[0]
    state = svc.state()
    svc.close()
    assert state["next_task"] == 8 and 5 in state["pending"] and not set(state["pending"]) & set(trained)
    again = Scripted()
    again.version = rollout.version
    svc = _service(again, loop, max_staleness=1, next_task=state["next_task"], replay=state["pending"])
    try:
        later = _train_steps(svc, again, 2)
    finally:
        svc.close()
    seen = trained + [t for b in later for t in b]
    assert sorted(seen) == list(range(12)) and len(seen) == len(set(seen))


def test_the_service_needs_a_bound_and_overprovision_needs_async(loop):
    with pytest.raises(Exception, match="max_staleness=0"):
        _service(Scripted(), loop, max_staleness=0)
    with pytest.raises(ConfigError, match=r"rollout.overprovision=2: needs asynchronous rollout"):
        resolve(overprovision=2)


def test_a_rollout_bug_surfaces_at_the_next_take(loop):
    class Broken(Scripted):
        async def group(self, seed, group_size, temperature, salt=0):
            raise KeyError("bug in the rollout")

    svc = _service(Broken(), loop)
    try:
        with pytest.raises(KeyError, match="bug in the rollout"):
            svc.take(0)
    finally:
        svc.close()
    assert RolloutError  # the error class a stuck batch raises (see the service)


class Spanning(Scripted):
    """A rollout whose tokens carry the version at the group's start and at its end."""

    def __init__(self, seconds=lambda k: 0.01) -> None:
        super().__init__(seconds)
        self.aborted: list[int] = []

    async def group(self, seed: int, group_size: int, temperature: float, salt: int = 0) -> list[Episode]:
        self.started[seed] = v0 = self.version
        self.starts.append(seed)
        try:
            await asyncio.sleep(self.seconds(seed))
        except asyncio.CancelledError:
            self.aborted.append(seed)
            raise
        traj = Trajectory(
            token_ids=[1, 2, 3],
            loss_mask=[0, 1, 1],
            rollout_logprobs=[0.0, -1.0, -1.0],
            policy_versions=[-1, v0, self.version],
        )
        return [Episode(seed, f"s{seed}", 1.0, [traj], completion_tokens=2)] * group_size


@pytest.mark.parametrize("requeue", [False, True])
def test_requeue_stale_replays_a_group_the_update_overtook_and_trains_one_version(loop, requeue):
    rollout = Spanning(seconds=lambda k: 0.4 if k == 1 and rollout.starts.count(1) == 1 else 0.01)
    svc = _service(rollout, loop, max_staleness=1, requeue_stale=requeue)
    trained: list[int] = []
    try:
        for step in range(3):
            res, _ = svc.take(step)
            trained += [int(g[0].group_id[1:]) for g in res.groups]
            versions = [{*t.policy_versions[1:]} for g in res.groups for e in g for t in e.trajectories]
            if requeue:  # every trained episode was sampled by one version
                assert all(len(v) == 1 for v in versions), (step, versions)
                assert res.metrics["rollout/mixed_version_frac"] == 0.0
            if step == 1:
                assert 1 in trained  # the straggler is trained by the step its bound falls due
                assert (res.metrics["rollout/groups_requeued"] == 1) is requeue
                assert (res.metrics["rollout/mixed_version_frac"] > 0) is not requeue
            rollout.version += 1  # the sync, while group 1 still plays (it takes 0.4 s)
        aborted = list(rollout.aborted)  # (closing the service aborts what still plays)
    finally:
        svc.close()
    assert sorted(trained) == list(range(len(trained))) and len(trained) >= 12  # each task once
    if requeue:  # aborted where it stood and replayed from its start under the new weights
        assert aborted == [1] and rollout.starts.count(1) == 2
    else:  # partial rollout: played once, across the update
        assert aborted == [] and rollout.starts.count(1) == 1


def test_requeue_stale_needs_async():
    with pytest.raises(ConfigError, match=r"rollout.requeue_stale=True: needs asynchronous rollout"):
        resolve(requeue_stale=True)


def test_requeue_stale_is_refused_on_an_engine_without_per_token_versions():
    """SGLang labels a request's tokens with its version at submission: a run across an update looks like one version."""
    with pytest.raises(
        ConfigError, match=r"rollout.requeue_stale=True: needs per-token weight versions.*SGLang"
    ):
        resolve(requeue_stale=True, max_staleness=1, engine="sglang", engine_url="http://127.0.0.1:30000")
    assert resolve(stale_tokens="mask", max_staleness=1, engine="sglang", engine_url="http://127.0.0.1:30000")


def test_mask_stale_never_waits_for_a_straggler_and_trains_only_its_tokens_within_k(loop):
    rollout = Spanning(seconds=lambda k: 0.5 if k == 0 else 0.01)
    svc = _service(rollout, loop, max_staleness=1, stale_tokens="mask")
    try:
        res, _ = svc.take(0)
        assert [int(g[0].group_id[1:]) for g in res.groups] == [1, 2, 3, 4]
        rollout.version += 1
        res, waited = svc.take(1)  # group 0 is now K versions old: 'wait' would wait here, 'mask' does not
        assert [int(g[0].group_id[1:]) for g in res.groups] == [5, 6, 7, 8] and waited < 0.3
        rollout.version += 1
        time.sleep(0.6)  # group 0 ends under version 2: its first token (version 0) is 2 versions old
        res, _ = svc.take(2)
        ids = [int(g[0].group_id[1:]) for g in res.groups]
        assert ids[0] == 0 and rollout.starts.count(0) == 1  # trained, played once
        straggler = res.groups[0][0].trajectories[0]
        assert straggler.policy_versions == [-1, 0, 2] and straggler.loss_mask == [0, 0, 1]  # kept as context
        assert res.metrics["rollout/stale_masked_frac"] == pytest.approx(2 / (2 * 4 * 2))  # 2 of 16 tokens
        assert res.metrics["rollout/lag_0_frac"] + res.metrics["rollout/lag_1_frac"] == pytest.approx(1.0)
    finally:
        svc.close()


def test_mask_stale_replays_a_group_with_no_token_left_within_k(loop):
    rollout = Scripted(seconds=lambda k: 0.5 if k == 0 and rollout.starts.count(0) == 1 else 0.01)
    svc = _service(rollout, loop, max_staleness=1, stale_tokens="mask")
    trained: list[int] = []
    requeued = 0.0
    try:
        for step in range(4):
            res, _ = svc.take(step)
            trained += [int(g[0].group_id[1:]) for g in res.groups]
            requeued += res.metrics["rollout/groups_requeued"]
            lags = {
                rollout.version - t.policy_versions[1] for g in res.groups for e in g for t in e.trajectories
            }
            assert max(lags) <= 1, (step, lags)  # its one token would be 2 versions old: never trained
            rollout.version += 1
            time.sleep(0.3)
    finally:
        svc.close()
    assert requeued == 1 and rollout.starts.count(0) == 2  # replayed from its start, once
    assert sorted(trained) == list(range(len(trained))) and 0 in trained  # nothing lost, nothing twice


def test_stale_tokens_mask_is_checked(loop):
    with pytest.raises(ConfigError, match=r"rollout.stale_tokens='mask': needs asynchronous rollout"):
        resolve(stale_tokens="mask")
    with pytest.raises(ConfigError, match=r"rollout.stale_tokens='mask': conflicts with --requeue-stale"):
        resolve(stale_tokens="mask", requeue_stale=True, max_staleness=1)
    with pytest.raises(TrainerError, match="stale_tokens='late': must be 'wait' or 'mask'"):
        _service(Scripted(), loop, stale_tokens="late")


# ---------------------------------------------------------------- the real loop

SMALL = {
    "model": "tiny-qwen3", "group_size": 2, "tasks_per_step": 2, "max_new_tokens": 6, "eval_episodes": 4,
    "sft_steps": 3, "sft_batch_size": 4, "progress": False, "tensorboard": False,
}  # fmt: skip


VOWELS = f"{Path(__file__).with_name('_dense_env.py')}:VowelEnv"  # a dense reward: every step has a gradient
REPRO = {**SMALL, "env": VOWELS, "group_size": 4, "tasks_per_step": 4, "max_new_tokens": 16, "sft_steps": 2,
         "eval_every": 0, "lr": 1e-3, "steps": 3, "engine_max_batch": 1}  # fmt: skip
TIMING = ("time", "rollout/seconds")


def _untimed(run: Path) -> list[dict]:
    return [
        {k: v for k, v in r.items() if k not in TIMING and not k.startswith("time/")}
        for r in read_jsonl(run / "metrics.jsonl")
    ]


def test_a_run_repeats_bit_for_bit_with_engine_max_batch_1(tmp_path):
    """Two runs with the same seeds (warm start included) write the same metrics file, every value to
    the last bit (the timings aside), and the same weights. One spells ``--max-staleness 0``, the
    default: that is the synchronous loop's own code path (the service runs only for K >= 1), so this
    proves reproducibility, not that two code paths agree. ``--engine-max-batch 1`` makes each
    request's tokens and logprobs independent of what else decodes beside it; with the default batch
    the same run differs in float rounding (a row's matmul result depends on the batch's shape)."""
    from safetensors.torch import load_file

    runs = {"sync": tmp_path / "sync", "k0": tmp_path / "k0"}
    with open(os.devnull, "w") as devnull:
        for name, extra in (("sync", {}), ("k0", {"max_staleness": 0})):
            train(resolve(**REPRO, **extra, run_dir=str(runs[name])), console=Console(file=devnull))
    sync, k0 = _untimed(runs["sync"]), _untimed(runs["k0"])
    steps = [r for r in sync if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["train/grad_norm"] > 0 for r in steps)  # the runs learn something that could differ
    assert len({r["rollout/reward"] for r in steps}) == 3
    assert k0 == sync
    final = {
        name: load_file(str(run / "checkpoints" / "step-3" / "model.safetensors"))
        for name, run in runs.items()
    }
    assert final["sync"].keys() == final["k0"].keys()
    assert all(torch.equal(final["sync"][k], final["k0"][k]) for k in final["sync"])


def test_async_training_trains_within_the_bound_and_evaluates(tmp_path, slow_updates):
    cfg = resolve(**SMALL, eval_every=2, steps=4, max_staleness=1, overprovision=1, run_dir=str(tmp_path))
    s = train(cfg, console=Console(file=open(os.devnull, "w")))  # noqa: SIM115
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    steps = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [0, 2, 4]
    assert all(r["train/staleness_max"] <= 1 for r in steps)  # no trained token past the bound
    assert all(r["train/tokens_past_bound"] == 0 for r in steps)
    assert any(r["train/staleness_max"] == 1 for r in steps)  # and it did play ahead of the trainer
    assert all(r["rollout/lag_0_frac"] + r["rollout/lag_1_frac"] == pytest.approx(1.0) for r in steps)
    # a batch is T groups, or more when over-provisioned groups come due together
    assert all(r["rollout/episodes_ok"] >= cfg.batch_size for r in steps)
    assert steps[-1]["sync/version"] == 4
    tasks = [t for r in read_jsonl(tmp_path / "tasks.jsonl") for t in r["tasks"]]
    assert len(tasks) == len(set(tasks)) >= 8  # every trained task once
    assert s.eval_end is not None
    out = Console(record=True, width=120)
    out.print(summary_table(tmp_path / "metrics.jsonl"))
    assert "staleness, max (policy versions)" in out.export_text()


def test_requeue_stale_training_trains_each_episode_under_one_version(tmp_path, slow_updates, monkeypatch):
    from agentrl.engines.hf import HFEngine

    generate = HFEngine.generate

    async def slow_generate(self, *args, **kwargs):  # groups still play when the update's sync lands
        out = await generate(self, *args, **kwargs)
        await asyncio.sleep(0.5)  # longer than an update (0.3 s)
        return out

    monkeypatch.setattr(HFEngine, "generate", slow_generate)
    cfg = resolve(**SMALL, eval_every=0, steps=4, max_staleness=1, requeue_stale=True, run_dir=str(tmp_path))
    train(cfg, console=Console(file=open(os.devnull, "w")))  # noqa: SIM115
    steps = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all(r["rollout/mixed_version_frac"] == 0.0 for r in steps)  # no trained episode spans an update
    assert all(r["train/staleness_max"] <= 1 for r in steps)
    assert sum(r["rollout/groups_requeued"] for r in steps) >= 1  # the update did overtake groups in flight
    tasks = [t for r in read_jsonl(tmp_path / "tasks.jsonl") for t in r["tasks"]]
    assert len(tasks) == len(set(tasks)) == 8  # every trained task once, none lost to a requeue


def test_mask_stale_training_keeps_the_bound_per_token_and_loses_no_task(tmp_path, slow_updates, monkeypatch):
    from agentrl.engines.hf import HFEngine

    generate = HFEngine.generate

    async def slow_generate(self, *args, **kwargs):  # groups outlast updates, some past the bound
        out = await generate(self, *args, **kwargs)
        await asyncio.sleep(0.5)
        return out

    monkeypatch.setattr(HFEngine, "generate", slow_generate)
    cfg = resolve(**SMALL, eval_every=0, steps=4, max_staleness=1, stale_tokens="mask", run_dir=str(tmp_path))
    train(cfg, console=Console(file=open(os.devnull, "w")))  # noqa: SIM115
    steps = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all(r["train/staleness_max"] <= 1 for r in steps)  # no trained token past the bound
    assert all(0.0 <= r["rollout/stale_masked_frac"] < 1.0 for r in steps)
    tasks = [t for r in read_jsonl(tmp_path / "tasks.jsonl") for t in r["tasks"]]
    assert len(tasks) == len(set(tasks)) == 8  # every trained task once, none lost to a replay


@pytest.mark.slow
@pytest.mark.parametrize(("staleness", "stale_tokens"), [(0, "wait"), (1, "wait"), (1, "mask")])
def test_kill_9_mid_run_then_resume_trains_every_task_exactly_once(tmp_path, staleness, stale_tokens):
    run = tmp_path / "run"
    flags = [
        "--model", "tiny-qwen3", "--group-size", "2", "--tasks-per-step", "2", "--max-new-tokens", "6",
        "--eval-episodes", "2", "--eval-every", "0", "--sft-steps", "0", "--no-progress", "--no-tensorboard",
        "--steps", "6", "--checkpoint-every", "2", "--max-staleness", str(staleness), "--run-dir", str(run),
    ] + (["--stale-tokens", stale_tokens] if staleness else [])  # fmt: skip
    cmd = [
        sys.executable,
        "-c",
        "import sys; from agentrl.cli import main; sys.exit(main())",
        "train",
        *flags,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:  # kill it after step 3, past checkpoint 2
            done = [r["step"] for r in _rows(run / "tasks.jsonl")]
            if done and max(done) >= 3:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert (run / "checkpoints" / "step-2" / "trainer_state.pt").exists()
    resumed = subprocess.run(
        [*cmd, "--resume", str(run / "checkpoints" / "step-2")], env=env, capture_output=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    last = {r["step"]: r["tasks"] for r in _rows(run / "tasks.jsonl")}  # a repeated step: its last row counts
    assert sorted(last) == [1, 2, 3, 4, 5, 6]
    trained = [t for s in sorted(last) for t in last[s]]
    assert len(trained) == len(set(trained)) == 12  # none twice, none lost
    if staleness == 0:
        assert trained == list(range(12))  # the synchronous schedule, exactly


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line being written
            out.append(json.loads(line))
    return out
