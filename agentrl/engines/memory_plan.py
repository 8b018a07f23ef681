"""The GPU memory of a vLLM server that shares its GPU with the trainer (``--colocate``), planned up front.

vLLM takes ``--gpu-memory-utilization`` × the card's memory at start (weights, activation
workspace, the rest as KV cache) and keeps it while it serves. Colocated, it sleeps while the
trainer updates (:mod:`agentrl.engines.vllm_sleep`), so the two peaks do not meet: the update's
gradients, activations and scoring use what the sleeping engine released. What stays on the
card while vLLM is awake is the trainer's *resident* memory (its weights and optimizer state,
counted by the caller: :func:`agentrl.trainer.colocate.trainer_resident_bytes`) and a margin for
both processes' CUDA contexts and allocator slack. vLLM gets the rest (at most 90 %), and the
plan refuses to start when that rest cannot hold vLLM's weights, its workspace and the KV of
one sequence of ``max_model_len`` tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from agentrl.errors import ConfigError

__all__ = ["ColocatePlan", "ColocateError", "kv_bytes_per_token", "plan_colocated_vllm"]

GiB = 1 << 30
MAX_FRACTION = 0.9
"""vLLM's own default: never more of the card, however little the trainer keeps"""
WORKSPACE = 1 * GiB
"""vLLM's activation workspace and sampler buffers beside weights and KV (it profiles the real value)"""


class ColocateError(ConfigError):
    """The trainer and vLLM cannot share this GPU: the plan's numbers say what does not fit."""


def kv_bytes_per_token(model_path: str | Path, dtype_bytes: int = 2) -> int:
    """KV-cache bytes one token takes: keys and values of every layer (``config.json``'s shapes)."""
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    return 2 * int(cfg["num_hidden_layers"]) * kv_heads * head_dim * dtype_bytes


@dataclass(frozen=True)
class ColocatePlan:
    """One card shared by the trainer and a vLLM server; bytes throughout."""

    total: int
    """the card's memory"""
    trainer: int
    """what the trainer keeps on the card while vLLM serves (weights, optimizer state)"""
    engine_weights: int
    """vLLM's copy of the model"""
    kv_per_token: int
    max_model_len: int

    @property
    def margin(self) -> int:
        """CUDA contexts of both processes and allocator slack"""
        return max(2 * GiB, self.total // 20)

    @property
    def fraction(self) -> float:
        """``--gpu-memory-utilization``: what is left after the trainer and the margin (at most 0.9)"""
        return max(0.0, min(MAX_FRACTION, (self.total - self.trainer - self.margin) / self.total))

    @property
    def kv_tokens(self) -> int:
        """tokens of KV cache vLLM will have (before its own profiling refines the workspace)"""
        left = int(self.fraction * self.total) - self.engine_weights - WORKSPACE
        return max(0, left // max(1, self.kv_per_token))

    def describe(self) -> str:
        return (
            f"vLLM gets {self.fraction:.2f} of the {self.total / GiB:.1f} GiB card: {self.engine_weights / GiB:.1f} GiB "
            f"of weights and ~{self.kv_tokens:,} tokens of KV cache; the trainer keeps {self.trainer / GiB:.1f} GiB "
            f"while vLLM serves (margin {self.margin / GiB:.1f} GiB)"
        )

    def check(self) -> ColocatePlan:
        """The plan if one ``max_model_len`` sequence fits vLLM's share; else :class:`ColocateError`."""
        if self.kv_tokens < self.max_model_len:
            need = (
                self.trainer
                + self.margin
                + self.engine_weights
                + WORKSPACE
                + self.max_model_len * self.kv_per_token
            )
            raise ColocateError(
                f"--colocate: the trainer and vLLM do not fit one {self.total / GiB:.1f} GiB GPU: the trainer keeps "
                f"{self.trainer / GiB:.1f} GiB while vLLM serves, vLLM needs {self.engine_weights / GiB:.1f} GiB of "
                f"weights + {WORKSPACE / GiB:.0f} GiB of workspace + {self.max_model_len:,} tokens of KV "
                f"({self.max_model_len * self.kv_per_token / GiB:.2f} GiB), margin {self.margin / GiB:.1f} GiB: "
                f"{need / GiB:.1f} GiB in all. Train a LoRA adapter (--lora-rank 16, or --lora-quantize 4bit), "
                "use a smaller model, or give vLLM its own GPU (leave --colocate out)"
            )
        return self


def plan_colocated_vllm(
    model_path: str | Path, *, total_bytes: int, trainer_bytes: int, param_count: int, max_model_len: int
) -> ColocatePlan:
    """The checked plan for vLLM (bf16) serving ``model_path`` beside a trainer keeping ``trainer_bytes``."""
    plan = ColocatePlan(
        total_bytes, trainer_bytes, 2 * param_count, kv_bytes_per_token(model_path), max_model_len
    )
    return plan.check()
