"""Off-policy correction: decoupled PPO, the behaviour weights that correct it, and mismatch metrics.

Three policies score every sampled token ``y_t`` (all ``(B, T)``, ``mask`` 1 on sampled tokens):

- ``behav_logp``: the behaviour policy μ, the engine that sampled the token (the rollout's own
  logprobs: an older version under asynchronous rollout, and another numerical implementation
  of the same weights even when synchronous);
- ``prox_logp``: the proximal policy π_prox, the trainer's weights at the start of the step's
  update, scored by one no-grad forward before its first optimizer step;
- ``logp``: the policy π_θ being trained (carries the gradient).

**Decoupled PPO** (Hilton et al. 2022, "Batch size-invariance for policy optimization",
arXiv:2110.00641, eq. 2; used for asynchronous RL by AReaL, Fu et al. 2025, arXiv:2505.24298,
eq. 5) separates PPO's two uses of the old policy: the clip keeps π_θ near π_prox, and the
behaviour weight ``ρ_t = π_prox(y_t) / μ(y_t)`` corrects for the tokens having been sampled by μ::

    L = - w_t · min(r_t A_t, clip(r_t, 1 - ε_low, 1 + ε_high) A_t),   r_t = π_θ / π_prox,  w_t = g(ρ_t)

``w`` is detached. Without decoupling (the default) ``r_t = π_θ / μ`` and ``w = 1``. The
correction ``g`` decides what happens to extreme ``ρ`` (``correction``):

- ``none``: ``w = ρ`` (plain decoupled PPO, unbounded);
- ``tis``, truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly
  brings you off-policy RL training", fengyao.notion.site/off-policy-rl; Ionides 2008):
  ``w = min(ρ, C)``;
- ``mis``, masked importance sampling (Liu, Li et al. 2025, "When speed kills stability:
  demystifying RL collapse from the training-inference mismatch", richardli.xyz/rl-collapse):
  ``w = ρ · 1[low ≤ ρ ≤ high]``: a token (or sequence) outside the band leaves the loss;
- ``icepop`` (Ling team 2025, "Every step evolves: scaling reinforcement learning for
  trillion-scale thinking model", arXiv:2510.18855, eq. 6): ``w = ρ · 1[α ≤ ρ ≤ β]`` per token,
  IcePop's two-sided mask, with their band ``[0.5, 5]`` as its default.

``level="sequence"`` (``tis`` and ``mis``) replaces each token's ρ with its sequence's
*geometric mean* ``ρ_seq = exp(mean_t log ρ_t)`` over the sequence's sampled tokens, the
length-normalised ratio of GSPO and of the geometric rejection sampling of Liu, Li et al. The
product ``∏ ρ_t`` is the unbiased sequence weight, but its variance grows exponentially with
the length, so no fixed threshold would suit both short and long sequences; the geometric mean
trades that bias for a threshold that means the same at every length.

A masked token keeps its place in the loss's denominator (its loss is zeroed, not dropped), so
the scale of the loss does not depend on how many tokens were masked.

:func:`mismatch_stats` measures how far the trained-on tokens are from the trainer's own
distribution (ratio percentiles, effective sample size, mean |Δ log p|, a KL estimate); the
backend logs them every step, correction or not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from agentrl.errors import ConfigError
from agentrl.trainer import losses as L

__all__ = ["BehaviourWeights", "behaviour_weights", "decoupled_policy_loss", "mismatch_stats"]

LOG_RATIO_BOUND = 20.0
"""``|log ρ|`` is clamped to this before ``exp`` (ρ within [2e-9, 5e8]): a weight never overflows"""


@dataclass
class BehaviourWeights:
    """The per-token factor ``w`` of the decoupled loss and what the correction did, all ``(B, T)``."""

    weights: torch.Tensor
    """detached, 0 off the mask and on masked tokens"""
    ratio: torch.Tensor
    """ρ before correction (per token, or the sequence's geometric mean on each of its tokens)"""
    truncated: torch.Tensor
    """1 on the sampled tokens whose weight was truncated at the cap (``tis``)"""
    masked: torch.Tensor
    """1 on the sampled tokens removed from the loss (``mis``, ``icepop``)"""


def behaviour_weights(
    prox_logp: torch.Tensor,
    behav_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    correction: str = "none",
    level: str = "token",
    cap: float = 2.0,
    low: float = 0.5,
    high: float = 2.0,
) -> BehaviourWeights:
    """``w = g(ρ)`` with ``ρ = π_prox / μ`` per token or per sequence (see the module docstring)."""
    m = mask.to(prox_logp.dtype)
    with torch.no_grad():
        log_rho = ((prox_logp - behav_logp) * m).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        if level == "sequence":
            seq = log_rho.sum(-1) / m.sum(-1).clamp(min=1.0)
            log_rho = seq[:, None].expand_as(log_rho)
        elif level != "token":
            raise ConfigError(f"unknown correction level {level!r}; use token or sequence")
        rho = torch.exp(log_rho) * m
        zero = torch.zeros_like(m)
        if correction == "none":
            weights, truncated, masked = rho, zero, zero
        elif correction == "tis":
            weights = rho.clamp(max=cap)
            truncated, masked = (rho > cap).to(m.dtype) * m, zero
        elif correction in ("mis", "icepop"):
            if correction == "icepop" and level != "token":
                raise ConfigError("icepop masks single tokens; use level='token' (or mis for sequences)")
            keep = ((rho >= low) & (rho <= high)).to(m.dtype)
            weights, truncated, masked = rho * keep, zero, (1 - keep) * m
        else:
            raise ConfigError(f"unknown rollout correction {correction!r}; use none, tis, mis or icepop")
    return BehaviourWeights(weights, rho, truncated, masked)


def decoupled_policy_loss(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behav_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    correction: str = "none",
    level: str = "token",
    cap: float = 2.0,
    low: float = 0.5,
    high: float = 2.0,
    **policy: Any,
) -> L.LossOut:
    """Decoupled PPO: ``policy_loss`` of ``kind`` against ``prox_logp``, each token's loss times ``g(ρ)``.

    ``policy`` goes to :func:`agentrl.trainer.losses.policy_loss` (``kind``, clip bounds,
    ``agg``, the denominators). With ``prox_logp == behav_logp`` and ``correction`` none every
    weight is exactly 1 and the loss is plain PPO's against the behaviour policy. Extra stats:
    ``is_weight_mean`` (mean ``w``), ``is_truncated_frac``, ``is_masked_frac``.
    """
    bw = behaviour_weights(
        prox_logp, behav_logp, mask, correction=correction, level=level, cap=cap, low=low, high=high
    )
    out = L.policy_loss(logp, prox_logp.detach(), advantages, mask, weights=bw.weights, **policy)
    m = mask.to(logp.dtype)
    n = float(m.sum().clamp(min=1.0))
    out.stats["is_weight_mean"] = float(bw.weights.sum()) / n
    out.stats["is_truncated_frac"] = float(bw.truncated.sum()) / n
    out.stats["is_masked_frac"] = float(bw.masked.sum()) / n
    return out


def _quantile(sorted_x: torch.Tensor, q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default ``linear`` method)."""
    pos = q * (len(sorted_x) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_x) - 1)
    return float(sorted_x[lo] + (sorted_x[hi] - sorted_x[lo]) * (pos - lo))


@torch.no_grad()
def mismatch_stats(
    train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """How far the sampled tokens' rollout logprobs are from the trainer's, over the ``mask`` tokens.

    With ``ρ = π_train / π_rollout`` per sampled token (any shape; ``mask`` selects):

    - ``is_ratio_p1`` / ``is_ratio_p50`` / ``is_ratio_p99``: percentiles of ρ;
    - ``is_ess``: normalised effective sample size of ρ as importance weights,
      ``(Σρ)² / (n Σρ²)`` in ``(0, 1]``, 1 when every ρ is equal (Kong 1992);
    - ``mismatch_abs_logp``: mean ``|log π_train − log π_rollout|``;
    - ``mismatch_kl``: ``KL(π_rollout ‖ π_train)`` by Schulman's k3 estimator on the rollout's
      own samples, mean ``ρ − 1 − log ρ`` (unbiased, ≥ 0).

    All zero (ratio percentiles and ESS one) when no token is selected.
    """
    sel = mask.reshape(-1) > 0
    log_rho = (train_logp.reshape(-1)[sel] - rollout_logp.reshape(-1)[sel]).double()
    if log_rho.numel() == 0:
        one = {"is_ratio_p1": 1.0, "is_ratio_p50": 1.0, "is_ratio_p99": 1.0, "is_ess": 1.0}
        return {**one, "mismatch_abs_logp": 0.0, "mismatch_kl": 0.0}
    log_rho = log_rho.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    rho = torch.exp(log_rho)
    s = torch.sort(rho).values
    n = rho.numel()
    return {
        "is_ratio_p1": _quantile(s, 0.01),
        "is_ratio_p50": _quantile(s, 0.5),
        "is_ratio_p99": _quantile(s, 0.99),
        "is_ess": float(rho.sum() ** 2 / (n * (rho**2).sum())),
        "mismatch_abs_logp": float(log_rho.abs().mean()),
        "mismatch_kl": float((rho - 1 - log_rho).mean()),
    }
