"""--colocate's memory plan on real model shapes: what vLLM gets of one card, and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.engines.memory_plan import ColocateError, GiB, kv_bytes_per_token, plan_colocated_vllm
from agentrl.trainer.colocate import trainer_resident_bytes
from agentrl.trainer.config import resolve

CARD = 80 * 10**9  # an 80 GB card as its driver reports it (bytes)
QWEN3 = {  # (hidden, layers, heads, kv heads, intermediate, tied embedding) from the models' config.json
    "0.6B": (1024, 28, 16, 8, 3072, True),
    "8B": (4096, 36, 32, 8, 12288, False),
}
VOCAB, HEAD_DIM = 151_936, 128


def qwen3(tmp_path: Path, size: str) -> tuple[Path, dict[str, tuple[int, ...]]]:
    """The model's config.json (in a directory) and its checkpoint's tensor shapes."""
    hidden, layers, heads, kv, inter, tied = QWEN3[size]
    d = tmp_path / size
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv, "head_dim": HEAD_DIM, "vocab_size": VOCAB,
    }))  # fmt: skip
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (VOCAB, hidden),
        "model.norm.weight": (hidden,),
    }
    if not tied:
        shapes["lm_head.weight"] = (VOCAB, hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (heads * HEAD_DIM, hidden),
            p + "self_attn.k_proj.weight": (kv * HEAD_DIM, hidden),
            p + "self_attn.v_proj.weight": (kv * HEAD_DIM, hidden),
            p + "self_attn.o_proj.weight": (hidden, heads * HEAD_DIM),
            p + "self_attn.q_norm.weight": (HEAD_DIM,),
            p + "self_attn.k_norm.weight": (HEAD_DIM,),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        }
    return d, shapes


def _plan(path: Path, shapes: dict[str, tuple[int, ...]], *flags: str):
    import math

    import torch

    cfg = resolve(**{"model.engine": "vllm", "model.colocate": True, "run.weight_sync": "disk"},
                  **dict(zip(flags[::2], flags[1::2], strict=True)))  # fmt: skip
    trainer = trainer_resident_bytes(cfg, shapes, torch.device("cuda"))
    params = sum(math.prod(s) for s in shapes.values())
    return (
        trainer,
        params,
        lambda: plan_colocated_vllm(
            path, total_bytes=CARD, trainer_bytes=trainer, param_count=params, max_model_len=4096
        ),
    )


def test_kv_bytes_per_token_are_the_models_keys_and_values(tmp_path: Path) -> None:
    # 2 (K and V) x 28 layers x 8 KV heads x 128 x 2 B: 112 KiB, as docs/gpu.md counts it
    assert kv_bytes_per_token(qwen3(tmp_path, "0.6B")[0]) == 2 * 28 * 8 * 128 * 2 == 112 * 1024


def test_a_full_fine_tune_of_0_6b_leaves_vllm_most_of_the_card(tmp_path: Path) -> None:
    path, shapes = qwen3(tmp_path, "0.6B")
    trainer, params, plan = _plan(path, shapes)
    assert 0.59e9 < params < 0.61e9 and trainer == 12 * params  # fp32 weights + AdamW's two moments
    p = plan()
    assert p.fraction == pytest.approx((CARD - trainer - 4e9) / CARD)  # margin: 5 % of the card
    assert 0.85 < p.fraction < 0.87 and p.kv_tokens > 500_000
    assert "vLLM gets 0.86" in p.describe()


def test_a_full_fine_tune_of_8b_is_refused_with_the_numbers_and_lora_fits(tmp_path: Path) -> None:
    path, shapes = qwen3(tmp_path, "8B")
    with pytest.raises(
        ColocateError, match=r"do not fit one 74.5 GiB GPU: the trainer keeps 91.\d GiB.*--lora-rank"
    ):
        _plan(path, shapes)[2]()
    trainer, params, plan = _plan(path, shapes, "lora.rank", 16)
    adapter = (
        36 * 16 * (2 * (4096 + 4096) + 2 * (1024 + 4096) + 3 * (12288 + 4096))
    )  # q, o; k, v; gate, up, down
    assert trainer == 2 * params + 16 * adapter  # the bf16 base and the adapter's weights, grads, moments
    p = plan()
    assert 0.73 < p.fraction < 0.75 and p.kv_tokens > 250_000  # 16.4 GB of weights, the rest KV
    assert p.engine_weights == 2 * params and p.engine_weights > 16 * GiB - 1 * GiB


def test_a_card_too_small_for_one_sequence_is_refused(tmp_path: Path) -> None:
    path, shapes = qwen3(tmp_path, "0.6B")
    trainer, params, _ = _plan(path, shapes, "lora.rank", 16)
    with pytest.raises(ColocateError, match="4,096 tokens of KV"):
        plan_colocated_vllm(
            path, total_bytes=5 * GiB, trainer_bytes=trainer, param_count=params, max_model_len=4096
        )
