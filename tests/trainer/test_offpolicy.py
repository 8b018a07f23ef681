"""Off-policy correction: behaviour weights, decoupled PPO and mismatch metrics against plain-Python references."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.console import Console

sys.path.insert(0, str(Path(__file__).parent))
from _tiny import fixed_batch, tiny_model  # noqa: E402

from agentrl.errors import ConfigError  # noqa: E402
from agentrl.trainer import losses as L  # noqa: E402
from agentrl.trainer import offpolicy as O  # noqa: E402
from agentrl.trainer.algorithm import make_backend as FSDP2Backend  # noqa: E402
from agentrl.trainer.config import AlgoConfig, OptimConfig, resolve  # noqa: E402
from agentrl.trainer.errors import BackendError  # noqa: E402

MISMATCH_KEYS = ("is_ratio_p1", "is_ratio_p50", "is_ratio_p99", "is_ess", "mismatch_abs_logp", "mismatch_kl")


def _data(B: int = 5, T: int = 9, seed: int = 0, spread: float = 0.6):
    g = torch.Generator().manual_seed(seed)
    behav = torch.randn(B, T, generator=g, dtype=torch.float64) * 0.5 - 1.5
    # a per-row shift, so that sequences' geometric means leave the band too
    shift = torch.randn(B, 1, generator=g, dtype=torch.float64) * spread
    prox = behav + shift + torch.randn(B, T, generator=g, dtype=torch.float64) * spread
    logp = (prox + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3).requires_grad_()
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T)
    mask = (torch.rand(B, T, generator=g) > 0.3).long()
    mask[:, 0] = 1
    return logp, prox, behav, adv, mask


def _sampled(mask) -> list[tuple[int, int]]:
    return [(b, t) for b in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[b, t]]


def _ref_rho(prox, behav, mask, level):
    """Per-token ρ, or the sequence's geometric mean on each sampled token; 0 off the mask."""
    B, T = mask.shape
    rho = [[0.0] * T for _ in range(B)]
    for b in range(B):
        ts = [t for t in range(T) if mask[b, t]]
        if level == "sequence":
            s = math.exp(sum(prox[b, t].item() - behav[b, t].item() for t in ts) / len(ts))
        for t in ts:
            rho[b][t] = s if level == "sequence" else math.exp(prox[b, t].item() - behav[b, t].item())
    return rho


def _ref_weight(r, correction, cap, low, high):
    """(weight, truncated, masked) of one sampled token's ratio."""
    if correction == "none":
        return r, 0, 0
    if correction == "tis":
        return min(r, cap), int(r > cap), 0
    keep = low <= r <= high
    return (r if keep else 0.0), 0, int(not keep)


CASES = [
    ("none", "token"),
    ("tis", "token"),
    ("tis", "sequence"),
    ("mis", "token"),
    ("mis", "sequence"),
    ("icepop", "token"),
]


@pytest.mark.parametrize(("correction", "level"), CASES)
def test_behaviour_weights_match_reference(correction, level):
    _, prox, behav, _, mask = _data(spread=0.8)
    cap, low, high = 1.5, 0.6, 1.4
    got = O.behaviour_weights(
        prox, behav, mask, correction=correction, level=level, cap=cap, low=low, high=high
    )
    rho = _ref_rho(prox, behav, mask, level)
    n_trunc = n_mask = 0
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if not mask[b, t]:
                assert got.weights[b, t].item() == 0.0
                continue
            w, tr, ma = _ref_weight(rho[b][t], correction, cap, low, high)
            assert got.weights[b, t].item() == pytest.approx(w, rel=1e-12)
            assert got.ratio[b, t].item() == pytest.approx(rho[b][t], rel=1e-12)
            assert (got.truncated[b, t].item(), got.masked[b, t].item()) == (tr, ma)
            n_trunc, n_mask = n_trunc + tr, n_mask + ma
    # the data exercise the branch under test
    assert n_trunc > 0 if correction == "tis" else n_trunc == 0
    assert n_mask > 0 if correction in ("mis", "icepop") else n_mask == 0


def _ref_ppo_grad(lp, prox, a, lo, hi, c):
    """(per-token PPO term, its derivative in lp) against the proximal policy."""
    r = math.exp(lp - prox)
    v1, v2 = -a * r, -a * min(max(r, 1 - lo), 1 + hi)
    v, grad = (v2, 0.0) if v2 > v1 else (v1, -a * r)
    if c and a < 0 and -a * c < v:
        v, grad = -a * c, 0.0
    return v, grad


@pytest.mark.parametrize(("correction", "level"), CASES)
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_decoupled_ppo_loss_and_gradient_match_reference(correction, level, agg):
    logp, prox, behav, adv, mask = _data(spread=0.8)
    lo, hi, c, cap, low, high = 0.2, 0.28, 3.0, 1.5, 0.6, 1.4
    out = O.decoupled_policy_loss(
        logp,
        prox,
        behav,
        adv,
        mask,
        correction=correction,
        level=level,
        cap=cap,
        low=low,
        high=high,
        kind="ppo",
        clip_low=lo,
        clip_high=hi,
        dual_clip=c,
        agg=agg,
    )
    out.loss.backward()
    B, T = mask.shape
    rho = _ref_rho(prox, behav, mask, level)
    n_tok = int(mask.sum())
    exp_loss = 0.0
    for b in range(B):
        ts = [t for t in range(T) if mask[b, t]]
        denom = n_tok if agg == "token-mean" else len(ts) * B
        for t in ts:
            w = _ref_weight(rho[b][t], correction, cap, low, high)[0]
            v, g = _ref_ppo_grad(logp[b, t].item(), prox[b, t].item(), adv[b, t].item(), lo, hi, c)
            exp_loss += w * v / denom
            # truncation and masking act on the gradient too: a masked token gets none
            assert logp.grad[b, t].item() == pytest.approx(w * g / denom, rel=1e-9, abs=1e-15)
        for t in range(T):
            if not mask[b, t]:
                assert logp.grad[b, t].item() == 0.0
    assert out.loss.item() == pytest.approx(exp_loss, rel=1e-9)
    assert out.stats["is_masked_frac"] == pytest.approx(
        sum(_ref_weight(rho[b][t], correction, cap, low, high)[2] for b, t in _sampled(mask)) / n_tok
    )


@pytest.mark.parametrize("kind", ["ppo", "gspo", "cispo"])
def test_decoupled_with_prox_equal_to_behaviour_is_plain_ppo_exactly(kind):
    logp, _, behav, adv, mask = _data()
    kw = {"kind": kind, "clip_low": 0.2, "clip_high": 0.28, "agg": "token-mean"}
    plain = L.policy_loss(logp, behav, adv, mask, **kw)
    (g_plain,) = torch.autograd.grad(plain.loss, logp)
    dec = O.decoupled_policy_loss(logp, behav.clone(), behav, adv, mask, **kw)
    (g_dec,) = torch.autograd.grad(dec.loss, logp)
    assert torch.equal(plain.loss, dec.loss) and torch.equal(g_plain, g_dec)
    assert dec.stats["is_weight_mean"] == 1.0 and dec.stats["is_masked_frac"] == 0.0


def test_policy_loss_weights_of_one_leave_it_unchanged():
    logp, _, behav, adv, mask = _data()
    a = L.policy_loss(logp, behav, adv, mask)
    b = L.policy_loss(logp, behav, adv, mask, weights=torch.ones_like(behav))
    assert torch.equal(a.loss, b.loss)


def test_mismatch_stats_match_reference():
    _, prox, behav, _, mask = _data(B=7, T=30, spread=0.4)
    got = O.mismatch_stats(prox, behav, mask)
    lr = [prox[b, t].item() - behav[b, t].item() for b, t in _sampled(mask)]
    r = [math.exp(x) for x in lr]
    p1, p50, p99 = np.percentile(r, [1, 50, 99])
    assert got["is_ratio_p1"] == pytest.approx(p1, rel=1e-9)
    assert got["is_ratio_p50"] == pytest.approx(p50, rel=1e-9)
    assert got["is_ratio_p99"] == pytest.approx(p99, rel=1e-9)
    assert got["is_ess"] == pytest.approx(sum(r) ** 2 / (len(r) * sum(x * x for x in r)), rel=1e-9)
    assert got["mismatch_abs_logp"] == pytest.approx(sum(abs(x) for x in lr) / len(lr), rel=1e-9)
    kl = sum(x - 1 - math.log(x) for x in r) / len(r)
    assert got["mismatch_kl"] == pytest.approx(kl, rel=1e-9) and kl > 0
    same = O.mismatch_stats(behav, behav, mask)
    assert same["is_ess"] == 1.0 and same["mismatch_kl"] == 0.0 and same["is_ratio_p99"] == 1.0


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"rollout_correction": "tis"}, "add --decoupled"),
        (
            {"decoupled": True, "rollout_correction": "icepop", "correction_level": "sequence"},
            "single tokens",
        ),
        ({"decoupled": True, "is_cap": 0.5}, "is_cap=0.5"),
        ({"decoupled": True, "rollout_correction": "mis", "is_low": 1.2}, "is_low/is_high"),
        ({"decoupled": True, "rollout_correction": "mis", "is_high": 0.9}, "must keep on-policy"),
    ],
)
def test_bad_correction_config_names_the_field(kw, needle):
    with pytest.raises(ConfigError, match=needle):
        AlgoConfig(**kw)


def test_band_defaults_are_derived_per_correction():
    assert AlgoConfig(decoupled=True, rollout_correction="mis").is_bounds == (0.5, 2.0)
    assert AlgoConfig(decoupled=True, rollout_correction="icepop").is_bounds == (0.5, 5.0)
    assert AlgoConfig(decoupled=True, rollout_correction="icepop", is_high=3.0).is_bounds == (0.5, 3.0)


def _sgd(lr: float):
    return lambda ps: torch.optim.SGD(ps, lr=lr)


def test_backend_decoupled_on_policy_updates_exactly_like_plain_ppo():
    """prox == behaviour (both the trainer's own logprobs): the same weights after the update."""
    params = []
    for decoupled in (False, True):
        model = tiny_model()
        be = FSDP2Backend(model, AlgoConfig(decoupled=decoupled), OptimConfig(), optimizer_factory=_sgd(0.5))
        batch = fixed_batch()
        batch.old_logp = be.logprobs(batch)
        if decoupled:
            batch.prox_logp = batch.old_logp.clone()
        stats = be.train_step(batch)
        assert stats["is_ess"] == pytest.approx(1.0, abs=1e-6)
        params.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*params, strict=True))


def test_backend_decoupled_tis_reports_the_correction_on_stale_tokens():
    model = tiny_model()
    algo = AlgoConfig(decoupled=True, rollout_correction="tis", is_cap=1.2)
    be = FSDP2Backend(model, algo, OptimConfig(), optimizer_factory=_sgd(0.1))
    batch = fixed_batch()
    prox = be.logprobs(batch)
    g = torch.Generator().manual_seed(3)
    batch.old_logp = (prox + torch.randn(prox.shape, generator=g) * 0.3) * batch.loss_mask
    with pytest.raises(BackendError, match="prox_logp"):
        be.train_step(batch)
    batch.prox_logp = prox
    stats = be.train_step(batch)
    m = batch.loss_mask[:, 1:] > 0
    rho = torch.exp(prox[:, 1:] - batch.old_logp[:, 1:])[m]
    assert stats["is_truncated_frac"] == pytest.approx(float((rho > 1.2).float().mean()), rel=1e-6)
    assert stats["is_masked_frac"] == 0.0
    ref = O.mismatch_stats(prox[:, 1:], batch.old_logp[:, 1:], batch.loss_mask[:, 1:])
    for k in MISMATCH_KEYS:
        assert stats[k] == pytest.approx(ref[k], rel=1e-6), k
    assert 0 < stats["is_ess"] < 1 and stats["mismatch_kl"] > 0


FAST = {
    "model": "tiny-qwen3",
    "group_size": 2,
    "tasks_per_step": 2,
    "max_new_tokens": 6,
    "eval_episodes": 2,
    "sft_steps": 0,
    "eval_every": 0,
    "progress": False,
    "tensorboard": False,
}
# one step stale, and weights that move although the untrained model earns no reward (the entropy
# bonus has a gradient): the tokens a step trains on come from weights one update older
STALE = {"max_staleness": 1, "entropy_coef": 0.1, "lr": 1e-2}


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"decoupled": True, **STALE},
        {"decoupled": True, "rollout_correction": "tis", "is_cap": 1.01, **STALE},
        {"decoupled": True, "rollout_correction": "tis", "correction_level": "sequence"},
        {"decoupled": True, "rollout_correction": "mis", "epochs": 2},
        {"decoupled": True, "rollout_correction": "icepop", **STALE},
    ],
)
def test_training_with_each_correction_logs_finite_mismatch_metrics(kw, tmp_path):
    from agentrl.trainer.loop import train
    from agentrl.trainer.metrics import read_jsonl

    steps = 3
    cfg = resolve(**FAST, **kw, steps=steps, run_dir=str(tmp_path))
    train(cfg, console=Console(file=open("/dev/null", "w")))  # noqa: SIM115
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "train"]
    assert len(rows) == steps
    for row in rows:
        for k in (*MISMATCH_KEYS, "is_truncated_frac", "is_masked_frac", "is_weight_mean", "loss"):
            assert math.isfinite(row[f"train/{k}"]), (k, row)
        assert 0 < row["train/is_ess"] <= 1 + 1e-9
        assert row["train/is_ratio_p1"] <= row["train/is_ratio_p50"] <= row["train/is_ratio_p99"]
    stale = [r for r in rows if r["train/staleness_max"] >= 1]
    if "max_staleness" in kw:
        assert stale, rows
    for row in stale:  # the engine sampled with older weights: the metrics see it
        assert row["train/mismatch_abs_logp"] > 1e-3 and row["train/is_ess"] < 1
        assert row["train/mismatch_kl"] > 0
        if kw.get("rollout_correction") == "tis" and row["train/staleness_mean"] >= 0.5:
            assert row["train/is_truncated_frac"] > 0  # most tokens stale: some ratio passes 1.01
