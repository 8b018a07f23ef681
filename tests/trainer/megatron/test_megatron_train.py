"""`agentrl train --backend megatron` end to end under torchrun (2 ranks, CPU, gloo): the engine's
logprobs after every weight sync match the trainer's, a KL run killed after a checkpoint resumes as
the uninterrupted run, PPO's value head trains on the last stage. Slow: each run is a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.trainer.metrics import read_jsonl

pytest.importorskip("megatron.core", reason="megatron-core is a dev dependency (pip install -e '.[dev]')")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(model: Path, run_dir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(_free_port()), "-m", "agentrl.cli", "train", "--env", "countdown", "--model", str(model),
           "--sft-steps", "0", "--tasks-per-step", "4", "--group-size", "4", "--eval-episodes", "4",
           "--eval-every", "0", "--lr", "1e-3", "--threads", "1", "--run-dir", str(run_dir), "--no-progress",
           "--no-tensorboard", "--backend", "megatron", *flags]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-5000:]
    return proc


def _train_rows(run: Path) -> list[dict]:
    return [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]


KL = ["--steps", "3", "--kl-coef", "0.5", "--checkpoint-every", "2", "--engine-max-batch", "1"]


@pytest.fixture(scope="module", params=[["--tp", "2"], ["--pp", "2"]], ids=["tp2", "pp2"])
def kl_run(request, warm_model, tmp_path_factory) -> tuple[list[str], Path]:
    """Three GRPO steps with a KL penalty and a checkpoint at step 2, split as ``request.param``."""
    run = tmp_path_factory.mktemp("kl")
    _torchrun(warm_model, run, *request.param, *KL)
    return request.param, run


def test_a_kl_run_resumes_like_the_uninterrupted_run_and_the_engine_matches_the_trainer(
    kl_run, warm_model, tmp_path
):
    """The run resumed from the step-2 checkpoint trains step 3 exactly as the uninterrupted run did
    (weights, optimizer shards, reference, RNG). After every weight sync the engine's logprobs of the
    sampled tokens equal the trainer's (to fp32 rounding)."""
    split, a = kl_run
    ckpt = a / "checkpoints" / "step-2"
    assert sorted(p.name for p in (ckpt / "megatron").iterdir()) == (
        ["tp0_pp0.pt", "tp1_pp0.pt"] if split[0] == "--tp" else ["tp0_pp0.pt", "tp0_pp1.pt"]
    )
    _torchrun(warm_model, tmp_path, *split, *KL, "--resume", str(ckpt))
    rows_a = _train_rows(a)
    assert [r["step"] for r in rows_a] == [1, 2, 3]
    for r in rows_a:
        assert r["train/mismatch_abs_logp"] < 1e-5, r["step"]
    assert rows_a[-1]["train/kl"] > 1e-5  # two updates away from the reference
    ra, rb = rows_a[-1], next(r for r in _train_rows(tmp_path) if r["step"] == 3)
    for key in ("rollout/reward", "train/tokens", "train/kl", "train/loss", "train/grad_norm"):
        assert rb[key] == ra[key], key


def test_ppo_trains_its_value_head_on_the_last_stage(warm_model, tmp_path):
    _torchrun(warm_model, tmp_path, "--pp", "2", "--steps", "2", "--algo", "ppo")
    rows = _train_rows(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["train/mismatch_abs_logp"] < 1e-5 for r in rows)
    assert all(r["train/vf_loss"] > 0 for r in rows)


@pytest.mark.parametrize("sync", ["disk", "broadcast"])
def test_one_process_syncs_the_engine_through_every_transport(warm_model, tmp_path, sync):
    """Without torchrun (a world of one): the gathered HF weights reach the engine from a safetensors
    directory or over a torch.distributed group, and the engine then samples as the trainer scores."""
    cmd = [sys.executable, "-m", "agentrl.cli", "train", "--env", "countdown", "--model", str(warm_model),
           "--sft-steps", "0", "--tasks-per-step", "4", "--group-size", "4", "--eval-episodes", "4",
           "--eval-every", "0", "--steps", "2", "--run-dir", str(tmp_path), "--no-progress", "--no-tensorboard",
           "--backend", "megatron", "--weight-sync", sync]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-4000:]
    rows = _train_rows(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["train/mismatch_abs_logp"] < 1e-5 and r["sync/version"] == r["step"] for r in rows)
