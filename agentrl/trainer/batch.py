"""The training batch: trajectories padded into aligned ``(B, T)`` tensors.

Everything is in *token coordinates*: column ``t`` describes token ``t`` of each
row (its id, whether it was sampled, its rollout logprob, its advantage). The
backend shifts by one internally (logits at ``t - 1`` score token ``t``).
Rows are right-padded; padding has ``attention_mask == 0`` and ``loss_mask == 0``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from agentrl.trainer.errors import BackendError
from agentrl.types import Trajectory

__all__ = [
    "TrainBatch",
    "from_trajectories",
    "token_budget_microbatches",
    "trained_tokens",
    "turn_end_rewards",
]


@dataclass
class TrainBatch:
    input_ids: torch.Tensor
    """(B, T) long"""
    attention_mask: torch.Tensor
    """(B, T) long, 1 on real tokens"""
    loss_mask: torch.Tensor
    """(B, T) float, 1 on sampled tokens that are trained"""
    old_logp: torch.Tensor
    """(B, T) float, behaviour-policy logprob of each sampled token (rollout logprobs)"""
    advantages: torch.Tensor
    """(B, T) float"""
    ref_logp: torch.Tensor | None = None
    """(B, T) reference-model logprobs, only when a KL penalty is on"""
    prox_logp: torch.Tensor | None = None
    """(B, T) logprobs under the weights at the start of the update (decoupled PPO's proximal policy)"""
    old_values: torch.Tensor | None = None
    """(B, T) critic values at rollout time (PPO)"""
    returns: torch.Tensor | None = None
    """(B, T) value targets (PPO)"""
    token_rewards: torch.Tensor | None = None
    """(B, T) per-token rewards, the episode reward on the last sampled token (PPO/GAE; at turn level each turn's on its last)"""
    episode_tokens: torch.Tensor | None = None
    """(B, 1) sampled tokens of the row's episode over all its segments (None: each row is an episode)"""
    row_ids: torch.Tensor | None = None
    """(B, 1) long, each row's index in the step's trajectories: what the backend's ``capture`` keys by"""

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def lengths(self) -> torch.Tensor:
        return self.attention_mask.sum(-1)

    @property
    def episodes(self) -> float:
        """How many episodes the rows make up: a row counts its share of its episode's sampled tokens."""
        if self.episode_tokens is None:
            return float(len(self))
        rows = self.loss_mask[:, 1:].sum(-1)
        return float((rows / self.episode_tokens[:, 0].clamp(min=1.0)).sum())

    def select(self, idx: Sequence[int] | torch.Tensor) -> TrainBatch:
        """Rows ``idx``, trimmed to their longest row."""
        index = torch.as_tensor(idx, dtype=torch.long)
        width = int(self.attention_mask[index].sum(-1).max()) if len(index) else 1
        kw: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            kw[f.name] = None if v is None else v[index, :width]
        return TrainBatch(**kw)

    def to(self, device: torch.device | str) -> TrainBatch:
        kw: dict[str, Any] = {
            f.name: (None if getattr(self, f.name) is None else getattr(self, f.name).to(device))
            for f in fields(self)
        }
        return replace(self, **kw)


def from_trajectories(
    trajs: Sequence[Trajectory],
    advantages: Sequence[float | Sequence[float]] | torch.Tensor,
    *,
    pad_id: int = 0,
    episode_tokens: Sequence[float] | None = None,
) -> TrainBatch:
    """Pad trajectories into a batch; each episode's scalar advantage covers its sampled tokens.

    A row's advantage may instead be a sequence, one value per turn span (turn-level credit):
    each covers the sampled tokens of its span.

    ``episode_tokens``: per row, the trained tokens of its episode over all its segments
    (:func:`trained_tokens` summed), so that ``seq-mean-*`` aggregation counts episodes.
    """
    if not trajs:
        raise BackendError("cannot build a training batch from 0 trajectories")
    if len(advantages) != len(trajs):
        raise BackendError(f"{len(advantages)} advantages for {len(trajs)} trajectories; they must match")
    if episode_tokens is not None and len(episode_tokens) != len(trajs):
        raise BackendError(
            f"{len(episode_tokens)} episode token counts for {len(trajs)} trajectories; give one per row"
        )
    T = max(len(t.token_ids) for t in trajs)
    B = len(trajs)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    att = torch.zeros(B, T, dtype=torch.long)
    lm = torch.zeros(B, T)
    olp = torch.zeros(B, T)
    adv = torch.zeros(B, T)
    rew = torch.zeros(B, T)
    for i, t in enumerate(trajs):
        n = len(t.token_ids)
        ids[i, :n] = torch.tensor(t.token_ids)
        att[i, :n] = 1
        m = torch.tensor(t.loss_mask, dtype=torch.float32)
        m[0] = 0.0  # token 0 has no context to be predicted from
        lm[i, :n] = m
        olp[i, :n] = torch.tensor(t.rollout_logprobs, dtype=torch.float32)
        adv[i, :n] = _row_advantages(advantages[i], t) * m
        sampled = m.nonzero()
        if len(sampled):
            rew[i, int(sampled[-1])] = t.reward
    ep = None if episode_tokens is None else torch.tensor(episode_tokens, dtype=torch.float32)[:, None]
    return TrainBatch(ids, att, lm, olp, adv, token_rewards=rew, episode_tokens=ep)


def _row_advantages(value: Any, t: Trajectory) -> torch.Tensor | float:
    """A row's advantage per token: a scalar as is, or one value per turn span over that span."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 or not isinstance(value, Sequence | torch.Tensor):
        return float(value)
    if len(value) != len(t.turn_spans):
        raise BackendError(
            f"{len(value)} turn advantages for a trajectory with {len(t.turn_spans)} turn spans; give one per span"
        )
    out = torch.zeros(len(t.token_ids))
    for span, v in zip(t.turn_spans, value, strict=True):
        out[span.start : span.end] = float(v)
    return out


def turn_end_rewards(
    trajs: Sequence[Trajectory], rewards: Sequence[Sequence[float]], loss_mask: torch.Tensor
) -> torch.Tensor:
    """``(B, T)``: each turn's reward on the last trained token at or before the end of its span.

    ``loss_mask`` is the batch's (token 0 is never trained). A turn with no trained token of its
    own (an empty reply) hands its reward to the latest trained token before it, or, at the start
    of a row, to the next turn's; GAE then propagates every reward back over the tokens before it.
    """
    out = torch.zeros_like(loss_mask)
    for i, (t, row) in enumerate(zip(trajs, rewards, strict=True)):
        if len(row) != len(t.turn_spans):
            raise BackendError(
                f"{len(row)} turn rewards for a trajectory with {len(t.turn_spans)} turn spans"
            )
        trained = loss_mask[i].nonzero().squeeze(-1).tolist()
        carry, j, last = 0.0, 0, -1
        for span, r in zip(t.turn_spans, row, strict=True):
            while j < len(trained) and trained[j] < span.end:
                last, j = trained[j], j + 1
            if last < 0:
                carry += float(r)
            else:
                out[i, last] += float(r) + carry
                carry = 0.0
    return out


def trained_tokens(t: Trajectory) -> int:
    """The tokens of ``t`` a batch trains: its sampled ones but token 0 (it has no context)."""
    return sum(t.loss_mask[1:])


def token_budget_microbatches(
    lengths: Sequence[int], budget: int, keys: Sequence[Hashable] | None = None, packed: bool = False
) -> list[list[int]]:
    """Split rows into micro-batches whose padded size ``rows * longest`` stays within ``budget``
    (``packed``: whose real tokens ``sum(lengths)`` do, :mod:`agentrl.trainer.packing`).

    Rows are taken longest first so that rows of similar length share a micro-batch
    (little padding). A row longer than the budget gets a micro-batch of its own.
    With ``keys`` (rows with equal keys share a prompt), the rows of one key are taken
    together (keys by their longest row, then the key's rows longest first), so a group
    is split only where a micro-batch fills up and its shared prompt is forwarded once.
    """
    if keys is None:
        order = sorted(range(len(lengths)), key=lambda i: -int(lengths[i]))
    else:
        longest: dict[Hashable, int] = {}
        first: dict[Hashable, int] = {}
        for i, k in enumerate(keys):
            longest[k] = max(longest.get(k, 0), int(lengths[i]))
            first.setdefault(k, i)
        order = sorted(
            range(len(lengths)), key=lambda i: (-longest[keys[i]], first[keys[i]], -int(lengths[i]))
        )
    out: list[list[int]] = []
    cur: list[int] = []
    widest = total = 0
    for i in order:
        n = int(lengths[i])
        if cur and (total + n if packed else max(widest, n) * (len(cur) + 1)) > budget:
            out.append(cur)
            cur, widest, total = [], 0, 0
        cur.append(i)
        widest, total = max(widest, n), total + n
    if cur:
        out.append(cur)
    return out
