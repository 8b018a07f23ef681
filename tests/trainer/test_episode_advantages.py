"""Group statistics count episodes, not rows: an episode cut into k ledger segments enters its group once."""

from __future__ import annotations

import itertools
import math
import random
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _tiny import tiny_model  # noqa: E402

from agentrl.trainer import advantages as A  # noqa: E402
from agentrl.trainer import losses as L  # noqa: E402
from agentrl.trainer.algo_config import AlgoConfig  # noqa: E402
from agentrl.trainer.algorithm import advantages, make_backend, train_step  # noqa: E402
from agentrl.trainer.config import OptimConfig, RolloutConfig, TrainConfig  # noqa: E402
from agentrl.trainer.distributed import Ranks  # noqa: E402
from agentrl.trainer.rollout import Episode  # noqa: E402
from agentrl.types import Trajectory, TurnSpan  # noqa: E402


def _traj(turns: list[int], tag: int = 0) -> Trajectory:
    """A segment with one prompt token, then one sampled run of ``n`` tokens per turn (a tool token between)."""
    ids, mask, spans = [tag], [0], []
    for n in turns:
        spans.append(TurnSpan(start=len(ids), end=len(ids) + n))
        ids += [1] * n + [2]
        mask += [1] * n + [0]
    return Trajectory(
        token_ids=ids,
        loss_mask=mask,
        rollout_logprobs=[-0.5 * m for m in mask],
        policy_versions=[0 if m else -1 for m in mask],
        turn_spans=spans,
    )


def _episode(reward: float, segments: list[list[int]], gid: str = "g") -> Episode:
    return Episode(0, gid, reward, [_traj(s, tag=i) for i, s in enumerate(segments)])


def _cfg(kind: str, group_size: int, **algo: object) -> TrainConfig:
    return TrainConfig(
        rollout=RolloutConfig(group_size=group_size, max_new_tokens=16),
        algo=AlgoConfig(advantage=kind, **algo),
    )


def test_rloo_is_leave_one_out_over_episodes():
    # episode 1 (reward 1) was cut into two segments, episode 2 (reward 0) is one: RLOO over the two
    # episodes is +1 / -1; over the three rows it was [0.5, 0.5, -1]
    group = [_episode(1.0, [[3], [2]]), _episode(0.0, [[4]])]
    trajs, adv, _ = advantages(_cfg("rloo", 2), [group])
    assert trajs == [*group[0].trajectories, *group[1].trajectories]
    assert adv.tolist() == [1.0, 1.0, -1.0]


ARMS_LOGITS, ARMS_REWARD, ARMS_SEGMENTS = torch.tensor([0.4, -0.3, 0.1]), [1.0, 0.0, 0.5], [2, 1, 1]


def _direction(row_advantages: Callable[[tuple[int, ...]], torch.Tensor], g: int) -> torch.Tensor:
    """The expected update direction by exact enumeration of every group of ``g`` episodes.

    Arm ``a`` is the token sampled in an episode's first segment (score ``e_a - pi``); pulling it
    cuts the episode into ``ARMS_SEGMENTS[a]`` segments whose later tokens are forced (score 0).
    ``row_advantages(arms)`` gives one advantage per segment, the group's rows in order.
    """
    pi = torch.softmax(ARMS_LOGITS.double(), -1)
    eye = torch.eye(len(pi), dtype=pi.dtype)
    out = torch.zeros_like(pi)
    for arms in itertools.product(range(len(pi)), repeat=g):
        adv = row_advantages(arms)
        first = torch.tensor([0, *(ARMS_SEGMENTS[a] for a in arms[:-1])]).cumsum(0).tolist()
        score = sum(float(adv[i]) * (eye[a] - pi) for i, a in zip(first, arms, strict=True))
        out += math.prod(float(pi[a]) for a in arms) * score
    return out


@pytest.mark.parametrize("kind", ["dr_grpo", "rloo"])
@pytest.mark.parametrize("g", [2, 3])
def test_bandit_with_a_multi_segment_arm_follows_the_true_gradient(kind, g):
    pi = torch.softmax(ARMS_LOGITS.double(), -1)
    eye = torch.eye(len(pi), dtype=pi.dtype)
    true = sum(pi[a] * ARMS_REWARD[a] * (eye[a] - pi) for a in range(len(pi)))
    assert isinstance(true, torch.Tensor)

    def per_episode(arms: tuple[int, ...]) -> torch.Tensor:
        group = [_episode(ARMS_REWARD[a], [[1]] * ARMS_SEGMENTS[a]) for a in arms]
        return advantages(_cfg(kind, g), [group])[1]

    def per_row(arms: tuple[int, ...]) -> torch.Tensor:
        r = torch.tensor([ARMS_REWARD[a] for a in arms for _ in range(ARMS_SEGMENTS[a])])
        return A.group_advantages(kind, r, torch.zeros(len(r), dtype=torch.long))

    cos = torch.nn.functional.cosine_similarity
    assert cos(_direction(per_episode, g), true, dim=0) > 1 - 1e-12
    # the case tells them apart: the estimator over rows (each segment a member of the group) does not
    assert cos(_direction(per_row, g), true, dim=0) < 0.999


def test_overlong_penalty_is_the_episodes_longest_turn_on_every_segment():
    # max_new_tokens 16, buffer 8: a turn of 12 tokens costs 0.5. The episode's long turn is in its
    # second segment; both segments carry the same shaped reward
    group = [_episode(1.0, [[2], [12, 3]]), _episode(1.0, [[2]])]
    trajs, shaped, info = advantages(_cfg("gae", 2, algo="ppo", overlong_buffer=8), [group])
    assert len(trajs) == 3
    assert shaped.tolist() == [0.5, 0.5, 1.0]
    assert info["algo/overlong_penalty"] == pytest.approx(-0.25)  # the mean over episodes


def test_dynamic_sampling_keeps_and_drops_whole_episodes():
    flat = [_episode(1.0, [[2], [2], [2]]), _episode(1.0, [[2]])]
    mixed = [_episode(1.0, [[2], [2]]), _episode(0.0, [[2]])]
    trajs, adv, info = advantages(_cfg("grpo", 2, dynamic_sampling=True), [flat, mixed])
    assert trajs == [*mixed[0].trajectories, *mixed[1].trajectories]
    assert adv[0] == adv[1] > 0 > adv[2]
    assert info["algo/dynamic_sampling_kept"] == 0.5  # two of the four episodes


def test_dynamic_sampling_filters_on_the_raw_reward():
    # max_new_tokens 16, buffer 8, penalty 1e-3: turns of 12 and 13 tokens differ by 1.25e-4 after
    # shaping. Equal raw rewards are no signal, so that group is dropped (on the shaped reward it was
    # kept, with advantages of about +-0.7 from length noise); distinct raw rewards are kept
    equal = [_episode(1.0, [[12]]), _episode(1.0, [[13]])]
    distinct = [_episode(1.0, [[12]]), _episode(0.0, [[13]])]
    cfg = _cfg("grpo", 2, dynamic_sampling=True, overlong_buffer=8, overlong_penalty=1e-3)
    trajs, adv, info = advantages(cfg, [equal, distinct])
    assert trajs == [*distinct[0].trajectories, *distinct[1].trajectories]
    assert adv[0] > 0 > adv[1]
    assert info["algo/dynamic_sampling_kept"] == 0.5  # the two episodes of the equal group dropped
    # the kept group's advantages are still those of its shaped rewards
    shaped = torch.tensor([1.0 - 0.5e-3, 0.0 - 0.625e-3])
    assert torch.allclose(adv, A.group_advantages("grpo", shaped, torch.zeros(2, dtype=torch.long)))


def _rows_reference(cfg: TrainConfig, groups: list[list[Episode]]) -> tuple[list[Trajectory], torch.Tensor]:
    """The row-level computation, which single-segment episodes must reproduce exactly."""
    a = cfg.algo
    trajs = [t for g in groups for ep in g for t in ep.trajectories]
    rew = torch.tensor([ep.reward for g in groups for ep in g], dtype=torch.float32)
    gid = torch.tensor([gi for gi, g in enumerate(groups) for _ in g])
    lengths = torch.tensor([max(s.end - s.start for s in t.turn_spans) for t in trajs])
    raw = rew
    if a.overlong_buffer:
        rew = rew + L.overlong_penalty(
            lengths, cfg.rollout.max_new_tokens, a.overlong_buffer, a.overlong_penalty
        )
    if a.dynamic_sampling:
        keep = L.dynamic_sampling_keep(raw, gid)
        trajs = [t for t, k in zip(trajs, keep.tolist(), strict=True) if k]
        rew, gid = rew[keep], gid[keep]
    if a.advantage_kind == "gae":
        return trajs, rew
    return trajs, A.group_advantages(a.advantage_kind, rew, gid)


@pytest.mark.parametrize("kind", ["grpo", "dr_grpo", "rloo", "reinforce_pp", "gae"])
@pytest.mark.parametrize("shaping", [{}, {"overlong_buffer": 6, "dynamic_sampling": True}])
def test_single_segment_episodes_are_unchanged(kind, shaping):
    rng = random.Random(0)
    groups = [
        [_episode(rng.choice([0.0, 0.5, 1.0]), [[rng.randint(1, 16), rng.randint(1, 16)]]) for _ in range(4)]
        for _ in range(6)
    ]
    groups.append([_episode(1.0, [[3]]) for _ in range(4)])  # a constant group
    cfg = _cfg(kind, 4, **({"algo": "ppo"} if kind == "gae" else {}), **shaping)
    trajs, adv, _ = advantages(cfg, groups)
    ref_trajs, ref = _rows_reference(cfg, groups)
    assert trajs == ref_trajs
    assert torch.equal(adv, ref)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("split", [True, False])
def test_seq_mean_aggregation_counts_each_episode_once(mode, split):
    # Dr.GRPO: the 8-token episode (reward 1) gets +0.5, the 2-token one -0.5. On-policy (ratio 1)
    # the loss is -(the seq-mean of A), the same whether the first episode is one segment or two
    first = [[3], [5]] if split else [[3, 5]]
    group = [_episode(1.0, first), _episode(0.0, [[2]])]
    cfg = TrainConfig(
        rollout=RolloutConfig(group_size=2),
        algo=AlgoConfig(advantage="dr_grpo", loss_agg=mode),
        optim=OptimConfig(lr=1e-2),
    )
    be = make_backend(tiny_model(), cfg.algo, cfg.optim)
    update = be.train_step

    def on_policy(batch):
        batch.old_logp = be.logprobs(batch) * batch.loss_mask
        return update(batch)

    be.train_step = on_policy  # type: ignore[method-assign]
    rt = SimpleNamespace(ranks=Ranks(), pad_id=0, engine=SimpleNamespace(weight_version=0))
    stats = train_step(cfg, rt, be, [group])  # type: ignore[arg-type]
    per_episode = [0.5, -0.5] if mode == "seq-mean-token-mean" else [8 * 0.5, 2 * -0.5]
    assert stats["train/loss"] == pytest.approx(-sum(per_episode) / 2, abs=1e-6)


def test_train_step_counts_the_tokens_trained_past_the_staleness_bound():
    # K = 1, the weights being updated are version 3: tokens of versions 1 and 0 are past the bound.
    # Prompt and tool tokens (version -1, not trained) do not count
    def traj(versions: list[int]) -> Trajectory:
        t = _traj([len(versions)])
        return t.model_copy(update={"policy_versions": [-1, *versions, -1]})

    group = [
        Episode(0, "g", 1.0, [traj([3, 2, 1])]),
        Episode(0, "g", 0.0, [traj([0, 3]), traj([2])]),
    ]
    cfg = TrainConfig(
        rollout=RolloutConfig(group_size=2, max_staleness=1),
        algo=AlgoConfig(advantage="grpo"),
        optim=OptimConfig(lr=1e-3),
    )
    be = make_backend(tiny_model(), cfg.algo, cfg.optim)
    rt = SimpleNamespace(ranks=Ranks(), pad_id=0, engine=SimpleNamespace(weight_version=3))
    stats = train_step(cfg, rt, be, [group])  # type: ignore[arg-type]
    assert stats["train/staleness_max"] == 3.0
    assert stats["train/tokens_past_bound"] == 2.0
    rt.engine.weight_version = 2  # one version earlier only the version-0 token is past the bound
    assert train_step(cfg, rt, be, [group])["train/tokens_past_bound"] == 1.0  # type: ignore[arg-type]
