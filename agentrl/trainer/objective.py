"""The micro-batch objectives the backend differentiates: the RL loss and supervised NLL.

Both take a micro-batch already scored by :mod:`agentrl.trainer.forward` (``logp`` and friends
in ``(B, T - 1)`` columns: column ``t - 1`` scores token ``t``) and return ``(loss, stats)``.
The loss is the micro-batch's *share* of the mini-batch loss: it is normalised by the global
counts ``num_tokens`` / ``num_seqs`` of the whole mini-batch on every rank, so that summing the
micro-batch gradients gives the full-batch gradient (see :mod:`agentrl.trainer.backend`).

A stat whose key ends in ``_tok`` is a token-weighted *sum* over the micro-batch (the backend
divides its all-rank total by the mini-batch's token count and drops the suffix); any other stat
is this micro-batch's share of a mini-batch total, summed as it is.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.trainer import losses as L
from agentrl.trainer import offpolicy as O
from agentrl.trainer.batch import TrainBatch
from agentrl.trainer.config import AlgoConfig
from agentrl.trainer.errors import BackendError

__all__ = ["rl_loss", "sft_loss"]


def sft_loss(mb: TrainBatch, logp: torch.Tensor, num_tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Negative log-likelihood of the ``loss_mask`` tokens, and how many of them are the argmax."""
    mask = mb.loss_mask[:, 1:]
    loss = -(logp * mask).sum() / num_tokens
    with torch.no_grad():
        correct = float(((logp > -0.6931) * mask).sum())  # p > 1/2: the token is the argmax
    return loss, {"loss": float(loss.detach()), "token_acc_tok": correct}


def rl_loss(
    algo: AlgoConfig,
    mb: TrainBatch,
    logp: torch.Tensor,
    ent_tok: torch.Tensor,
    values: torch.Tensor | None,
    num_tokens: float,
    num_seqs: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy loss, minus the entropy bonus, plus the KL penalty and (with ``values``, PPO) the value loss.

    ``ent_tok`` is the per-token entropy (differentiable when ``algo.entropy_coef > 0``);
    ``values`` the critic's ``(B, T - 1)`` values, or None without a value head.
    """
    a = algo
    mask = mb.loss_mask[:, 1:]
    agg = {"num_tokens": num_tokens, "num_seqs": num_seqs}
    loss, stats = _policy_term(a, mb, logp, mask, agg)
    if a.entropy_coef > 0:
        ent = L.aggregate(ent_tok, mask, a.loss_agg, **agg)
        loss = loss - a.entropy_coef * ent
        stats["entropy"] = float(ent.detach())
    else:
        stats["entropy_tok"] = float((ent_tok * mask).sum())
    if a.kl_coef > 0:
        if mb.ref_logp is None:
            raise BackendError("kl_coef > 0 but the batch has no ref_logp; compute them with ref_logprobs()")
        kl = L.aggregate(L.kl_penalty(logp, mb.ref_logp[:, 1:], a.kl_estimator), mask, a.loss_agg, **agg)
        loss = loss + a.kl_coef * kl
        stats["kl"] = float(kl.detach())
    if values is not None:
        vf = _value_term(a, mb, values, mask, agg)
        loss = loss + a.vf_coef * vf
        stats["vf_loss"] = float(vf.detach())
    stats["loss"] = float(loss.detach())
    return loss, stats


def _policy_term(
    a: AlgoConfig, mb: TrainBatch, logp: torch.Tensor, mask: torch.Tensor, agg: dict[str, float]
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped policy-gradient loss and its stats (``_tok`` sums, plus ``pg_loss``).

    Decoupled (``a.decoupled``), the clip is against ``mb.prox_logp`` and each token's loss is
    weighted by the corrected ``pi_prox / pi_behaviour`` (:mod:`agentrl.trainer.offpolicy`).
    """
    old = mb.old_logp[:, 1:]
    kw: dict[str, Any] = {
        "kind": a.policy_loss,
        "clip_low": a.clip_low,
        "clip_high": a.clip_high,
        "dual_clip": a.dual_clip,
        "agg": a.loss_agg,
        **agg,
    }
    if a.decoupled:
        if mb.prox_logp is None:
            raise BackendError("decoupled PPO but the batch has no prox_logp; compute them with logprobs()")
        low, high = a.is_bounds
        pg = O.decoupled_policy_loss(
            logp,
            mb.prox_logp[:, 1:],
            old,
            mb.advantages[:, 1:],
            mask,
            correction=a.rollout_correction,
            level=a.correction_level,
            cap=a.is_cap,
            low=low,
            high=high,
            **kw,
        )
    else:
        pg = L.policy_loss(logp, old, mb.advantages[:, 1:], mask, **kw)
        pg.stats.update(is_weight_mean=1.0, is_truncated_frac=0.0, is_masked_frac=0.0)
    ntok = float(mask.sum())
    stats = {f"{k}_tok": v * ntok for k, v in pg.stats.items()}
    stats["pg_loss"] = float(pg.loss.detach())
    with torch.no_grad():
        diff = (logp - old).abs() * mask
        stats["logprob_diff_tok"] = float(diff.sum())
    return pg.loss, stats


def _value_term(
    a: AlgoConfig, mb: TrainBatch, values: torch.Tensor, mask: torch.Tensor, agg: dict[str, float]
) -> torch.Tensor:
    """PPO's clipped value loss against the batch's returns."""
    if mb.returns is None or mb.old_values is None:
        raise BackendError("PPO batch needs returns and old_values")
    vl = L.value_loss(
        values,
        mb.old_values[:, 1:],
        mb.returns[:, 1:],
        mask,
        clip=a.value_clip,
        agg=a.loss_agg,
        **agg,
    )
    return vl.loss
