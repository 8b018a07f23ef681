"""The trainer scores every sampled token under the distribution the engine drew it from: softmax(logits / T)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

sys.path.insert(0, str(Path(__file__).parent))
from _tiny import fixed_batch, tiny_model  # noqa: E402

from agentrl.trainer.algorithm import make_backend  # noqa: E402
from agentrl.trainer.config import AlgoConfig, OptimConfig, resolve  # noqa: E402
from agentrl.trainer.forward import plain_logits, token_scores  # noqa: E402
from agentrl.types import SamplingParams  # noqa: E402

VOWELS = f"{Path(__file__).with_name('_dense_env.py')}:VowelEnv"  # a dense reward: nonzero advantages


def _reference(model: torch.nn.Module, batch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced ``(logp, entropy)`` of softmax(z / T), ``(B, T - 1)``, computed by hand in float64."""
    with torch.no_grad():
        z = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].double()
    logp_all = torch.log_softmax(z / temperature, dim=-1)
    logp = logp_all.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp.float(), ent.float()


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.3])
def test_token_scores_are_log_softmax_of_the_tempered_logits(temperature):
    model, batch = tiny_model(), fixed_batch()
    with torch.no_grad():
        logp, ent = token_scores(plain_logits(model, batch), temperature, entropy=True)
    ref_logp, ref_ent = _reference(model, batch, temperature)
    assert ent is not None
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    if temperature != 1.0:  # the temperature is not a no-op on this model
        plain, _ = _reference(model, batch, 1.0)
        assert (logp - plain).abs().max() > 1e-2


def test_temperature_zero_scores_the_plain_logits():
    """T = 0 is greedy: the engine reports the argmax's logprob under log_softmax(z) (docs/engines.md)."""
    model, batch = tiny_model(), fixed_batch()
    with torch.no_grad():
        logp, _ = token_scores(plain_logits(model, batch), 0.0)
    torch.testing.assert_close(logp, _reference(model, batch, 1.0)[0], atol=1e-5, rtol=1e-5)


def test_backend_scores_policy_reference_and_entropy_at_the_temperature():
    T = 0.7
    model, batch = tiny_model(), fixed_batch()
    be = make_backend(model, AlgoConfig(kl_coef=0.1), OptimConfig(), ref_model=tiny_model(), temperature=T)
    ref_logp, ref_ent = _reference(model, batch, T)
    m = batch.loss_mask[:, 1:] > 0
    torch.testing.assert_close(be.logprobs(batch)[:, 1:][m], ref_logp[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(be.ref_logprobs(batch)[:, 1:][m], ref_logp[m], atol=1e-5, rtol=1e-5)
    _, ent, _ = be._forward(model, batch, window=True, entropy=True)
    assert ent is not None
    torch.testing.assert_close(ent[m], ref_ent[m], atol=1e-5, rtol=1e-5)


def test_first_update_on_tempered_samples_has_ratio_one():
    """Behaviour logprobs of softmax(z / 0.7) (what the engine reports): the on-policy ratio is 1, nothing clips."""
    T = 0.7
    model, batch = tiny_model(), fixed_batch()
    batch.old_logp = torch.nn.functional.pad(_reference(model, batch, T)[0], (1, 0)) * batch.loss_mask
    be = make_backend(model, AlgoConfig(clip_low=0.01, clip_high=0.01), OptimConfig(), temperature=T)
    stats = be.train_step(batch)
    assert stats["clip_frac"] == 0.0
    assert stats["mismatch_abs_logp"] < 1e-5
    assert stats["approx_kl"] < 1e-10


def test_warm_start_nll_stays_at_temperature_one():
    """The warm start fits the demonstrations' own distribution: its loss is the NLL of softmax(z), whatever T."""
    model, batch = tiny_model(), fixed_batch()
    nll = -(_reference(model, batch, 1.0)[0] * batch.loss_mask[:, 1:]).sum() / batch.loss_mask[:, 1:].sum()
    be = make_backend(model, AlgoConfig(), OptimConfig(), temperature=0.7)
    assert be.sft_step(batch)["loss"] == pytest.approx(float(nll), rel=1e-5)


@pytest.mark.slow
def test_training_at_temperature_0_7_starts_on_policy(tmp_path, monkeypatch):
    """`--temperature 0.7` on the embedded engine: the first update's ratio is 1 to fp32 rounding.

    Every training request samples the full softmax(z / 0.7) (top-p 1, no top-k), the distribution
    the trainer scores; evaluation is greedy.
    """
    from agentrl.engines.hf import HFEngine
    from agentrl.trainer.loop import train
    from agentrl.trainer.metrics import read_jsonl

    asked: set[tuple[float, float, bool]] = set()
    generate = HFEngine.generate

    async def spy(self: HFEngine, input_ids: list[int], sampling: SamplingParams, **kw: Any) -> Any:
        asked.add((sampling.temperature, sampling.top_p, sampling.top_k > 0))
        return await generate(self, input_ids, sampling, **kw)

    monkeypatch.setattr(HFEngine, "generate", spy)

    cfg = resolve(
        model="tiny-qwen3", env=VOWELS, group_size=4, tasks_per_step=2, max_new_tokens=8, eval_episodes=2,
        sft_steps=0, eval_every=0, progress=False, tensorboard=False, steps=1, temperature=0.7,
        clip_low=0.01, clip_high=0.01, run_dir=str(tmp_path),
    )  # fmt: skip
    train(cfg, console=Console(file=open("/dev/null", "w")))  # noqa: SIM115
    (row,) = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "train"]
    assert row["train/tokens"] > 0 and row["algo/zero_adv_frac"] < 1  # tokens whose ratio the clip acts on
    assert row["train/mismatch_abs_logp"] < 1e-5, row  # 0.060 when the trainer scored log_softmax(z)
    assert row["train/clip_frac"] == 0.0, row
    assert row["train/approx_kl"] < 1e-10, row
    assert asked == {(0.7, 1.0, False), (0.0, 1.0, False)}  # training rollouts, greedy evaluations


def test_an_agent_asking_for_top_p_or_top_k_samples_the_runs_full_distribution():
    """A pinned agent session ignores the agent's truncation: training never samples a distribution
    (top-p, top-k) the trainer does not score."""
    import asyncio

    from agentrl.models import load_tokenizer
    from agentrl.session.embedded import GatewayManager
    from agentrl.trainer.agent import turn_sampler

    gm = GatewayManager(load_tokenizer("tiny-qwen3"), object())
    sid = asyncio.run(gm.create())
    gm.pin(sid, turn_sampler(0.7, 8, lambda turn: 100 + turn))
    got = gm.turn_sampling(sid, SamplingParams(temperature=2.0, top_p=0.5, top_k=5, max_new_tokens=4))
    assert got is not None
    assert (got.temperature, got.top_p, got.top_k, got.max_new_tokens) == (0.7, 1.0, -1, 4)
