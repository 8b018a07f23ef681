"""`agentrl train` under torchrun: two data-parallel ranks train like one process.

Both runs start from the same warm-started model, so step 1 rolls out the same
episodes (task seeds and sampling seeds are functions of the step, not of the rank);
the ranks gather the groups, compute the same advantages, each train on half the
rows with the sharded backend, and must end with the weights of the one-process run.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import agentrl.rollouts
from agentrl.cli import main
from agentrl.trainer.metrics import read_jsonl

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _args(model: Path, run_dir: Path) -> list[str]:
    return [
        "train",
        "--env",
        "countdown",
        "--model",
        str(model),
        "--sft-steps",
        "0",
        "--steps",
        "1",
        "--tasks-per-step",
        "4",
        "--group-size",
        "4",
        "--eval-episodes",
        "8",
        "--eval-every",
        "0",
        "--lr",
        "1e-3",
        "--threads",
        "2",
        "--run-dir",
        str(run_dir),
        "--no-progress",
        "--no-tensorboard",
    ]


@pytest.mark.slow
def test_two_ranks_train_like_one_process(warm_model, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    # one request per decode step and one thread a process (each rank gets one): a token's logits then
    # depend neither on what else the engine batches (each rank batches only its half of the episodes)
    # nor on how a matmul splits across threads (a batched run flipped a near-tied token in CI)
    one_at_a_time = ["--engine-max-batch", "1"]
    threads = torch.get_num_threads()
    try:
        assert main([*_args(warm_model, one), *one_at_a_time, "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)  # the rest of the suite runs in this process
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(_free_port()),
            "-m",
            "agentrl.cli",
            *_args(warm_model, two),
            *one_at_a_time,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-4000:]
    assert "(2 ranks)" in proc.stdout

    rows1, rows2 = read_jsonl(one / "metrics.jsonl"), read_jsonl(two / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in rows1] == [(r["kind"], r["step"]) for r in rows2]
    t1 = next(r for r in rows1 if r["kind"] == "train")
    t2 = next(r for r in rows2 if r["kind"] == "train")
    assert t1["algo/zero_adv_frac"] < 1.0, "the warm-started model should give some groups a learning signal"
    for key in (
        "rollout/reward",
        "rollout/completion_tokens",
        "rollout/groups",
        "rollout/episodes_ok",
        "train/samples",
        "train/tokens",
    ):
        assert t2[key] == t1[key], key  # the same episodes, gathered from both ranks
    assert t2["train/loss"] == pytest.approx(t1["train/loss"], rel=1e-4, abs=1e-6)
    assert t2["train/grad_norm"] == pytest.approx(t1["train/grad_norm"], rel=1e-4)
    assert t2["sync/version"] == t1["sync/version"] == 1.0
    e1 = [r for r in rows1 if r["kind"] == "eval"]
    e2 = [r for r in rows2 if r["kind"] == "eval"]
    assert e2[0]["eval/episodes"] == e1[0]["eval/episodes"] == 8.0  # 4 seeds on each rank, reduced
    assert e2[0]["eval/reward"] == e1[0]["eval/reward"]
    # one store, rank 0's, holds both ranks' episodes: the same as the single process's
    s1, s2 = (agentrl.rollouts.load(d).to_pandas().set_index("key").sort_index() for d in (one, two))
    assert list(s2.index) == list(s1.index)
    # every episode rolled out under the start weights is the same token for token; the final
    # eval samples from updated weights that agree only up to the reduction order (see below),
    # so a near-tied token may flip there and change the rest of that episode
    tokens1, tokens2 = s1.token_ids.map(list), s2.token_ids.map(list)
    before = ~s1.index.str.startswith("eval/1/")
    assert tokens2[before].equals(tokens1[before])
    after_same = [a == b for a, b in zip(tokens1[~before], tokens2[~before], strict=True)]
    assert len(after_same) == 40 and sum(after_same) >= 30, sum(after_same)
    assert (s2[s2.kind == "train"].fate == "trained").all()
    trained = s2[s2.kind == "train"]
    assert all(len(r.train_logprobs) == len(r.token_ids) for r in trained.itertuples())

    start = load_file(str(warm_model / "model.safetensors"))
    w1 = load_file(str(one / "checkpoints" / "step-1" / "model.safetensors"))
    w2 = load_file(str(two / "checkpoints" / "step-1" / "model.safetensors"))
    moved = max(float((w1[k] - start[k]).abs().max()) for k in w1)
    assert moved > 1e-4
    # Adam's first step is ~lr * sign(grad), so elements whose gradient is ~0 amplify float
    # noise from the different reduction order; all others agree to 1 % of the step
    diff = torch.cat([(w2[k] - w1[k]).abs().flatten() for k in w1])
    assert float(diff.max()) < 0.1 * moved
    assert float((diff > 0.01 * moved).float().mean()) < 1e-4


def _train_as_rank_of(world: int, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """`agentrl train` as if torchrun had started it with ``world`` ranks (it stops at the config check)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "agentrl.cli",
            "train",
            "--env",
            "countdown",
            *flags,
            "--run-dir",
            str(tmp_path),
        ],
        env={**os.environ, "WORLD_SIZE": str(world)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_tasks_must_split_across_ranks(tmp_path):
    proc = _train_as_rank_of(3, tmp_path, "--tasks-per-step", "4")
    assert proc.returncode == 1
    assert "rollout.tasks_per_step=4: must be a multiple of the 3 ranks" in proc.stderr


@pytest.mark.slow
def test_async_rollout_under_torchrun_trains_every_task_once_within_the_bound(warm_model, tmp_path):
    run = tmp_path / "async"
    args = _args(warm_model, run)
    steps = args.index("--steps") + 1
    args[steps] = "3"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(_free_port()), "-m", "agentrl.cli", *args, "--max-staleness", "1", "--overprovision", "2"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-4000:]
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["train/staleness_max"] <= 1 for r in rows)  # no trained token past the bound
    assert all(r["rollout/groups"] >= 4 for r in rows)  # 2 groups (or more, over-provisioned) from each rank
    tasks = [t for r in read_jsonl(run / "tasks.jsonl") for t in r["tasks"]]
    assert len(tasks) == len(set(tasks)) >= 12
    assert {t % 2 for t in tasks} == {0, 1}  # both ranks' shares were trained


@pytest.mark.slow
def test_a_resumed_kl_run_under_torchrun_keeps_the_start_of_rl_reference(warm_model, tmp_path):
    """Every rank of a resumed ``kl_coef > 0`` run loads the reference the checkpoint names (the
    policy RL started from), so the resumed step trains as in the uninterrupted run."""
    a, b = tmp_path / "a", tmp_path / "b"
    kl = ["--steps", "3", "--kl-coef", "0.5", "--checkpoint-every", "2", "--engine-max-batch", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for run, resume in ((a, []), (b, ["--resume", str(a / "checkpoints" / "step-2")])):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
               str(_free_port()), "-m", "agentrl.cli", *_args(warm_model, run), *kl, *resume]  # fmt: skip
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-4000:]
    ra = next(r for r in read_jsonl(a / "metrics.jsonl") if r["kind"] == "train" and r["step"] == 3)
    rb = next(r for r in read_jsonl(b / "metrics.jsonl") if r["kind"] == "train" and r["step"] == 3)
    assert ra["train/kl"] > 1e-4  # two updates away from the reference
    for key in ("rollout/reward", "train/tokens", "train/kl", "train/loss", "train/grad_norm"):
        assert rb[key] == ra[key], key
    assert (b / "reference" / "model.safetensors").exists()  # the resumed run's own checkpoints resume too


@pytest.mark.slow
def test_agent_programs_under_torchrun_each_rank_plays_its_share(tmp_path):
    """--agent under torchrun: every rank runs its own gateway and agents for its share of the tasks."""
    run = tmp_path / "agents"
    agent = f"{sys.executable} {ROOT / 'examples/agents/openai_agents_agent.py'}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(_free_port()), "-m", "agentrl.cli", "train", "--env", "calc-agent", "--agent", agent,
           "--model", "tiny", "--group-size", "2", "--tasks-per-step", "2", "--max-new-tokens", "24",
           "--eval-episodes", "2", "--eval-samples", "0", "--sft-steps", "2", "--sft-batch-size", "4",
           "--eval-every", "0", "--steps", "2", "--run-dir", str(run), "--no-progress", "--no-tensorboard"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-4000:]
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    assert [(r["rollout/episodes_ok"], r["rollout/groups"], r["rollout/infra_retries"]) for r in rows] == [
        (4.0, 2.0, 0.0)
    ] * 2
    logs = sorted(p.name for p in (run / "agents" / "step-0").glob("*.log"))
    assert logs == [
        "s0-0-a0.log",
        "s0-1-a0.log",
        "s1-0-a0.log",
        "s1-1-a0.log",
    ]  # rank 0's task 0, rank 1's task 1


@pytest.mark.slow
def test_a_lora_run_under_torchrun_shards_the_adapter_and_resumes_exactly(warm_model, tmp_path):
    """--lora-rank under torchrun: FSDP2 shards base and adapter, only the gathered adapter is pushed,
    each rank's engine samples what the trainer scores, and a resumed KL run (adapter, optimizer and
    the reference adapter restored into the shards) trains its step as the uninterrupted run did."""
    a, b = tmp_path / "a", tmp_path / "b"
    lora = ["--lora-rank", "8", "--steps", "3", "--kl-coef", "0.5", "--checkpoint-every", "2",
            "--engine-max-batch", "1"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for run, resume in ((a, []), (b, ["--resume", str(a / "checkpoints" / "step-2")])):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
               str(_free_port()), "-m", "agentrl.cli", *_args(warm_model, run), *lora, *resume]  # fmt: skip
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-4000:]
    rows = [r for r in read_jsonl(a / "metrics.jsonl") if r["kind"] == "train"]
    for r in rows:
        assert 0 < r["sync/bytes"] < r["sync/full_bytes"] / 5
        assert r["train/mismatch_abs_logp"] < 1e-4
    ra, rb = (next(r for r in read_jsonl(d / "metrics.jsonl") if r["kind"] == "train" and r["step"] == 3)
              for d in (a, b))  # fmt: skip
    assert ra["train/kl"] > 1e-6  # two updates away from the reference
    for key in ("rollout/reward", "train/tokens", "train/kl", "train/loss", "train/grad_norm"):
        assert rb[key] == ra[key], key
    assert (a / "checkpoints" / "step-3" / "adapter_config.json").is_file()
    assert not (a / "checkpoints" / "step-3" / "model.safetensors").exists()
