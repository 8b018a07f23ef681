"""The RL objective's defaults do what they are for: GSPO's own clip range clips, dual-clip bounds
negative advantages, Dr.GRPO's constant normaliser, mismatch metrics against pi_prox."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _tiny import fixed_batch, tiny_model  # noqa: E402
from test_episode_advantages import _episode  # noqa: E402

from agentrl.errors import ConfigError  # noqa: E402
from agentrl.trainer import losses as L  # noqa: E402
from agentrl.trainer.algo_config import AlgoConfig  # noqa: E402
from agentrl.trainer.algorithm import make_backend, train_step  # noqa: E402
from agentrl.trainer.config import OptimConfig, RolloutConfig, TrainConfig  # noqa: E402
from agentrl.trainer.distributed import Ranks  # noqa: E402


def _on_policy(be, batch):
    batch.old_logp = be.logprobs(batch) * batch.loss_mask
    return batch


# ---------------------------------------------------------------- GSPO's clip range


def test_clip_range_defaults_to_the_policy_losss_own():
    assert AlgoConfig().clip == (0.2, 0.28)
    assert AlgoConfig(policy_loss="cispo").clip == (0.2, 0.28)
    assert AlgoConfig(policy_loss="gspo").clip == (3e-4, 4e-4)
    assert AlgoConfig(policy_loss="gspo", clip_low=0.1).clip == (0.1, 4e-4)  # a set bound is kept
    assert AlgoConfig(clip_high=0.5).clip == (0.2, 0.5)
    with pytest.raises(ConfigError, match=r"clip_low/clip_high"):
        AlgoConfig(policy_loss="gspo", clip_low=1.5)


def test_gspo_update_clips_sequence_ratios_of_1e_2_under_its_default():
    # every sequence's ratio is exp(+-0.01) in the direction its advantage pushes: outside GSPO's
    # [1 - 3e-4, 1 + 4e-4], so every one clips; inside ppo's [0.8, 1.28], where none did before
    be = make_backend(tiny_model(), AlgoConfig(policy_loss="gspo"), OptimConfig(lr=1e-3))
    batch = _on_policy(be, fixed_batch())
    sign = torch.sign(batch.advantages[:, 4:5])  # each row's advantage (constant over its tokens)
    batch.old_logp = batch.old_logp - 0.01 * sign * batch.loss_mask
    stats = be.train_step(batch)
    assert stats["clip_frac"] == pytest.approx(1.0)
    wide = make_backend(
        tiny_model(), AlgoConfig(policy_loss="gspo", clip_low=0.2, clip_high=0.28), OptimConfig()
    )
    assert wide.train_step(batch)["clip_frac"] == 0.0


# ---------------------------------------------------------------- dual clip


def test_dual_clip_bounds_a_large_negative_advantage_ratio_by_default():
    # ratio e^3 ~ 20 on every token, advantage -1: the clipped surrogate is 20 a token, dual-clip's
    # bound -c A = 3
    assert AlgoConfig().dual_clip == 3.0
    be = make_backend(tiny_model(), AlgoConfig(), OptimConfig(lr=1e-3))
    batch = _on_policy(be, fixed_batch())
    batch.old_logp = batch.old_logp - 3.0 * batch.loss_mask
    batch.advantages = -batch.loss_mask.clone()
    assert be.train_step(batch)["loss"] == pytest.approx(3.0, rel=1e-5)
    off = make_backend(tiny_model(), AlgoConfig(dual_clip=0.0), OptimConfig(lr=1e-3))
    assert off.train_step(batch)["loss"] == pytest.approx(float(torch.exp(torch.tensor(3.0))), rel=1e-4)


# ---------------------------------------------------------------- Dr.GRPO's constant normaliser


def test_seq_mean_token_sum_norm_divides_by_episodes_times_the_constant():
    per_tok = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    loss = L.aggregate(per_tok, mask, "seq-mean-token-sum-norm", norm_tokens=8)
    assert loss.item() == pytest.approx((1 + 2 + 3 + 4) / (2 * 8))
    loss.backward()  # every trained token's gradient is 1 / (episodes * constant), whatever its length
    assert per_tok.grad.tolist() == [[1 / 16, 1 / 16, 1 / 16, 0.0], [1 / 16, 0.0, 0.0, 0.0]]
    # the global denominators: this micro-batch is a share of 5 episodes
    assert L.aggregate(per_tok, mask, "seq-mean-token-sum-norm", num_seqs=5, norm_tokens=8).item() == (
        pytest.approx(10 / 40)
    )
    with pytest.raises(ConfigError, match="norm_tokens"):
        L.aggregate(per_tok, mask, "seq-mean-token-sum-norm")


@pytest.mark.parametrize("split", [True, False])
def test_seq_mean_token_sum_norm_counts_each_episode_once(split):
    # Dr.GRPO on policy: the 8-token episode gets +0.5, the 2-token one -0.5; the loss is minus the
    # token sum over 2 episodes x max_new_tokens, whether the first episode is one segment or two
    first = [[3], [5]] if split else [[3, 5]]
    group = [_episode(1.0, first), _episode(0.0, [[2]])]
    cfg = TrainConfig(
        rollout=RolloutConfig(group_size=2, max_new_tokens=16),
        algo=AlgoConfig(advantage="dr_grpo", loss_agg="seq-mean-token-sum-norm"),
        optim=OptimConfig(lr=1e-2),
    )
    be = make_backend(tiny_model(), cfg.algo, cfg.optim, norm_tokens=cfg.rollout.max_new_tokens)
    update = be.train_step
    be.train_step = lambda batch: update(_on_policy(be, batch))  # type: ignore[method-assign]
    rt = SimpleNamespace(ranks=Ranks(), pad_id=0, engine=SimpleNamespace(weight_version=0))
    stats = train_step(cfg, rt, be, [group])  # type: ignore[arg-type]
    assert stats["train/loss"] == pytest.approx(-(8 * 0.5 + 2 * -0.5) / (2 * 16), abs=1e-6)


def test_seq_mean_token_sum_norm_micro_batches_give_the_full_batch_update():
    results = []
    for budget in (10_000, 40):
        model = tiny_model()
        be = make_backend(
            model,
            AlgoConfig(loss_agg="seq-mean-token-sum-norm"),
            OptimConfig(micro_batch_tokens=budget),
            norm_tokens=16,
            optimizer_factory=lambda ps: torch.optim.SGD(ps, lr=0.5),
        )
        be.train_step(_on_policy(be, fixed_batch()))
        results.append(model.state_dict())
    for k in results[0]:
        torch.testing.assert_close(results[0][k], results[1][k], atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------- mismatch against pi_prox


def test_mismatch_is_against_the_policy_at_the_start_of_the_update():
    # behaviour logprobs are exactly the initial policy's: the engine mismatch is 0. The second
    # mini-batch is scored after the first one's step; counting it would report that drift
    be = make_backend(tiny_model(), AlgoConfig(num_minibatches=2), OptimConfig(lr=1e-2))
    batch = _on_policy(be, fixed_batch())
    stats = be.train_step(batch)
    assert stats["logprob_diff"] > 1e-4  # the second mini-batch did drift
    assert stats["mismatch_abs_logp"] < 1e-6
    assert stats["mismatch_kl"] < 1e-9


def test_decoupled_mismatch_is_over_all_rows_against_prox():
    be = make_backend(tiny_model(), AlgoConfig(num_minibatches=2, decoupled=True), OptimConfig(lr=1e-2))
    batch = _on_policy(be, fixed_batch())
    batch.prox_logp = batch.old_logp.clone()
    noise = torch.randn(batch.old_logp.shape, generator=torch.Generator().manual_seed(3)) * 0.1
    batch.old_logp = batch.old_logp + noise * batch.loss_mask
    stats = be.train_step(batch)
    m = batch.loss_mask[:, 1:] > 0
    assert stats["mismatch_abs_logp"] == pytest.approx(float(noise[:, 1:][m].abs().double().mean()), rel=1e-5)
