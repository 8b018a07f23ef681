"""Advantage estimators: how a scalar reward becomes a per-token learning signal.

Pure tensor functions. Group-based estimators take ``rewards`` of shape
``(N,)`` and integer ``group_ids`` of shape ``(N,)`` (episodes of one task share
an id) and return one advantage per episode, broadcast later to the episode's
trajectories and over their sampled tokens. An entry is an *episode*, never a
trajectory: an episode cut into k ledger segments counted k times would enter
its own baseline k times, and since k depends on its actions the baseline would
no longer be independent of them (:func:`agentrl.trainer.algorithm.advantages`
gives one entry per episode). :func:`gae` works per token with a critic.

- GRPO (Shao et al. 2024, DeepSeekMath, eq. 3): ``(r - mean_g) / (std_g + eps)``.
- Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-like training"): ``r - mean_g``
  (no std division; pair it with ``loss_agg="seq-mean-token-sum"`` to also drop length normalisation).
- RLOO (Ahmadian et al. 2024): ``r - mean of the other G-1 rewards`` = ``G/(G-1) (r - mean_g)``.
- REINFORCE++ (Hu 2025): the reward (minus the group mean for the ``baseline``
  variant) normalised by the mean and std of the whole batch.
- GAE (Schulman et al. 2016, eq. 16): ``A_t = sum_l (gamma lam)^l delta_{t+l}``.
"""

from __future__ import annotations

import torch

from agentrl.errors import ConfigError
from agentrl.trainer.errors import LossInputError

__all__ = ["dr_grpo", "gae", "group_advantages", "grpo", "reinforce_pp", "rloo"]

EPS = 1e-6


def _group_stats(
    rewards: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per entry (one per episode): its group's mean, unbiased std and size."""
    _, inv, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    r = rewards.to(torch.float64)
    sums = torch.zeros(len(counts), dtype=torch.float64).index_add_(0, inv, r)
    mean = sums / counts
    sq = torch.zeros(len(counts), dtype=torch.float64).index_add_(0, inv, (r - mean[inv]) ** 2)
    std = torch.sqrt(sq / (counts - 1).clamp(min=1))
    return mean[inv], std[inv], counts[inv].to(torch.float64)


def grpo(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    mean, std, _ = _group_stats(rewards, group_ids)
    return ((rewards.double() - mean) / (std + eps)).to(rewards.dtype)


def dr_grpo(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    mean, _, _ = _group_stats(rewards, group_ids)
    return (rewards.double() - mean).to(rewards.dtype)


def rloo(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    mean, _, n = _group_stats(rewards, group_ids)
    if bool((n < 2).any()):
        raise LossInputError(
            f"RLOO needs at least 2 episodes in every group, got a group of {int(n.min())}; "
            "raise group_size or use grpo"
        )
    return (n / (n - 1) * (rewards.double() - mean)).to(rewards.dtype)


def reinforce_pp(
    rewards: torch.Tensor, group_ids: torch.Tensor | None = None, *, baseline: bool = True, eps: float = EPS
) -> torch.Tensor:
    """REINFORCE++: batch-normalised returns; with ``baseline`` the group mean is subtracted first."""
    r = rewards.double()
    if baseline and group_ids is not None:
        r = r - _group_stats(rewards, group_ids)[0]
    std = r.std(unbiased=True) if r.numel() > 1 else torch.zeros((), dtype=r.dtype)
    return ((r - r.mean()) / (std + eps)).to(rewards.dtype)


def group_advantages(kind: str, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Dispatch by name: grpo | dr_grpo | rloo | reinforce_pp."""
    if kind == "grpo":
        return grpo(rewards, group_ids)
    if kind == "dr_grpo":
        return dr_grpo(rewards, group_ids)
    if kind == "rloo":
        return rloo(rewards, group_ids)
    if kind == "reinforce_pp":
        return reinforce_pp(rewards, group_ids)
    raise ConfigError(f"unknown group advantage estimator {kind!r}; use grpo, dr_grpo, rloo or reinforce_pp")


def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the sampled tokens of each row.

    Shapes ``(B, T)``. Tokens with ``mask == 0`` (prompt, tool output, padding) are
    skipped: the recursion jumps from one sampled token to the next, and the value
    after the last sampled token is 0 (terminal). Returns ``(advantages, returns)``,
    zero where ``mask == 0``.
    """
    B, T = token_rewards.shape
    adv = torch.zeros_like(values)
    next_value = torch.zeros(B, dtype=values.dtype, device=values.device)
    next_adv = torch.zeros(B, dtype=values.dtype, device=values.device)
    m = mask.to(values.dtype)
    for t in reversed(range(T)):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * next_adv
        adv[:, t] = a * m[:, t]
        next_value = torch.where(m[:, t] > 0, values[:, t], next_value)
        next_adv = torch.where(m[:, t] > 0, a, next_adv)
    returns = (adv + values) * m
    return adv, returns
