"""Tiny random causal LMs in the Qwen2/Qwen3 architecture, deterministic from a seed.

Every parameter is drawn from its own ``torch.Generator`` seeded with the model seed and
the parameter's name, so the weights do not depend on the global RNG, on parameter order,
or on how transformers initialises modules: the same seed gives byte-identical
``model.safetensors``. Norm weights are ones; everything else is N(0, 0.02).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from agentrl.models.registry import ModelSpec

__all__ = ["model_config", "write_model_files"]

INIT_STD = 0.02


def model_config(
    spec: ModelSpec, vocab_size: int, bos_id: int | None, eos_id: int, pad_id: int
) -> dict[str, object]:
    """``config.json`` of the tiny model (a plain transformers Qwen2/Qwen3 config)."""
    head_dim = spec.hidden_size // spec.num_heads
    config: dict[str, object] = {
        "architectures": ["Qwen3ForCausalLM" if spec.arch == "qwen3" else "Qwen2ForCausalLM"],
        "attention_bias": spec.arch == "qwen2",
        "attention_dropout": 0.0,
        "bos_token_id": bos_id if bos_id is not None else pad_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": spec.hidden_size,
        "initializer_range": INIT_STD,
        "intermediate_size": spec.intermediate_size,
        "max_position_embeddings": 4096,
        "max_window_layers": spec.num_layers,
        "model_type": spec.arch,
        "num_attention_heads": spec.num_heads,
        "num_hidden_layers": spec.num_layers,
        "num_key_value_heads": spec.num_kv_heads,
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
    }
    return config


def _param_shapes(spec: ModelSpec, vocab_size: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes of every stored tensor, as transformers' Qwen2/Qwen3 modules name them."""
    h, i = spec.hidden_size, spec.intermediate_size
    hd = h // spec.num_heads
    q, kv = spec.num_heads * hd, spec.num_kv_heads * hd
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab_size, h),
        "model.norm.weight": (h,),
    }
    for n in range(spec.num_layers):
        p = f"model.layers.{n}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }
        if spec.arch == "qwen2":
            shapes |= {
                p + "self_attn.q_proj.bias": (q,),
                p + "self_attn.k_proj.bias": (kv,),
                p + "self_attn.v_proj.bias": (kv,),
            }
        else:
            shapes |= {p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)}
    return shapes


def _tensor(seed: int, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=torch.float32)
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
    return torch.randn(shape, generator=gen, dtype=torch.float32) * INIT_STD


def write_model_files(
    spec: ModelSpec,
    out: Path,
    vocab_size: int,
    bos_id: int | None,
    eos_id: int,
    pad_id: int,
    stop_ids: list[int],
) -> int:
    """Write config.json, generation_config.json and model.safetensors; returns the parameter count."""
    config = model_config(spec, vocab_size, bos_id, eos_id, pad_id)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {
        "bos_token_id": config["bos_token_id"],
        "do_sample": True,
        "eos_token_id": stop_ids,
        "pad_token_id": pad_id,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tensors = {
        name: _tensor(spec.seed, name, shape) for name, shape in _param_shapes(spec, vocab_size).items()
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return sum(t.numel() for t in tensors.values())
