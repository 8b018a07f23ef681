"""Shared-prompt training: one forward per distinct prompt gives the logprobs and the update of the plain forward."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _tiny import fixed_batch, grouped_batch, tiny_model  # noqa: E402

from agentrl.trainer.algorithm import make_backend as FSDP2Backend  # noqa: E402
from agentrl.trainer.config import AlgoConfig, OptimConfig  # noqa: E402
from agentrl.trainer.prefix import plan_shared_prompts  # noqa: E402


def _backend(share: bool, **algo: float) -> FSDP2Backend:
    return FSDP2Backend(
        tiny_model(),
        AlgoConfig(**algo),
        OptimConfig(packing="off"),  # the shared forward against the padded one (packing: test_packing.py)
        share_prompts=share,
        optimizer_factory=lambda ps: torch.optim.SGD(ps, lr=0.5),
    )


def test_plan_groups_rows_by_identical_prompt():
    b = grouped_batch()
    plan = plan_shared_prompts(b.input_ids, b.attention_mask, b.loss_mask)
    assert plan is not None
    assert plan.owner.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    # each prompt stops one token before the first trained token (its logit comes from there)
    assert [len(p) for p in plan.prompts] == [4, 8, 6]
    assert plan.cost < 0.8 * b.input_ids.numel()
    assert plan_shared_prompts(b.input_ids, b.attention_mask, b.loss_mask, min_saving=0.9) is None
    f = fixed_batch()  # random rows share nothing
    assert plan_shared_prompts(f.input_ids, f.attention_mask, f.loss_mask) is None


def test_shared_prompt_logprobs_match_the_plain_forward():
    b = grouped_batch()
    be = _backend(True)
    logp, ent, _ = be._forward(be.model, b, window=True, entropy=True)
    ref, ref_ent, _ = be._forward(be.model, b, window=False, entropy=True)
    m = b.loss_mask[:, 1:]
    assert ent is not None and ref_ent is not None
    torch.testing.assert_close(logp * m, ref * m, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent * m, ref_ent * m, atol=1e-5, rtol=1e-5)
    plan = plan_shared_prompts(b.input_ids, b.attention_mask, b.loss_mask)
    assert plan is not None and be.share_prompts
    for r, (p, n) in enumerate(zip(plan.prefix_len.tolist(), b.lengths.tolist(), strict=True)):
        assert bool((logp[r, :p] == 0).all()) and bool((logp[r, n - 1 :] == 0).all())  # prompt and padding
        assert bool((logp[r, p : n - 1] != 0).all())  # every token after the prompt is scored, trained or not


@pytest.mark.parametrize("entropy_coef", [0.0, 0.01])
def test_shared_prompt_update_matches_the_plain_update(entropy_coef):
    out = []
    for share in (True, False):
        be = _backend(share, entropy_coef=entropy_coef)
        b = grouped_batch()
        b.old_logp = be.logprobs(b) * b.loss_mask
        stats = be.train_step(b)
        out.append((stats, be.model.state_dict()))
    (s1, w1), (s0, w0) = out
    for key in ("loss", "entropy", "grad_norm"):
        assert s1[key] == pytest.approx(s0[key], rel=1e-4), key
    for k in w1:
        torch.testing.assert_close(w1[k], w0[k], atol=1e-5, rtol=1e-4)


def test_sharing_is_off_where_it_cannot_run():
    assert FSDP2Backend(tiny_model(), AlgoConfig(), OptimConfig()).share_prompts
    be = FSDP2Backend(tiny_model(), AlgoConfig(), OptimConfig(), activation_checkpointing=True)
    assert not be.share_prompts  # transformers turns the KV cache off under gradient checkpointing
    model = tiny_model()
    model.config._attn_implementation = "flash_attention_2"  # takes no 4-D mask
    assert not FSDP2Backend(model, AlgoConfig(), OptimConfig()).share_prompts
    assert not FSDP2Backend(tiny_model(), AlgoConfig(), OptimConfig(), share_prompts=False).share_prompts


def test_micro_batches_keep_a_group_together_when_it_fits():
    from agentrl.trainer.batch import token_budget_microbatches

    mixed = [10, 30, 12, 28, 11, 29]
    keys = ["a", "a", "a", "b", "b", "b"]  # two groups, each with long and short rows
    by_length = token_budget_microbatches(mixed, 90)
    assert {frozenset(keys[i] for i in mb) for mb in by_length} == {frozenset("ab")}  # groups split
    grouped = token_budget_microbatches(mixed, 90, keys)
    assert grouped == [[1, 2, 0], [5, 3, 4]]  # each group whole, longest row first
    assert all(max(mixed[i] for i in mb) * len(mb) <= 90 for mb in grouped)
