"""The update of one RL step: episode rewards → advantages → this rank's batch → ``backend.train_step``.

::

    trajs, adv, info = advantages(cfg, groups, backend)    # group estimators, or raw rewards for GAE
    stats = train_step(cfg, rt, backend, groups)            # one update; its train/* metrics

Rewards get DAPO's overlong penalty when set, and constant groups are dropped under
dynamic sampling. Group estimators (GRPO, Dr.GRPO, RLOO, REINFORCE++) give one scalar per
trajectory; PPO puts the (shaped) reward on the last sampled token and runs GAE over the
value head. Every rank computes the same advantages over the whole step, then trains its rows.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.trainer import advantages as A
from agentrl.trainer import losses as L
from agentrl.trainer.backend import FSDP2Backend
from agentrl.trainer.batch import from_trajectories
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.runtime import Runtime

__all__ = ["advantages", "train_step"]


def advantages(
    cfg: TrainConfig, groups: list[list[Any]], be: FSDP2Backend
) -> tuple[list[Any], torch.Tensor, dict[str, float]]:
    """Flatten groups into trajectories with one scalar advantage each (group estimators)."""
    a, r = cfg.algo, cfg.rollout
    trajs, rewards, gids, lengths = [], [], [], []
    for gi, group in enumerate(groups):
        for ep in group:
            for t in ep.trajectories:
                trajs.append(t)
                rewards.append(ep.reward)
                gids.append(gi)
                lengths.append(max((s.end - s.start for s in t.turn_spans), default=t.num_sampled))
    rew = torch.tensor(rewards, dtype=torch.float32)
    gid = torch.tensor(gids)
    info: dict[str, float] = {}
    if a.overlong_buffer:
        pen = L.overlong_penalty(
            torch.tensor(lengths), r.max_new_tokens, a.overlong_buffer, a.overlong_penalty
        )
        rew = rew + pen
        info["algo/overlong_penalty"] = float(pen.mean())
    if a.dynamic_sampling:
        keep = L.dynamic_sampling_keep(rew, gid)
        info["algo/dynamic_sampling_kept"] = float(keep.float().mean())
        if not bool(keep.any()):
            return [], torch.zeros(0), info
        idx = keep.nonzero().squeeze(-1).tolist()
        trajs = [trajs[i] for i in idx]
        rew, gid = rew[keep], gid[keep]
    if a.advantage_kind == "gae":
        return trajs, rew, info
    adv = A.group_advantages(a.advantage_kind, rew, gid)
    info["algo/zero_adv_frac"] = float((adv.abs() < 1e-8).float().mean())
    return trajs, adv, info


def train_step(cfg: TrainConfig, rt: Runtime, be: FSDP2Backend, groups: list[list[Any]]) -> dict[str, float]:
    """Advantages over the whole step's batch (the same on every rank), then this rank's rows."""
    trajs, adv, info = advantages(cfg, groups, be)
    a, ranks = cfg.algo, rt.ranks
    if len(trajs) < ranks.world * a.num_minibatches:
        # every rank sees the same trajs, so all of them skip together
        return {**info, "train/skipped": 1.0, "train/samples": float(len(trajs))}
    mine = ranks.shard(range(len(trajs)))
    if a.advantage_kind == "gae":
        batch = from_trajectories(trajs, [0.0] * len(trajs), pad_id=rt.pad_id)
        # the (shaped) episode reward sits on the last sampled token
        last = (batch.loss_mask.cumsum(-1) == batch.loss_mask.sum(-1, keepdim=True)) & (batch.loss_mask > 0)
        batch.token_rewards = last.float() * adv[:, None]
        batch.old_values = be.values(batch)
        gae_adv, returns = A.gae(batch.token_rewards, batch.old_values, batch.loss_mask, a.gamma, a.lam)
        m = batch.loss_mask
        mean = (gae_adv * m).sum() / m.sum()
        std = (((gae_adv - mean) ** 2 * m).sum() / m.sum()).sqrt()
        batch.advantages = (gae_adv - mean) / (std + 1e-6) * m
        batch.returns = returns
        if ranks.world > 1:
            batch = batch.select(mine)
    else:
        batch = from_trajectories([trajs[i] for i in mine], [float(adv[i]) for i in mine], pad_id=rt.pad_id)
    if a.kl_coef > 0:
        batch.ref_logp = be.ref_logprobs(batch)
    if a.decoupled:  # decoupled PPO's proximal policy: the weights before this step's first update
        batch.prox_logp = be.logprobs(batch)
    stats = be.train_step(batch)
    versions = [v for t in trajs for v, m in zip(t.policy_versions, t.loss_mask, strict=True) if m]
    out = {f"train/{k}": v for k, v in stats.items()}
    out.update(info)
    out["train/samples"] = float(len(trajs))
    out["train/tokens"] = ranks.all_sum([float(batch.loss_mask.sum())])[0]
    if (
        versions
    ):  # policy versions behind the weights being updated (= the engine's, synced after every update)
        now = rt.engine.weight_version
        out["train/staleness_max"] = float(now - min(versions))
        out["train/staleness_mean"] = float(now - sum(versions) / len(versions))
    return out
