"""The RL objective, top to bottom: rewards → shaping and filtering → advantages → per-token terms → aggregation.

::

    stats = train_step(cfg, rt, backend, groups)   # the update of one RL step; its train/* metrics
    be = FSDP2Backend(model, algo, optim, objective=RLObjective(algo))   # the loss, handed to the backend

1. **Rewards**: one scalar per *episode* (:func:`advantages`), however many trajectories (ledger
   segments) it was cut into: every statistic below counts an episode once.
2. **Shaping and filtering**: DAPO's soft overlong penalty (on the episode's longest turn), then
   dynamic sampling drops the groups whose *raw* rewards are all equal (no signal; a group that
   differs only by its overlong penalty would get full-size advantages from length noise).
3. **Advantages**: a group estimator (GRPO, Dr.GRPO, RLOO, REINFORCE++; :mod:`agentrl.trainer.advantages`)
   gives one scalar per episode, broadcast to all its trajectories and over their sampled tokens; PPO instead puts the shaped
   reward on the last sampled token and runs GAE over the value head (:func:`train_step`). Every rank
   computes the same advantages over the whole step, then trains its own rows. With
   ``advantage_level="turn"`` (:func:`turn_values`) each assistant turn gets its own: its discounted
   return-to-go against the same turn of the group's other episodes, over that turn's tokens; PPO
   puts each turn's reward on the turn's last sampled token.
4. **Per-token terms** (:class:`RLObjective`): the clipped policy surrogate (decoupled PPO's against the
   proximal policy, with its behaviour weight), the entropy bonus, the KL penalty to the reference
   model, PPO's clipped value loss.
5. **Aggregation**: each term is reduced by ``algo.loss_agg`` with the *global* token and sequence
   counts of the mini-batch (a ``seq-mean-*`` sequence is an episode, over all its segments), so a
   micro-batch's loss is its share of the mini-batch loss and summing the micro-batch gradients over
   micro-batches and ranks gives the full-batch gradient (:mod:`agentrl.trainer.backend`). The warm
   start's loss is the NLL of the trained tokens.

The kernels are pure functions: :mod:`agentrl.trainer.losses` (surrogates, KL, value loss,
aggregation, DAPO's shaping) and :mod:`agentrl.trainer.offpolicy` (decoupled PPO's correction).
:mod:`agentrl.trainer.loop` and this module are the whole training algorithm.

Micro-batch losses take the scores of :mod:`agentrl.trainer.forward` (``(B, T - 1)`` columns: column
``t - 1`` scores token ``t``) and return ``(loss, stats)``. A stat whose key ends in ``_tok`` is a
token-weighted *sum* over the micro-batch (the backend divides its all-rank total by the
mini-batch's token count and drops the suffix); any other stat is this micro-batch's share of a
mini-batch total, summed as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from agentrl.trainer import advantages as A
from agentrl.trainer import losses as L
from agentrl.trainer import offpolicy as O
from agentrl.trainer.backend import FSDP2Backend
from agentrl.trainer.batch import TrainBatch, from_trajectories, trained_tokens, turn_end_rewards
from agentrl.trainer.config import AlgoConfig, OptimConfig, TrainConfig
from agentrl.trainer.errors import BackendError
from agentrl.trainer.runtime import Runtime

__all__ = ["RLObjective", "advantages", "make_backend", "train_step", "turn_values"]


# ---------------------------------------------------------------- 1-3: rewards, shaping, advantages


def advantages(
    cfg: TrainConfig, groups: list[list[Any]]
) -> tuple[list[Any], torch.Tensor | list[list[float]], dict[str, float]]:
    """The step's trajectories and one scalar each: its episode's group advantage, or (GAE) its shaped reward;
    at turn level one value per turn span of each (:func:`turn_values`).

    Every statistic is over *episodes*, one reward each, never over rows: an episode whose session
    was cut into k ledger segments is k trajectories, and counting it k times would make the
    baseline depend on the episode's own actions (k does). The overlong penalty, dynamic sampling
    and the group estimator all see one entry per episode; each episode's value is then broadcast
    to every one of its trajectories.
    """
    a, r = cfg.algo, cfg.rollout
    episodes = [ep for group in groups for ep in group]
    rew = torch.tensor([ep.reward for ep in episodes], dtype=torch.float32)
    gid = torch.tensor([gi for gi, group in enumerate(groups) for _ in group], dtype=torch.long)
    raw = rew
    info: dict[str, float] = {}
    if a.overlong_buffer:
        # the episode's longest turn: max_new_tokens caps each turn, so that is the one that runs into it
        lengths = torch.tensor([_longest_turn(ep) for ep in episodes])
        pen = L.overlong_penalty(lengths, r.max_new_tokens, a.overlong_buffer, a.overlong_penalty)
        rew = rew + pen
        info["algo/overlong_penalty"] = float(pen.mean())
    if a.dynamic_sampling:  # on the raw reward: a group differing only by its overlong penalty has no signal
        keep = L.dynamic_sampling_keep(raw, gid)
        info["algo/dynamic_sampling_kept"] = float(keep.float().mean())
        if not bool(keep.any()):
            return [], torch.zeros(0), info
        episodes = [episodes[i] for i in keep.nonzero().squeeze(-1).tolist()]
        rew, gid = rew[keep], gid[keep]
    trajs = [t for ep in episodes for t in ep.trajectories]
    segments = torch.tensor([len(ep.trajectories) for ep in episodes], dtype=torch.long)
    if a.advantage_level == "turn":
        per_turn, zero_frac = turn_values(cfg, episodes, gid)
        if a.advantage_kind != "gae":
            info["algo/zero_adv_frac"] = zero_frac
        return trajs, per_turn, info
    if a.advantage_kind == "gae":
        return trajs, rew.repeat_interleave(segments), info
    adv = A.group_advantages(a.advantage_kind, rew, gid).repeat_interleave(segments)
    info["algo/zero_adv_frac"] = float((adv.abs() < 1e-8).float().mean())
    return trajs, adv, info


def turn_values(cfg: TrainConfig, episodes: list[Any], gid: torch.Tensor) -> tuple[list[list[float]], float]:
    """Turn-level credit: per trajectory, one value per turn span; and the share of turns at 0.

    An episode's turns are its trajectories' spans in order, one per assistant turn, each with the
    env's reward after it (:func:`_turn_rewards`); DAPO's overlong penalty goes on the longest turn.
    A group estimator's value is the turn's advantage (:func:`~agentrl.trainer.advantages.turn_group_advantages`
    over :func:`~agentrl.trainer.advantages.turn_returns` with ``turn_gamma``). GAE's is the turn's
    reward, placed on its last sampled token by :func:`_gae_batch`; a segment's last turn also carries
    the rewards of the episode's later segments, so every segment's critic sees what is still to
    come, as at episode level, where each segment carries the whole reward.
    """
    a, r = cfg.algo, cfg.rollout
    rewards = [_turn_rewards(ep) for ep in episodes]
    if a.overlong_buffer:
        for ep, rw in zip(episodes, rewards, strict=True):
            lengths = [s.end - s.start for t in ep.trajectories for s in t.turn_spans]
            longest = max(range(len(lengths)), key=lengths.__getitem__)
            pen = L.overlong_penalty(
                torch.tensor([lengths[longest]]), r.max_new_tokens, a.overlong_buffer, a.overlong_penalty
            )
            rw[longest] += float(pen[0])
    if a.advantage_kind == "gae":
        values = rewards
    else:
        flat = torch.tensor([x for rw in rewards for x in rw], dtype=torch.float32)
        episode = torch.tensor([i for i, rw in enumerate(rewards) for _ in rw], dtype=torch.long)
        returns = A.turn_returns(flat, episode, a.turn_gamma)
        adv = A.turn_group_advantages(a.advantage_kind, returns, episode, gid).tolist()
        values, k = [], 0
        for rw in rewards:
            values.append(adv[k : k + len(rw)])
            k += len(rw)
    out: list[list[float]] = []
    for ep, vals in zip(episodes, values, strict=True):
        k = 0
        for t in ep.trajectories:
            n = len(t.turn_spans)
            row = list(vals[k : k + n])
            k += n
            if a.advantage_kind == "gae" and row:
                row[-1] += sum(vals[k:])  # the rewards of the later segments
            out.append(row)
    n_turns = sum(len(v) for v in values)
    zero = sum(abs(x) < 1e-8 for v in values for x in v) / max(n_turns, 1)
    return out, float(zero)


def _turn_rewards(ep: Any) -> list[float]:
    """The env's reward after each of the episode's turns (its spans over all segments, in order)."""
    spans = sum(len(t.turn_spans) for t in ep.trajectories)
    eid = ep.trajectories[0].episode_id if ep.trajectories else "?"
    if spans == 0:
        raise BackendError(
            f"episode {eid!r} has no turn spans; --advantage-level turn needs the trajectories' turn_spans "
            "(the session ledger records them), or use --advantage-level episode"
        )
    if not ep.turn_rewards:  # only the outcome is known (an agent program's episode)
        return [0.0] * (spans - 1) + [float(ep.reward)]
    if len(ep.turn_rewards) != spans or abs(sum(ep.turn_rewards) - ep.reward) > 1e-6 * max(
        1.0, abs(ep.reward)
    ):
        raise BackendError(
            f"episode {eid!r} has {len(ep.turn_rewards)} per-turn rewards summing to {sum(ep.turn_rewards)} "
            f"but {spans} turn spans and reward {ep.reward}; each assistant turn needs the env's reward after it"
        )
    return [float(x) for x in ep.turn_rewards]


def _longest_turn(ep: Any) -> int:
    """The most tokens the episode sampled in one turn, over all its segments."""
    return max(
        (max((s.end - s.start for s in t.turn_spans), default=t.num_sampled) for t in ep.trajectories),
        default=0,
    )


def _episode_tokens(groups: list[list[Any]], trajs: list[Any]) -> list[int]:
    """Per trajectory, the trained tokens of its episode over all its segments (``seq-mean-*``'s unit)."""
    per_ep = {
        id(t): sum(trained_tokens(s) for s in ep.trajectories)
        for g in groups
        for ep in g
        for t in ep.trajectories
    }
    return [per_ep[id(t)] for t in trajs]


def _gae_batch(
    cfg: TrainConfig,
    rt: Runtime,
    be: FSDP2Backend,
    trajs: list[Any],
    rewards: torch.Tensor | list[list[float]],
    ep_tok: list[int],
) -> TrainBatch:
    """PPO: the (shaped) episode reward on the last sampled token, GAE over the critic, normalised
    advantages over the whole step's sampled tokens. At turn level (``rewards`` per turn span) each
    turn's reward goes on its own last sampled token instead."""
    a = cfg.algo
    batch = from_trajectories(trajs, [0.0] * len(trajs), pad_id=rt.pad_id, episode_tokens=ep_tok)
    if isinstance(rewards, list):
        batch.token_rewards = turn_end_rewards(trajs, rewards, batch.loss_mask)
    else:
        last = (batch.loss_mask.cumsum(-1) == batch.loss_mask.sum(-1, keepdim=True)) & (batch.loss_mask > 0)
        batch.token_rewards = last.float() * rewards[:, None]
    batch.old_values = be.values(batch)
    gae_adv, returns = A.gae(batch.token_rewards, batch.old_values, batch.loss_mask, a.gamma, a.lam)
    m = batch.loss_mask
    mean = (gae_adv * m).sum() / m.sum()
    std = (((gae_adv - mean) ** 2 * m).sum() / m.sum()).sqrt()
    batch.advantages = (gae_adv - mean) / (std + 1e-6) * m
    batch.returns = returns
    return batch


@dataclass
class TokenRecord:
    """What the update did with one trajectory, for the rollout store: its per-token advantages
    (0 off the trained tokens) and, at its sampled positions, the logprob and entropy of the
    trainer's first forward over it in this update."""

    advantages: list[float]
    positions: list[int]
    logprobs: list[float]
    entropy: list[float]


def train_step(
    cfg: TrainConfig,
    rt: Runtime,
    be: FSDP2Backend,
    groups: list[list[Any]],
    record: dict[tuple[str, int], TokenRecord] | None = None,
) -> dict[str, float]:
    """Advantages over the whole step's batch (the same on every rank), then this rank's rows.

    ``record`` (rank 0's matters) receives a :class:`TokenRecord` per trained trajectory, keyed by
    ``(episode_id, segment)``: a collective under ``torchrun`` (every rank passes one or none)."""
    trajs, adv, info = advantages(cfg, groups)
    a, ranks = cfg.algo, rt.ranks
    ep_tok = _episode_tokens(groups, trajs)
    if len(trajs) < ranks.world * a.num_minibatches:
        # every rank sees the same trajs, so all of them skip together
        return {**info, "train/skipped": 1.0, "train/samples": float(len(trajs))}
    mine = ranks.shard(range(len(trajs)))
    if a.advantage_kind == "gae":
        batch = _gae_batch(cfg, rt, be, trajs, adv, ep_tok)
        batch.row_ids = torch.arange(len(trajs))[:, None]
        if ranks.world > 1:
            batch = batch.select(mine)
    else:
        batch = from_trajectories(
            [trajs[i] for i in mine],
            [adv[i] if isinstance(adv, list) else float(adv[i]) for i in mine],
            pad_id=rt.pad_id,
            episode_tokens=[ep_tok[i] for i in mine],
        )
        batch.row_ids = torch.tensor(list(mine), dtype=torch.long)[:, None]
    if a.kl_coef > 0:
        batch.ref_logp = be.ref_logprobs(batch)
    if a.decoupled:  # decoupled PPO's proximal policy: the weights before this step's first update
        batch.prox_logp = be.logprobs(batch)
    be.capture = {} if record is not None else None
    try:
        stats = be.train_step(batch)
        if record is not None:
            _record(record, trajs, batch, be.capture or {}, ranks)
    finally:
        be.capture = None
    versions = [v for t in trajs for v, m in zip(t.policy_versions, t.loss_mask, strict=True) if m]
    out = {f"train/{k}": v for k, v in stats.items()}
    out.update(info)
    out["train/samples"] = float(len(trajs))
    out["train/tokens"] = ranks.all_sum([float(batch.loss_mask.sum())])[0]
    if versions:  # policy versions behind the weights being updated (the engine's, synced after every update)
        now = rt.engine.weight_version
        out["train/staleness_max"] = float(now - min(versions))
        out["train/staleness_mean"] = float(now - sum(versions) / len(versions))
        # trained past the bound (--max-staleness K; 0 is the synchronous loop): must read 0
        out["train/tokens_past_bound"] = float(sum(now - v > cfg.rollout.max_staleness for v in versions))
    return out


def _record(
    record: dict[tuple[str, int], TokenRecord],
    trajs: list[Any],
    batch: TrainBatch,
    seen: dict[int, tuple[list[int], list[float], list[float]]],
    ranks: Any,
) -> None:
    """Every rank's :class:`TokenRecord` of its rows, gathered into ``record``."""
    mine: dict[tuple[str, int], TokenRecord] = {}
    assert batch.row_ids is not None
    for b, i in enumerate(batch.row_ids[:, 0].tolist()):
        t = trajs[i]
        pos, lp, ent = seen.get(i, ([], [], []))
        mine[(t.episode_id, t.segment)] = TokenRecord(
            batch.advantages[b, : len(t.token_ids)].tolist(), pos, lp, ent
        )
    for part in ranks.gather(mine) if ranks.world > 1 else [mine]:
        record.update(part)


# ---------------------------------------------------------------- 4-5: per-token terms, aggregation


@dataclass(frozen=True)
class RLObjective:
    """The micro-batch losses of ``algo``, handed to the backend (its ``Objective``)."""

    algo: AlgoConfig
    norm_tokens: int | None = None
    """``seq-mean-token-sum-norm``'s constant tokens per episode: the run's ``max_new_tokens``"""

    def rl_loss(
        self,
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
        a = self.algo
        mask = mb.loss_mask[:, 1:]
        ep_tok = None if mb.episode_tokens is None else mb.episode_tokens[:, 0]
        agg: dict[str, Any] = {"num_tokens": num_tokens, "num_seqs": num_seqs, "seq_tokens": ep_tok,
                               "norm_tokens": self.norm_tokens}  # fmt: skip
        loss, stats = self._policy_term(mb, logp, mask, agg)
        if a.entropy_coef > 0:
            ent = L.aggregate(ent_tok, mask, a.loss_agg, **agg)
            loss = loss - a.entropy_coef * ent
            stats["entropy"] = float(ent.detach())
        else:
            stats["entropy_tok"] = float((ent_tok * mask).sum())
        if a.kl_coef > 0:
            if mb.ref_logp is None:
                raise BackendError(
                    "kl_coef > 0 but the batch has no ref_logp; compute them with ref_logprobs()"
                )
            kl = L.aggregate(L.kl_penalty(logp, mb.ref_logp[:, 1:], a.kl_estimator), mask, a.loss_agg, **agg)
            loss = loss + a.kl_coef * kl
            stats["kl"] = float(kl.detach())
        if values is not None:
            if mb.returns is None or mb.old_values is None:
                raise BackendError("PPO batch needs returns and old_values")
            vf = L.value_loss(
                values,
                mb.old_values[:, 1:],
                mb.returns[:, 1:],
                mask,
                clip=a.value_clip,
                agg=a.loss_agg,
                **agg,
            ).loss
            loss = loss + a.vf_coef * vf
            stats["vf_loss"] = float(vf.detach())
        stats["loss"] = float(loss.detach())
        return loss, stats

    def _policy_term(
        self, mb: TrainBatch, logp: torch.Tensor, mask: torch.Tensor, agg: dict[str, Any]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped policy-gradient loss and its stats (``_tok`` sums, plus ``pg_loss``).

        Decoupled (``algo.decoupled``), the clip is against ``mb.prox_logp`` and each token's loss is
        weighted by the corrected ``pi_prox / pi_behaviour`` (:mod:`agentrl.trainer.offpolicy`).
        """
        a = self.algo
        old = mb.old_logp[:, 1:]
        kw: dict[str, Any] = {"kind": a.policy_loss, "clip_low": a.clip[0], "clip_high": a.clip[1],
                              "dual_clip": a.dual_clip, "agg": a.loss_agg, **agg}  # fmt: skip
        if a.decoupled:
            if mb.prox_logp is None:
                raise BackendError(
                    "decoupled PPO but the batch has no prox_logp; compute them with logprobs()"
                )
            low, high = a.is_bounds
            pg = O.decoupled_policy_loss(
                logp, mb.prox_logp[:, 1:], old, mb.advantages[:, 1:], mask, correction=a.rollout_correction,
                level=a.correction_level, cap=a.is_cap, low=low, high=high, **kw,
            )  # fmt: skip
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

    def sft_loss(
        self, mb: TrainBatch, logp: torch.Tensor, num_tokens: float
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Negative log-likelihood of the ``loss_mask`` tokens, and how many of them are the argmax."""
        mask = mb.loss_mask[:, 1:]
        loss = -(logp * mask).sum() / num_tokens
        with torch.no_grad():
            correct = float(((logp > -0.6931) * mask).sum())  # p > 1/2: the token is the argmax
        return loss, {"loss": float(loss.detach()), "token_acc_tok": correct}


def make_backend(
    model: nn.Module, algo: AlgoConfig, optim: OptimConfig, *, norm_tokens: int | None = None, **kw: Any
) -> FSDP2Backend:
    """An :class:`~agentrl.trainer.backend.FSDP2Backend` handed ``algo``'s objective (``kw`` go to it)."""
    return FSDP2Backend(model, algo, optim, objective=RLObjective(algo, norm_tokens), **kw)
