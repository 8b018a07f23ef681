"""The FSDP2 backend: a train step moves the weights, matches an independent loss, splits exactly."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))
from _tiny import fixed_batch, tiny_model  # noqa: E402

from agentrl.trainer.algorithm import make_backend as FSDP2Backend  # noqa: E402
from agentrl.trainer.config import AlgoConfig, OptimConfig  # noqa: E402
from agentrl.trainer.errors import BackendError, CheckpointError  # noqa: E402

HERE = Path(__file__).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sgd(lr: float):
    return lambda ps: torch.optim.SGD(ps, lr=lr)


def _with_current_logp(be: FSDP2Backend, batch):
    batch.old_logp = be.logprobs(batch) * batch.loss_mask
    return batch


def test_train_step_matches_independent_loss_and_moves_weights():
    model = tiny_model()
    be = FSDP2Backend(model, AlgoConfig(), OptimConfig(lr=1e-2))
    batch = _with_current_logp(be, fixed_batch())
    # independent: on-policy, ratio 1 -> loss = -sum(A * mask) / sum(mask)
    m = batch.loss_mask[:, 1:]
    expected = float(-(batch.advantages[:, 1:] * m).sum() / m.sum())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stats = be.train_step(batch)
    assert stats["loss"] == pytest.approx(expected, rel=1e-5)
    assert stats["logprob_diff"] < 1e-5
    moved = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert moved == list(before)  # every parameter received a gradient and moved
    assert stats["grad_norm"] > 0


def test_repeated_steps_lower_the_loss_on_a_fixed_batch():
    be = FSDP2Backend(tiny_model(), AlgoConfig(clip_low=0.9, clip_high=100.0), OptimConfig(lr=3e-3))
    batch = _with_current_logp(be, fixed_batch())
    losses = [be.train_step(batch)["loss"] for _ in range(8)]
    assert losses[-1] < losses[0] - 0.05, losses
    # the sampled tokens with positive advantage became more likely
    new = be.logprobs(batch)
    pos = (batch.advantages > 0) & (batch.loss_mask > 0)
    assert (new - batch.old_logp)[pos].mean() > 0


@pytest.mark.parametrize("entropy_coef", [0.0, 0.01])
def test_lm_head_on_the_trained_window_gives_the_full_update(entropy_coef):
    """The LM head runs only from the first trained token; the update is the one of full logits."""
    # fixed_batch's rows share no prompt, so the window is the only difference
    results = []
    for window in (True, False):
        model = tiny_model()
        be = FSDP2Backend(
            model, AlgoConfig(entropy_coef=entropy_coef), OptimConfig(), optimizer_factory=_sgd(0.5)
        )
        assert be._logits_to_keep
        be._logits_to_keep = window
        batch = _with_current_logp(be, fixed_batch())
        logp, _, _ = be._forward(model, batch, window=True)
        stats = be.train_step(batch)
        results.append((logp.detach() * batch.loss_mask[:, 1:], stats, model.state_dict()))
    (lp_w, st_w, sd_w), (lp_f, st_f, sd_f) = results
    torch.testing.assert_close(lp_w, lp_f, atol=1e-6, rtol=1e-5)
    for key in ("loss", "entropy", "grad_norm"):
        assert st_w[key] == pytest.approx(st_f[key], rel=1e-5), key
    for k in sd_w:
        torch.testing.assert_close(sd_w[k], sd_f[k], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum"])
def test_micro_batches_give_the_full_batch_update(agg):
    results = []
    for budget in (10_000, 40):
        model = tiny_model()
        be = FSDP2Backend(
            model,
            AlgoConfig(loss_agg=agg),
            OptimConfig(micro_batch_tokens=budget),
            optimizer_factory=_sgd(0.5),
        )
        be.train_step(_with_current_logp(be, fixed_batch()))
        results.append(model.state_dict())
    for k in results[0]:
        torch.testing.assert_close(results[0][k], results[1][k], atol=1e-6, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(("decoupled", "chunk"), [(False, 1024), (True, 1024), (False, 5)])
def test_fsdp2_two_processes_match_one(decoupled, chunk, tmp_path):
    """Two gloo ranks make the one-process update; ``chunk`` 5: the sharded model's chunked scoring."""
    ref_model = tiny_model()
    algo = AlgoConfig(decoupled=decoupled, rollout_correction="tis" if decoupled else "none")
    ref = FSDP2Backend(ref_model, algo, OptimConfig(micro_batch_tokens=40), optimizer_factory=_sgd(0.5))
    batch = _with_current_logp(ref, fixed_batch())
    if decoupled:  # stale behaviour logprobs; each rank scores its own rows' proximal ones
        batch.prox_logp = batch.old_logp.clone()
        batch.old_logp = batch.old_logp + torch.randn(batch.old_logp.shape) * 0.6 * batch.loss_mask
    out = str(tmp_path / "w.safetensors")
    torch.save(batch.old_logp, out + ".old.pt")
    before = {k: v.clone() for k, v in ref_model.state_dict().items()}
    stats1 = ref.train_step(batch)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parents[1])}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(_free_port()),
            str(HERE / "_fsdp_worker.py"),
            out,
            "decoupled" if decoupled else "coupled",
            str(chunk),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = load_file(out)
    stats2 = torch.load(out + ".stats.pt")
    assert stats2["loss"] == pytest.approx(stats1["loss"], rel=1e-5)
    assert stats2["grad_norm"] == pytest.approx(stats1["grad_norm"], rel=1e-4)
    if decoupled:
        assert stats2["is_truncated_frac"] == pytest.approx(stats1["is_truncated_frac"], rel=1e-5)
        assert stats1["is_truncated_frac"] > 0
    for k, v in ref_model.state_dict().items():
        assert not torch.equal(v, before[k])
        torch.testing.assert_close(got[k], v, atol=1e-5, rtol=1e-4)


def test_save_load_restores_weights_and_optimizer(tmp_path):
    be = FSDP2Backend(tiny_model(), AlgoConfig(), OptimConfig(lr=1e-2))
    batch = _with_current_logp(be, fixed_batch())
    be.train_step(batch)
    be.save(tmp_path / "ck", extra={"step": 1})
    nxt = be.train_step(batch)
    be2 = FSDP2Backend(tiny_model(seed=5), AlgoConfig(), OptimConfig(lr=1e-2))
    assert be2.load(tmp_path / "ck") == {"step": 1}
    again = be2.train_step(batch)
    assert again["loss"] == pytest.approx(nxt["loss"], rel=1e-6)
    for (k, v), (_, w) in zip(be.model.state_dict().items(), be2.model.state_dict().items(), strict=True):
        torch.testing.assert_close(v, w, msg=k)
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path / "ck").config.hidden_size == 32
    (tmp_path / "ck" / "trainer_state.pt").unlink()
    with pytest.raises(CheckpointError, match="trainer_state.pt is missing"):
        be2.load(tmp_path / "ck")


def test_ppo_value_head_and_kl_train():
    algo = AlgoConfig(algo="ppo", kl_coef=0.1, entropy_coef=0.01, value_clip=10.0)
    be = FSDP2Backend(tiny_model(), algo, OptimConfig(lr=3e-3), value_head=True, ref_model=tiny_model())
    batch = _with_current_logp(be, fixed_batch())
    batch.ref_logp = be.ref_logprobs(batch)
    batch.old_values = be.values(batch)
    batch.returns = batch.advantages.clone()
    s1 = be.train_step(batch)
    assert s1["kl"] == pytest.approx(0.0, abs=1e-6) and s1["vf_loss"] > 0
    for _ in range(10):
        s2 = be.train_step(batch)
    assert s2["kl"] > 0 and s2["vf_loss"] < 0.8 * s1["vf_loss"]


def test_empty_loss_mask_is_an_error():
    be = FSDP2Backend(tiny_model(), AlgoConfig(), OptimConfig())
    batch = fixed_batch()
    batch.loss_mask.zero_()
    with pytest.raises(BackendError, match="no sampled tokens"):
        be.train_step(batch)
