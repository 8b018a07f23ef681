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
  (no std division; pair it with ``loss_agg="seq-mean-token-sum-norm"``, token sums over a
  constant, to also drop length normalisation).
- RLOO (Ahmadian et al. 2024): ``r - mean of the other G-1 rewards`` = ``G/(G-1) (r - mean_g)``.
- REINFORCE++ (Hu 2025): the reward (minus the group mean for the ``baseline``
  variant) normalised by the mean and std of the whole batch.
- GAE (Schulman et al. 2016, eq. 16): ``A_t = sum_l (gamma lam)^l delta_{t+l}``.

Turn level (``--advantage-level turn``): :func:`turn_returns` gives each assistant turn its
discounted return-to-go ``G_t = sum_{k>=t} gamma^(k-t) r_k`` over the env's per-turn rewards
(REINFORCE with reward-to-go, Williams 1992), and :func:`turn_group_advantages` baselines it by
turn index: against the same turn of the group's other episodes, an estimate of the value of
being at turn ``t`` (rLLM's ``per_step`` mode, on returns and for episodes of any length).
"""

from __future__ import annotations

import torch

from agentrl.errors import ConfigError
from agentrl.trainer.errors import LossInputError

__all__ = [
    "dr_grpo",
    "gae",
    "group_advantages",
    "grpo",
    "reinforce_pp",
    "rloo",
    "turn_group_advantages",
    "turn_returns",
]

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


def turn_returns(rewards: torch.Tensor, episode: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Each turn's discounted return-to-go ``G_t = r_t + gamma G_{t+1}`` within its episode.

    ``rewards`` ``(M,)``: the per-turn rewards of all episodes laid end to end, each episode's in
    turn order; ``episode`` ``(M,)``: the episode of each turn (equal ids are contiguous).
    """
    r = rewards.to(torch.float64)
    out = torch.zeros_like(r)
    ep = episode.tolist()
    running = 0.0
    for k in reversed(range(len(ep))):
        if k == len(ep) - 1 or ep[k + 1] != ep[k]:
            running = 0.0  # the episode's last turn: nothing follows it
        running = float(r[k]) + gamma * running
        out[k] = running
    return out.to(rewards.dtype)


def turn_group_advantages(
    kind: str, returns: torch.Tensor, episode: torch.Tensor, group_ids: torch.Tensor, eps: float = EPS
) -> torch.Tensor:
    """One advantage per turn: its return ``G_t`` against the same turn of the group's other episodes.

    ``returns`` ``(M,)`` from :func:`turn_returns`; ``episode`` ``(M,)`` ids ``0..N-1`` in order;
    ``group_ids`` ``(N,)``, one per episode. Turn ``t``'s entries of a group (one per episode that
    lasted ``t + 1`` turns) form a group of the episode-level estimator: grpo, dr_grpo and rloo
    baseline ``G_t`` by their mean (rloo: of the others), grpo scales by their std; reinforce_pp
    subtracts that mean and normalises over all the batch's turns. A turn that no other episode
    of its group reached has no baseline and gets 0. Each episode enters each turn's statistics
    once. With ``gamma = 1`` and the only reward after the last turn, episodes of equal length get
    their episode-level advantage on every turn.
    """
    n_turns = torch.bincount(episode, minlength=len(group_ids))
    first = n_turns.cumsum(0) - n_turns
    index = torch.arange(len(episode)) - first[episode]  # each turn's index within its episode
    _, gid = torch.unique(group_ids, return_inverse=True)
    key = gid[episode] * (int(n_turns.max()) + 1) + index
    _, _, n = _group_stats(returns, key)
    alone = n < 2
    if kind == "rloo":
        mean = _group_stats(returns, key)[0]
        out = (n / (n - 1).clamp(min=1) * (returns.double() - mean)).to(returns.dtype)
    else:
        out = group_advantages(kind, returns, key)
    return torch.where(alone, torch.zeros_like(out), out)


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
