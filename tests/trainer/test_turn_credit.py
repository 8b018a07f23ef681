"""Turn-level credit: per-turn rewards kept per turn, each assistant turn's tokens get their own advantage."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _tiny import tiny_model  # noqa: E402

from agentrl.errors import ConfigError  # noqa: E402
from agentrl.trainer import advantages as A  # noqa: E402
from agentrl.trainer.algo_config import AlgoConfig  # noqa: E402
from agentrl.trainer.algorithm import advantages, make_backend, train_step  # noqa: E402
from agentrl.trainer.backend import FSDP2Backend  # noqa: E402
from agentrl.trainer.batch import from_trajectories, turn_end_rewards  # noqa: E402
from agentrl.trainer.config import OptimConfig, RolloutConfig, TrainConfig  # noqa: E402
from agentrl.trainer.distributed import Ranks  # noqa: E402
from agentrl.trainer.errors import BackendError  # noqa: E402
from agentrl.trainer.rollout import Episode  # noqa: E402
from agentrl.types import Trajectory, TurnSpan  # noqa: E402


def _traj(turns: list[int], tag: int = 0) -> Trajectory:
    """A segment with one prompt token, then one sampled run of ``n`` tokens per turn (a tool token after each)."""
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


def _episode(turn_rewards: list[float], segments: list[list[int]], gid: str = "g") -> Episode:
    trajs = [_traj(s, tag=i) for i, s in enumerate(segments)]
    return Episode(0, gid, sum(turn_rewards), trajs, turn_rewards=list(turn_rewards))


def _cfg(kind: str, group_size: int = 2, **algo: Any) -> TrainConfig:
    if kind == "gae":
        algo.setdefault("algo", "ppo")
    return TrainConfig(
        rollout=RolloutConfig(group_size=group_size, max_new_tokens=16),
        algo=AlgoConfig(advantage=kind, **algo),
    )


# The hand-computed case: two episodes of three turns, gamma = 1/2.
#   A: rewards [1, 0, 2] -> G = [1 + 1/2 * 1, 0 + 1/2 * 2, 2] = [1.5, 1, 2]
#   B: rewards [0, 1, 0] -> G = [0 + 1/2 * 1, 1, 0]           = [0.5, 1, 0]
# Turn t's baseline is the group's turn-t returns: their mean is [1, 1, 1]. B's three turns are cut
# into two ledger segments.
HAND = {
    "dr_grpo": ([0.5, 0.0, 1.0], [-0.5, 0.0, -1.0]),  # G - 1
    "rloo": ([1.0, 0.0, 2.0], [-1.0, 0.0, -2.0]),  # G minus the other episode's G at the same turn
}


def _hand_group() -> list[Episode]:
    return [_episode([1.0, 0.0, 2.0], [[2, 3, 1]]), _episode([0.0, 1.0, 0.0], [[1], [2, 2]])]


@pytest.mark.parametrize("kind", ["dr_grpo", "rloo"])
def test_turn_advantages_of_a_hand_computed_group(kind):
    group = _hand_group()
    trajs, adv, _ = advantages(_cfg(kind, advantage_level="turn", turn_gamma=0.5), [group])
    a, b = HAND[kind]
    assert trajs == [*group[0].trajectories, *group[1].trajectories]
    assert adv == [a, b[:1], b[1:]]  # exact: every value is a multiple of 1/2
    # each turn's value covers exactly that turn's sampled tokens
    batch = from_trajectories(trajs, adv)
    assert batch.advantages[0].tolist() == [0.0, *[a[0]] * 2, 0.0, *[a[1]] * 3, 0.0, a[2], 0.0]
    assert batch.advantages[2, :7].tolist() == [0.0, b[1], b[1], 0.0, b[2], b[2], 0.0]


def test_grpo_scales_each_turn_by_the_std_of_the_groups_returns_at_that_turn():
    # turn 0: returns 1.5 and 0.5, std sqrt(1/2); turn 1: 1 and 1 (advantage 0); turn 2: 2 and 0, std sqrt(2)
    trajs, adv, _ = advantages(_cfg("grpo", advantage_level="turn", turn_gamma=0.5), [_hand_group()])
    s0, s2 = 0.5 / (math.sqrt(0.5) + A.EPS), 1.0 / (math.sqrt(2) + A.EPS)
    want = [[s0, 0.0, s2], [-s0], [0.0, -s2]]
    assert len(adv) == 3
    for got, ref in zip(adv, want, strict=True):
        assert got == pytest.approx(ref, rel=1e-6)


def test_turn_returns_discount_within_each_episode_only():
    r = torch.tensor([1.0, 0.0, 2.0, 0.0, 1.0, 0.0])
    episode = torch.tensor([0, 0, 0, 1, 1, 1])
    assert A.turn_returns(r, episode, 0.5).tolist() == [1.5, 1.0, 2.0, 0.5, 1.0, 0.0]
    assert A.turn_returns(r, episode, 1.0).tolist() == [3.0, 2.0, 2.0, 1.0, 1.0, 0.0]


@pytest.mark.parametrize("kind", ["grpo", "dr_grpo", "rloo"])
def test_outcome_only_rewards_at_gamma_one_give_the_episode_advantage_on_every_turn(kind):
    # the reward only after the last turn, episodes of a group equally long: every turn's return is
    # the episode's, so turn level is episode level (one episode cut into two segments, two groups)
    groups = [
        [
            _episode([0.0, 0.0, 1.0], [[2, 3], [1]]),
            _episode([0.0, 0.0, 0.0], [[4, 1, 1]]),
            _episode([0.0, 0.0, 0.5], [[1, 1, 2]]),
        ],
        [_episode([2.0], [[2]]), _episode([0.0], [[3]]), _episode([1.0], [[2]])],
    ]
    _, turn, _ = advantages(_cfg(kind, 3, advantage_level="turn"), groups)
    _, episode, _ = advantages(_cfg(kind, 3), groups)
    assert isinstance(turn, list) and isinstance(episode, torch.Tensor)
    for row, value in zip(turn, episode.tolist(), strict=True):
        assert row == pytest.approx([value] * len(row), rel=1e-6, abs=1e-6)


def test_episodes_of_different_lengths_compare_each_turn_with_the_episodes_that_reached_it():
    # gamma 1. A: [0.1, 1] (solved at turn 1), B: [1] (solved at once), C: [0.1, 0.1, 0] (never).
    # G: A [1.1, 1], B [1], C [0.2, 0.1, 0]. Turn 0: mean 2.3 / 3; turn 1: A and C, mean 0.55;
    # turn 2: C alone, no baseline, 0. A's winning turn is credited against C's turn 1
    group = [_episode([0.1, 1.0], [[2, 2]]), _episode([1.0], [[2]]), _episode([0.1, 0.1, 0.0], [[2], [2, 2]])]
    _, adv, _ = advantages(_cfg("dr_grpo", 3, advantage_level="turn"), [group])
    b0 = 2.3 / 3
    want = [[1.1 - b0, 0.45], [1.0 - b0], [0.2 - b0], [-0.45, 0.0]]
    assert len(adv) == 4
    for got, ref in zip(adv, want, strict=True):
        assert got == pytest.approx(ref, abs=1e-6)


def test_episode_level_ignores_the_per_turn_rewards_bit_for_bit():
    # the default: the same advantages, to the bit, with or without per-turn rewards recorded
    with_turns = [_hand_group(), [_episode([0.5, 0.25], [[3, 1]]), _episode([0.0, 0.0], [[2], [5]])]]
    without = [[Episode(0, ep.group_id, ep.reward, ep.trajectories) for ep in g] for g in with_turns]
    assert AlgoConfig().advantage_level == "episode"
    for kind in ["grpo", "dr_grpo", "rloo", "reinforce_pp", "gae"]:
        trajs, adv, _ = advantages(_cfg(kind), with_turns)
        ref_trajs, ref, _ = advantages(_cfg(kind), without)
        assert trajs == ref_trajs and isinstance(adv, torch.Tensor) and torch.equal(adv, ref)
        rewards = torch.tensor([ep.reward for g in with_turns for ep in g], dtype=torch.float32)
        if kind != "gae":
            gid = torch.tensor([0, 0, 1, 1])
            per_ep = A.group_advantages(kind, rewards, gid)
            assert torch.equal(adv, per_ep.repeat_interleave(torch.tensor([1, 2, 1, 2])))


def _capture(cfg: TrainConfig, groups: list[list[Episode]], **backend: Any) -> Any:
    """The batch ``train_step`` hands the backend."""
    be = make_backend(tiny_model(), cfg.algo, OptimConfig(lr=1e-3), **backend)
    seen = []
    be.train_step = lambda batch: seen.append(batch) or {}  # type: ignore[method-assign,func-returns-value]
    rt = SimpleNamespace(ranks=Ranks(), pad_id=0, engine=SimpleNamespace(weight_version=0))
    train_step(cfg, rt, be, groups)  # type: ignore[arg-type]
    return seen[0], be


def test_train_step_trains_each_turn_with_its_own_advantage():
    batch, _ = _capture(_cfg("dr_grpo", advantage_level="turn", turn_gamma=0.5), [_hand_group()])
    a, b = HAND["dr_grpo"]
    assert batch.advantages[0].tolist() == [0.0, *[a[0]] * 2, 0.0, *[a[1]] * 3, 0.0, a[2], 0.0]
    assert batch.advantages[1, :3].tolist() == [0.0, b[0], 0.0]
    assert batch.advantages[2, :7].tolist() == [0.0, b[1], b[1], 0.0, b[2], b[2], 0.0]


def test_ppo_puts_each_turns_reward_on_its_last_sampled_token():
    # A is one segment: its rewards [1, 0, 2] sit on the last tokens of its turns (positions 2, 6, 8).
    # B is two: its first segment's one turn also carries the reward of the later segment (0 + 1 + 0)
    group = _hand_group()
    batch, be = _capture(_cfg("gae", advantage_level="turn"), [group], value_head=True)
    assert isinstance(be, FSDP2Backend)
    assert batch.token_rewards[0].tolist() == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0]
    assert batch.token_rewards[1, :3].tolist() == [0.0, 1.0, 0.0]
    assert batch.token_rewards[2, :7].tolist() == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    # at episode level (the default) each row's whole reward is on its last sampled token
    batch, _ = _capture(_cfg("gae"), [group], value_head=True)
    assert batch.token_rewards[0].tolist() == [0.0] * 8 + [3.0, 0.0]
    assert batch.token_rewards[2, :7].tolist() == [0.0] * 5 + [1.0, 0.0]


def test_a_turn_without_trained_tokens_hands_its_reward_on():
    # turn 2 sampled nothing: its reward goes on turn 1's last token. Token 0 is never trained, so a
    # first turn of one token at position 0 hands its reward to the next turn
    t = _traj([2, 0, 1])
    mask = torch.tensor([t.loss_mask], dtype=torch.float32)
    assert turn_end_rewards([t], [[1.0, 2.0, 4.0]], mask)[0].tolist() == [0, 0, 3, 0, 0, 4, 0]
    head = Trajectory(
        token_ids=[5, 6, 7, 8], loss_mask=[1, 0, 1, 0], rollout_logprobs=[0.0] * 4, policy_versions=[0] * 4,
        turn_spans=[TurnSpan(start=0, end=1), TurnSpan(start=2, end=3)],
    )  # fmt: skip
    mask = torch.tensor([head.loss_mask], dtype=torch.float32)
    mask[0, 0] = 0.0  # as from_trajectories does
    assert turn_end_rewards([head], [[1.0, 2.0]], mask)[0].tolist() == [0, 0, 3, 0]


def test_overlong_penalty_goes_on_the_longest_turn():
    # max_new_tokens 16, buffer 8: the 12-token turn costs 0.5, on that turn only
    group = [_episode([0.0, 1.0], [[12, 2]]), _episode([0.0, 1.0], [[2, 2]])]
    _, adv, _ = advantages(_cfg("gae", advantage_level="turn", overlong_buffer=8), [group])
    assert adv == [[-0.5, 1.0], [0.0, 1.0]]


def test_an_outcome_only_episode_puts_its_reward_on_its_last_turn():
    # an agent program's episode records no per-turn rewards: its reward counts after its last turn
    group = [Episode(0, "g", 1.0, [_traj([2, 2])]), _episode([0.0, 0.0], [[2, 2]])]
    _, adv, _ = advantages(_cfg("gae", advantage_level="turn"), [group])
    assert adv == [[0.0, 1.0], [0.0, 0.0]]


def test_per_turn_rewards_that_do_not_match_the_turns_are_an_error():
    bad = Episode(0, "g", 1.0, [_traj([2, 2])], turn_rewards=[1.0])
    with pytest.raises(BackendError, match="1 per-turn rewards .* 2 turn spans"):
        advantages(_cfg("grpo", advantage_level="turn"), [[bad, _episode([0.0, 0.0], [[2, 2]])]])


def test_turn_gamma_only_where_it_applies():
    with pytest.raises(ConfigError, match="turn_gamma"):
        AlgoConfig(turn_gamma=0.9)  # episode level never reads it
    with pytest.raises(ConfigError, match="PPO discounts per token"):
        AlgoConfig(algo="ppo", advantage_level="turn", turn_gamma=0.9)
    with pytest.raises(ConfigError, match="turn_gamma"):
        AlgoConfig(advantage_level="turn", turn_gamma=1.5)
    assert AlgoConfig(advantage_level="turn", turn_gamma=0.9).turn_gamma == 0.9


class _ScriptedRewards:
    """Three turns whatever the model says; the env's reward after turn k is ``REWARDS[k]``."""

    REWARDS = (0.5, 0.0, 2.0)
    max_turns = 3
    tools: list[Any] = []

    def reset(self, seed=None):
        from agentrl.types import Message

        self.k = 0
        return [Message(role="user", content="Say anything.")], {}

    def step(self, action):
        from agentrl.types import Message

        self.k += 1
        done = self.k == len(self.REWARDS)
        return [Message(role="user", content="Again.")], self.REWARDS[self.k - 1], done, False, {}


def test_rollout_keeps_the_reward_of_every_turn():
    from agentrl.engines.hf import HFEngine
    from agentrl.models import load_model, load_tokenizer
    from agentrl.session.manager import SessionManager
    from agentrl.trainer.rollout import RolloutManager

    engine = HFEngine(load_model("tiny-qwen3"), device="cpu", prefix_cache_bytes=0)
    try:
        rm = RolloutManager(
            _ScriptedRewards, SessionManager(load_tokenizer("tiny-qwen3"), engine), max_new_tokens=4
        )
        (group,) = rm.run([0], group_size=2, temperature=1.0).groups
    finally:
        engine.close()
    for ep in group:
        assert ep.turn_rewards == [0.5, 0.0, 2.0] and ep.reward == 2.5
        assert sum(len(t.turn_spans) for t in ep.trajectories) == 3  # one span per rewarded turn
    # turn level trains on them: both episodes' returns are G = [1, 1, 2] at gamma 1/2, the same at
    # every turn, so no turn has an advantage (a baseline over episode returns, 1, gave the last +1)
    _, adv, _ = advantages(_cfg("dr_grpo", advantage_level="turn", turn_gamma=0.5), [group])
    assert adv == [[0.0, 0.0, 0.0]] * 2
