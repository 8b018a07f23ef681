"""Chunked scoring (--score-chunk-tokens) gives today's logprobs, entropy, losses and gradients, and
keeps no micro-batch's full-vocabulary logits for backward; --precision bf16 trains on CPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).parent))
from _tiny import VOCAB, fixed_batch, grouped_batch, tiny_model  # noqa: E402

from agentrl.models.lora import LoraSpec, apply_lora  # noqa: E402
from agentrl.trainer.algorithm import make_backend  # noqa: E402
from agentrl.trainer.config import AlgoConfig, OptimConfig  # noqa: E402
from agentrl.trainer.errors import BackendError  # noqa: E402
from agentrl.trainer.forward import plain_logits, shared_logits, token_scores  # noqa: E402
from agentrl.trainer.precision import compute_dtype  # noqa: E402
from agentrl.trainer.prefix import plan_shared_prompts  # noqa: E402

CHUNK = 5  # several chunks, the last one short, on every test batch


def _untied(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False,
    )  # fmt: skip
    model = Qwen2ForCausalLM(cfg).float()
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 0.5)  # a head unlike the embedding
    return model


def _lora(seed: int = 0) -> torch.nn.Module:
    model = tiny_model(seed)
    apply_lora(model, LoraSpec(rank=4, target_modules="all-linear"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


MODELS = {"tied": tiny_model, "untied": _untied, "lora": _lora}


def _scores_and_grads(make, chunk: int, temperature: float, entropy_grad: bool, shared: bool):
    """logp, entropy and the gradient of a loss over both, of one forward (plain or shared-prompt)."""
    model = make()
    batch = grouped_batch() if shared else fixed_batch()
    if shared:
        plan = plan_shared_prompts(batch.input_ids, batch.attention_mask, batch.loss_mask)
        assert plan is not None
        scored = shared_logits(model, batch, plan, "cache", chunk_tokens=chunk)
    else:
        scored = plain_logits(model, batch, start=3, chunk_tokens=chunk)
    assert (scored.logits is None) == (chunk > 0)  # the chunked path really ran
    logp, ent = token_scores(scored, temperature, entropy=True, entropy_grad=entropy_grad)
    assert ent is not None and ent.requires_grad == entropy_grad
    w = torch.linspace(-1, 1, logp.numel()).view_as(logp)
    loss = (w * logp).sum() + (w.flip(0) * ent).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), ent.detach(), loss.detach(), grads


@pytest.mark.parametrize("shared", [False, True], ids=["plain", "shared-prompt"])
@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize(
    ("temperature", "entropy_grad"), [(0.7, True), (1.0, False), (0.0, True), (1.3, False)]
)
def test_chunked_scores_and_gradients_equal_the_full_logits(kind, shared, temperature, entropy_grad):
    full = _scores_and_grads(MODELS[kind], 0, temperature, entropy_grad, shared)
    chunked = _scores_and_grads(MODELS[kind], CHUNK, temperature, entropy_grad, shared)
    for a, b in zip(full[:3], chunked[:3], strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    assert full[3].keys() == chunked[3].keys() and full[3]
    if kind == "lora":
        assert all(".lora_" in n for n in full[3])
    for name, g in full[3].items():
        # fp32 sums in another order: the error scales with the gradient (the untied embedding's reaches ~230)
        scale = max(1.0, float(g.abs().max()))
        torch.testing.assert_close(chunked[3][name], g, atol=1e-5 * scale, rtol=1e-4, msg=name)


def _saved_bytes(chunk: int, vocab: int = 4096) -> tuple[int, int]:
    """Bytes the autograd graph holds for backward after scoring, and one full-logits tensor's bytes."""
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
    )  # fmt: skip
    model = Qwen2ForCausalLM(cfg).float()
    batch = fixed_batch()
    saved: dict[tuple[int, int], int] = {}  # each storage once (a weight is saved by every chunk's matmul)

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[(t.data_ptr(), t.numel())] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        scored = plain_logits(model, batch, chunk_tokens=chunk)
        logp, _ = token_scores(scored, 0.7, entropy=True, entropy_grad=False)
    logp.sum().backward()
    positions = batch.input_ids.shape[0] * (batch.input_ids.shape[1] - 1)
    return sum(saved.values()), positions * vocab * 4


def test_chunked_scoring_keeps_no_full_vocabulary_tensor_for_backward():
    full, logits_bytes = _saved_bytes(0)
    chunked, _ = _saved_bytes(CHUNK)
    assert full > logits_bytes  # today's path keeps the whole log_softmax for backward
    assert chunked < logits_bytes / 4, (chunked, logits_bytes)  # the weights, the trunk's activations


@pytest.mark.parametrize("entropy_coef", [0.0, 0.01])
def test_backend_update_with_chunked_scoring_equals_the_full_update(entropy_coef):
    results = []
    for chunk in (0, CHUNK):
        model = tiny_model()
        be = make_backend(
            model, AlgoConfig(entropy_coef=entropy_coef), OptimConfig(score_chunk_tokens=chunk),
            optimizer_factory=lambda ps: torch.optim.SGD(ps, lr=0.5), temperature=0.7,
        )  # fmt: skip
        assert be.score_chunk == chunk
        batch = grouped_batch()
        batch.old_logp = be.logprobs(batch)
        stats = be.train_step(batch)
        results.append((batch.old_logp, stats, model.state_dict()))
    (lp0, st0, sd0), (lp1, st1, sd1) = results
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=1e-5)
    for key in ("loss", "entropy", "grad_norm"):
        assert st1[key] == pytest.approx(st0[key], rel=1e-5, abs=1e-7), key
    for k in sd0:
        torch.testing.assert_close(sd1[k], sd0[k], atol=1e-6, rtol=1e-5)


def test_score_chunk_tokens_and_precision_are_checked():
    from agentrl.errors import ConfigError

    with pytest.raises(ConfigError, match="score_chunk_tokens"):
        OptimConfig(score_chunk_tokens=-1)
    with pytest.raises(BackendError, match="precision='fp16'"):
        compute_dtype("fp16", torch.device("cpu"))
    assert compute_dtype("auto", torch.device("cpu")) == torch.float32
    assert compute_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert compute_dtype("bf16", torch.device("cpu")) == torch.bfloat16


@pytest.mark.parametrize("chunk", [0, CHUNK])
def test_bf16_scores_in_float32_close_to_fp32(chunk):
    """bf16 autocast: the logprobs are float32 (from bf16 logits), near fp32's, and not bit-equal to them."""
    batch = fixed_batch()
    out = {}
    for precision in ("fp32", "bf16"):
        be = make_backend(
            tiny_model(), AlgoConfig(), OptimConfig(precision=precision, score_chunk_tokens=chunk)
        )
        out[precision] = be.logprobs(batch)
    m = batch.attention_mask[:, 1:] > 0
    assert out["bf16"].dtype == torch.float32
    diff = (out["bf16"][:, 1:] - out["fp32"][:, 1:])[m].abs()
    assert 0 < diff.max() < 0.1, diff.max()


@pytest.mark.parametrize("make_batch", [fixed_batch, grouped_batch], ids=["plain", "shared-prompt"])
def test_two_bf16_train_steps_on_cpu_learn_and_report_the_mismatch(make_batch):
    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    be = make_backend(model, AlgoConfig(), OptimConfig(precision="bf16", lr=1e-2, score_chunk_tokens=CHUNK))
    assert be.dtype == torch.bfloat16
    batch = make_batch()
    # the behaviour logprobs of an fp32 sampler: the bf16 trainer's mismatch against it is measured
    fp32 = make_backend(tiny_model(), AlgoConfig(), OptimConfig(precision="fp32"))
    batch.old_logp = fp32.logprobs(batch)
    for _ in range(2):
        stats = be.train_step(batch)
        assert all(torch.isfinite(torch.tensor(v)) for v in stats.values()), stats
        assert stats["grad_norm"] > 0
        mismatch = {k: v for k, v in stats.items() if k.startswith("mismatch")}
        assert mismatch, stats
    assert 0 < stats["mismatch_kl"] < 0.05
    assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 master weights
    assert all(s["exp_avg"].dtype == torch.float32 for s in be.optimizer.state.values())
    moved = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert len(moved) > len(before) // 2


def test_ppo_critic_reads_the_same_hidden_state_through_the_trunk():
    values = []
    for chunk in (0, CHUNK):
        be = make_backend(
            tiny_model(), AlgoConfig(algo="ppo"), OptimConfig(score_chunk_tokens=chunk), value_head=True
        )
        assert be.value_head is not None
        torch.nn.init.normal_(be.value_head.proj.weight)  # a critic that reads the hidden state
        values.append(be.values(fixed_batch()))
    torch.testing.assert_close(values[1], values[0], atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_agentrl_train_with_precision_bf16_runs_two_steps_on_cpu(tmp_path):
    """`agentrl train --precision bf16` on CPU: finite losses and gradients, and the mismatch of the
    bf16 trainer against the fp32 embedded engine reported (small, not zero)."""
    from rich.console import Console

    from agentrl.trainer.config import resolve as resolve_cfg
    from agentrl.trainer.loop import train
    from agentrl.trainer.metrics import read_jsonl

    run = tmp_path / "run"
    cfg = resolve_cfg(
        model="tiny-qwen3", env=f"{Path(__file__).with_name('_dense_env.py')}:VowelEnv", steps=2, sft_steps=0,
        group_size=4, tasks_per_step=4, max_new_tokens=16, eval_every=0, eval_episodes=4, progress=False,
        tensorboard=False, precision="bf16", score_chunk_tokens=8, lr=1e-3, run_dir=str(run),
    )  # fmt: skip
    assert cfg.optim.precision == "bf16"
    train(cfg, console=Console(file=open("/dev/null", "w")))  # noqa: SIM115
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    assert len(rows) == 2
    for r in rows:
        assert torch.isfinite(torch.tensor([r["train/loss"], r["train/grad_norm"]])).all(), r
        assert r["train/grad_norm"] > 0
        assert 0 < r["train/mismatch_abs_logp"] < 0.05, r["train/mismatch_abs_logp"]
