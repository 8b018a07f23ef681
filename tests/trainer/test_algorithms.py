"""Advantages and losses against straightforward per-element reference implementations."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from agentrl.trainer import advantages as A
from agentrl.trainer import losses as L
from agentrl.trainer.algo_config import AlgoConfig

torch.manual_seed(0)


def _groups(n_groups: int = 4, g: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    rewards = torch.randn(n_groups * g, dtype=torch.float64)
    gid = torch.arange(n_groups).repeat_interleave(g)
    perm = torch.randperm(len(gid))  # groups need not be contiguous
    return rewards[perm], gid[perm]


def _by_group(rewards: torch.Tensor, gid: torch.Tensor) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for r, g in zip(rewards.tolist(), gid.tolist(), strict=True):
        out.setdefault(g, []).append(r)
    return out


def test_grpo_drgrpo_rloo_match_reference():
    r, gid = _groups()
    groups = _by_group(r, gid)
    grpo, dr, rl = A.grpo(r, gid), A.dr_grpo(r, gid), A.rloo(r, gid)
    for i, (ri, gi) in enumerate(zip(r.tolist(), gid.tolist(), strict=True)):
        xs = groups[gi]
        mean = sum(xs) / len(xs)
        assert grpo[i].item() == pytest.approx((ri - mean) / (statistics.stdev(xs) + 1e-6), rel=1e-9)
        assert dr[i].item() == pytest.approx(ri - mean, abs=1e-12)
        others = (sum(xs) - ri) / (len(xs) - 1)
        assert rl[i].item() == pytest.approx(ri - others, abs=1e-12)


def test_grpo_constant_group_gives_zero_advantage():
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0])
    gid = torch.tensor([0, 0, 0, 1, 1])
    adv = A.grpo(r, gid)
    assert adv[:3].abs().max().item() == 0.0
    assert adv[3].item() < 0 < adv[4].item()


def test_reinforce_pp_is_batch_normalised():
    r, gid = _groups()
    adv = A.reinforce_pp(r, gid, baseline=True)
    groups = _by_group(r, gid)
    centred = [ri - sum(groups[g]) / len(groups[g]) for ri, g in zip(r.tolist(), gid.tolist(), strict=True)]
    mu, sd = statistics.mean(centred), statistics.stdev(centred)
    for a, c in zip(adv.tolist(), centred, strict=True):
        assert a == pytest.approx((c - mu) / (sd + 1e-6), rel=1e-9)
    plain = A.reinforce_pp(r, None, baseline=False)
    assert plain.mean().item() == pytest.approx(0.0, abs=1e-9)
    assert plain.std().item() == pytest.approx(1.0, rel=1e-4)


def test_rloo_rejects_singleton_group():
    with pytest.raises(ValueError, match="at least 2"):
        A.rloo(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 0, 1]))


def test_gae_matches_loop_over_sampled_tokens():
    B, T, gamma, lam = 3, 9, 0.9, 0.8
    mask = (torch.rand(B, T) > 0.3).long()
    mask[:, 0] = 0
    values = torch.randn(B, T, dtype=torch.float64)
    rewards = torch.randn(B, T, dtype=torch.float64) * mask
    adv, ret = A.gae(rewards, values, mask, gamma, lam)
    for b in range(B):
        idx = [t for t in range(T) if mask[b, t]]
        exp = [0.0] * len(idx)
        nxt_v, nxt_a = 0.0, 0.0
        for k in reversed(range(len(idx))):
            t = idx[k]
            delta = rewards[b, t].item() + gamma * nxt_v - values[b, t].item()
            exp[k] = delta + gamma * lam * nxt_a
            nxt_v, nxt_a = values[b, t].item(), exp[k]
        for k, t in enumerate(idx):
            assert adv[b, t].item() == pytest.approx(exp[k], abs=1e-10)
            assert ret[b, t].item() == pytest.approx(exp[k] + values[b, t].item(), abs=1e-10)
        for t in range(T):
            if not mask[b, t]:
                assert adv[b, t].item() == 0.0


def _ref_ppo(lp, olp, a, lo, hi, c):
    r = math.exp(lp - olp)
    v = max(-a * r, -a * min(max(r, 1 - lo), 1 + hi))
    if c and a < 0:
        v = min(v, -a * c)
    return v


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_ppo_clip_higher_dual_clip_and_aggregation(agg):
    B, T = 4, 7
    logp = (torch.randn(B, T, dtype=torch.float64) * 0.5 - 1).requires_grad_()
    old = logp.detach() + torch.randn(B, T, dtype=torch.float64) * 0.6
    adv = torch.randn(B, 1, dtype=torch.float64).expand(B, T)
    mask = (torch.rand(B, T) > 0.25).long()
    mask[:, 0] = 1
    out = L.policy_loss(
        logp, old, adv, mask, kind="ppo", clip_low=0.2, clip_high=0.28, dual_clip=3.0, agg=agg
    )
    per = [
        [_ref_ppo(logp[b, t].item(), old[b, t].item(), adv[b, t].item(), 0.2, 0.28, 3.0) for t in range(T)]
        for b in range(B)
    ]
    tok = [(b, t) for b in range(B) for t in range(T) if mask[b, t]]
    if agg == "token-mean":
        exp = sum(per[b][t] for b, t in tok) / len(tok)
    elif agg == "seq-mean-token-mean":
        exp = sum(sum(per[b][t] for t in range(T) if mask[b, t]) / int(mask[b].sum()) for b in range(B)) / B
    else:
        exp = sum(sum(per[b][t] for t in range(T) if mask[b, t]) for b in range(B)) / B
    assert out.loss.item() == pytest.approx(exp, rel=1e-9)
    out.loss.backward()
    assert logp.grad is not None and logp.grad[mask == 0].abs().max().item() == 0.0


def test_ppo_gradient_is_zero_outside_clip_region():
    logp = torch.tensor([[0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.0, 0.0]])  # ratio e ≈ 2.72 on token 0, 1 on token 1
    adv = torch.ones(1, 2)
    L.policy_loss(logp, old, adv, torch.ones(1, 2), clip_low=0.2, clip_high=0.28).loss.backward()
    assert logp.grad[0, 0].item() == 0.0 and logp.grad[0, 1].item() == pytest.approx(-0.5)


def test_gspo_uses_sequence_ratio():
    B, T = 3, 5
    logp = (torch.randn(B, T, dtype=torch.float64) * 0.3).requires_grad_()
    old = logp.detach() + torch.randn(B, T, dtype=torch.float64) * 0.2
    adv = torch.randn(B, 1, dtype=torch.float64).expand(B, T)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, 3:] = 0
    out = L.policy_loss(
        logp, old, adv, mask, kind="gspo", clip_low=0.1, clip_high=0.1, agg="seq-mean-token-mean"
    )
    exp = 0.0
    for b in range(B):
        ts = [t for t in range(T) if mask[b, t]]
        s = math.exp(sum(logp[b, t].item() - old[b, t].item() for t in ts) / len(ts))
        a = adv[b, 0].item()
        exp += max(-a * s, -a * min(max(s, 0.9), 1.1))
    assert out.loss.item() == pytest.approx(exp / B, rel=1e-9)
    # unclipped sequence: d loss / d logp_t = -A * s / |y| (per-token mean within the sequence)
    out.loss.backward()
    for b in range(B):
        ts = [t for t in range(T) if mask[b, t]]
        s = math.exp(sum(logp[b, t].item() - old[b, t].item() for t in ts) / len(ts))
        if 0.9 < s < 1.1:
            assert logp.grad[b, ts[0]].item() == pytest.approx(-adv[b, 0].item() * s / len(ts) / B, rel=1e-6)


def test_cispo_keeps_gradient_on_clipped_tokens():
    logp = torch.tensor([[0.0, 0.0]], requires_grad=True, dtype=torch.float64)
    old = torch.tensor([[-1.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([[2.0, 2.0]], dtype=torch.float64)
    out = L.policy_loss(logp, old, adv, torch.ones(1, 2), kind="cispo", clip_low=0.2, clip_high=0.28)
    assert out.loss.item() == pytest.approx(-(1.28 * 2 * 0 + 1 * 2 * 0) / 2)
    out.loss.backward()
    assert logp.grad.tolist() == [[pytest.approx(-1.28 * 2 / 2), pytest.approx(-1.0 * 2 / 2)]]
    assert out.stats["clip_frac"] == 0.5


def test_kl_estimators():
    logp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    ref = torch.tensor([-1.5, -1.0, -0.5], dtype=torch.float64)
    for est, f in {
        "k1": lambda p, q: p - q,
        "k2": lambda p, q: 0.5 * (p - q) ** 2,
        "k3": lambda p, q: math.exp(q - p) - (q - p) - 1,
    }.items():
        got = L.kl_penalty(logp, ref, est)
        for i in range(3):
            assert got[i].item() == pytest.approx(f(logp[i].item(), ref[i].item()), abs=1e-12)
    assert L.kl_penalty(logp, ref, "k3").min().item() >= 0.0


def _expected_grad(estimator: str, logits: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """E_{a~pi}[grad estimator(a)] by exact enumeration over the actions.

    Each action's term is weighted by pi(a) detached: the trainer's loss is a mean over sampled
    tokens, whose gradient never sees the probability that chose them.
    """
    logp = torch.log_softmax(logits, -1)
    per_action = L.kl_penalty(logp, ref_logp, estimator)
    (g,) = torch.autograd.grad((logp.exp().detach() * per_action).sum(), logits)
    return g


def test_default_kl_estimator_gradient_is_grad_of_kl_pi_ref():
    """By enumeration over a 5-token policy: the default's expected gradient is grad KL(pi || ref).

    k3 (unbiased for the value) follows grad KL(ref || pi) instead, and k1's is zero
    (Schulman 2020; Tang & Munos 2025, "On a few pitfalls in KL divergence gradient estimation").
    """
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(5, generator=gen, dtype=torch.float64).requires_grad_()
    ref_logp = torch.log_softmax(torch.randn(5, generator=gen, dtype=torch.float64) * 1.5, -1)
    logp = torch.log_softmax(logits, -1)
    kl_pi_ref = (logp.exp() * (logp - ref_logp)).sum()
    kl_ref_pi = (ref_logp.exp() * (ref_logp - logp)).sum()
    reverse = torch.autograd.grad(kl_pi_ref, logits, retain_graph=True)[0]  # grad KL(pi || ref)
    forward = torch.autograd.grad(kl_ref_pi, logits)[0]  # grad KL(ref || pi)
    assert (reverse - forward).abs().max().item() > 0.1  # the two directions differ here

    default = AlgoConfig().kl_estimator
    torch.testing.assert_close(_expected_grad(default, logits, ref_logp), reverse, rtol=1e-12, atol=1e-12)
    for est in ("k2", "k3+"):
        torch.testing.assert_close(_expected_grad(est, logits, ref_logp), reverse, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(_expected_grad("k3", logits, ref_logp), forward, rtol=1e-12, atol=1e-12)
    assert _expected_grad("k1", logits, ref_logp).abs().max().item() < 1e-12
    # k3+ reports k3's value (non-negative, unbiased for KL(pi || ref)): what the `kl` metric shows
    with torch.no_grad():
        value = (logp.exp() * L.kl_penalty(logp, ref_logp, default)).sum()
        torch.testing.assert_close(L.kl_penalty(logp, ref_logp, "k3+"), L.kl_penalty(logp, ref_logp, "k3"))
        torch.testing.assert_close(value, kl_pi_ref, rtol=1e-12, atol=1e-12)


def test_entropy_from_logits():
    logits = torch.randn(2, 3, 11)
    ent = L.entropy_from_logits(logits)
    p = torch.softmax(logits[1, 2].double(), -1).tolist()
    assert ent[1, 2].item() == pytest.approx(-sum(x * math.log(x) for x in p), rel=1e-5)
    assert L.entropy_from_logits(torch.zeros(1, 8)).item() == pytest.approx(math.log(8), rel=1e-6)


def test_value_loss_clipped():
    v = torch.tensor([[1.0, 0.0, 2.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[0.0, 0.0, 0.0]], dtype=torch.float64)
    ret = torch.tensor([[0.5, 1.0, 3.0]], dtype=torch.float64)
    out = L.value_loss(v, old, ret, torch.ones(1, 3), clip=0.2)
    exp = []
    for vi, oi, ri in zip([1.0, 0.0, 2.0], [0.0] * 3, [0.5, 1.0, 3.0], strict=True):
        vc = oi + max(-0.2, min(0.2, vi - oi))
        exp.append(0.5 * max((vi - ri) ** 2, (vc - ri) ** 2))
    assert out.loss.item() == pytest.approx(sum(exp) / 3)


def test_micro_batch_denominators_add_up_to_full_batch():
    B, T = 6, 5
    per = torch.randn(B, T)
    mask = (torch.rand(B, T) > 0.3).long()
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        full = L.aggregate(per, mask, mode)
        parts = sum(
            L.aggregate(
                per[i : i + 2], mask[i : i + 2], mode, num_tokens=float(mask.sum()), num_seqs=float(B)
            )
            for i in range(0, B, 2)
        )
        assert parts.item() == pytest.approx(full.item(), rel=1e-5)


def test_dynamic_sampling_and_overlong_penalty():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5])
    gid = torch.tensor([0, 0, 1, 1, 2, 2])
    assert L.dynamic_sampling_keep(r, gid).tolist() == [False, False, True, True, False, False]
    lengths = torch.tensor([10, 24, 28, 32])
    pen = L.overlong_penalty(lengths, max_len=32, buffer=8, penalty=1.0)
    assert pen.tolist() == [0.0, 0.0, pytest.approx(-0.5), pytest.approx(-1.0)]
    assert L.overlong_penalty(lengths, 32, 0).abs().sum().item() == 0.0
