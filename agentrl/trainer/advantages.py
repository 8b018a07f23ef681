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

Turn level (``--advantage-level turn``): :func:`turn_returns` gives each assistant turn its
discounted return-to-go ``G_t = sum_{k>=t} gamma^(k-t) r_k`` over the env's per-turn rewards, and
:func:`turn_group_advantages` baselines it against the group's statistics of the *episode*
returns ``G_0`` (one entry per episode, as above): REINFORCE with reward-to-go (Williams 1992;
Sutton & Barto 2018, sec. 13.3-13.4) and the group baseline of the estimator. A per-group
constant is a valid baseline for every turn, it is defined whatever the episodes' lengths, and
with ``gamma = 1`` turn 0's advantage is the episode-level one (and every turn's, when the only
reward is the last turn's).
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


def _group_sum(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Per entry, the sum of ``values`` over its group."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    sums = torch.zeros(int(inv.max()) + 1 if len(inv) else 0, dtype=values.dtype).index_add_(0, inv, values)
    return sums[inv]


def turn_group_advantages(
    kind: str, returns: torch.Tensor, episode: torch.Tensor, group_ids: torch.Tensor, eps: float = EPS
) -> torch.Tensor:
    """One advantage per turn: its return ``G_t`` against its group's baseline over episode returns.

    ``returns`` ``(M,)`` from :func:`turn_returns`; ``episode`` ``(M,)`` ids ``0..N-1`` in order,
    every episode at least one turn; ``group_ids`` ``(N,)``, one per episode. With ``b`` the group's
    mean of the episode returns ``G_0`` and ``x = G_t - b``:

    - dr_grpo: ``x``; rloo: ``G_t`` minus the mean of the *other* episodes' ``G_0``;
    - grpo: ``x / (s + eps)``, ``s^2 = sum_episodes mean_turns(x^2) / (n - 1)``: the spread of the
      turn returns about the baseline, each episode weighted once (its turns share a weight of 1);
    - reinforce_pp: ``x`` normalised by its mean and std over the batch, each episode weighted once.

    When every turn's return is its episode's (``gamma = 1``, reward on the last turn only), each
    is exactly its episode-level counterpart. The scales use the turn returns, not the spread of
    ``G_0`` alone: a group whose episodes end equal but collect rewards at different turns has
    ``std(G_0) = 0`` and nonzero ``x``, which the episode scale would blow up by ``1 / eps``.
    """
    g = returns.double()
    n_turns = torch.bincount(episode, minlength=len(group_ids))
    if bool((n_turns == 0).any()):
        raise LossInputError(f"every episode needs at least one turn; turns per episode: {n_turns.tolist()}")
    first = n_turns.cumsum(0) - n_turns
    mean, _, n = _group_stats(g[first], group_ids)  # per episode
    x = g - mean[episode]
    w = (1.0 / n_turns.double())[episode]  # each episode's turns weigh 1 together
    if kind == "dr_grpo":
        out = x
    elif kind == "rloo":
        if bool((n < 2).any()):
            raise LossInputError(
                f"RLOO needs at least 2 episodes in every group, got a group of {int(n.min())}; "
                "raise group_size or use grpo"
            )
        out = g - ((n * mean - g[first]) / (n - 1))[episode]
    elif kind == "grpo":
        per_ep = torch.zeros(len(group_ids), dtype=torch.float64).index_add_(0, episode, w * x**2)
        std = torch.sqrt(_group_sum(per_ep, group_ids) / (n - 1).clamp(min=1))
        out = x / (std[episode] + eps)
    elif kind == "reinforce_pp":
        num = float(len(group_ids))
        mu = (w * x).sum() / num
        std = torch.sqrt((w * (x - mu) ** 2).sum() / max(num - 1, 1.0))
        out = (x - mu) / (std + eps)
    else:
        raise ConfigError(
            f"unknown group advantage estimator {kind!r}; use grpo, dr_grpo, rloo or reinforce_pp"
        )
    return out.to(returns.dtype)


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
