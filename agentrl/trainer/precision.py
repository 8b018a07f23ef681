"""The update's compute precision (``--precision``): bf16 compute over float32 weights, or float32.

``bf16`` runs the forward (and so the backward) of the trainer's model in bfloat16 under
``torch.autocast``, while everything that accumulates stays float32: the parameters (the master
weights), their gradients, the optimizer's state, the logprobs (:mod:`agentrl.trainer.forward`
casts the bf16 logits to float32 before the softmax) and the losses' reductions. Under FSDP2
sharding the same knob sets ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``
instead of autocast. ``auto`` is bf16 on CUDA and float32 on CPU, where bf16 matmuls are several
times slower without AMX.

What never trains is stored in bf16 under bf16 compute (:func:`store_frozen`): a LoRA run's frozen
base and the KL reference take half the memory and score exactly what their float32 copies
scored, because the compute already rounded those weights to bf16 at every forward.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from agentrl.trainer.errors import BackendError

__all__ = ["PRECISIONS", "autocast", "compute_dtype", "store_frozen"]

PRECISIONS = ("auto", "fp32", "bf16")


def compute_dtype(precision: str, device: torch.device) -> torch.dtype:
    """``torch.bfloat16`` or ``torch.float32``: what ``precision`` means on ``device``."""
    if precision not in PRECISIONS:
        raise BackendError(f"precision={precision!r}: use one of {', '.join(PRECISIONS)}")
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return torch.bfloat16 if precision == "bf16" else torch.float32


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on ``device`` for a bf16 ``dtype``; nothing for float32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def store_frozen(model: nn.Module, dtype: torch.dtype, *, whole: bool = False) -> int:
    """Store what of ``model`` never trains in ``dtype``; returns the bytes this saved.

    ``whole=False`` (a model run under autocast): the weights and biases of every ``nn.Linear``
    whose parameters are all frozen (a LoRA base layer, an untied output head), except one that
    shares its weight with the input embedding. Autocast rounds exactly those to ``dtype`` at every
    forward, so the scores are unchanged to the bit; the embedding and the norms stay float32, and
    so does the residual stream, as under autocast. ``whole=True`` (a frozen model run without
    autocast beside an FSDP2 policy whose ``MixedPrecisionPolicy`` computes in ``dtype``): every
    parameter, which is what that policy's forward computes with (buffers such as RoPE's inverse
    frequencies stay as they are, as FSDP2 leaves them).
    """
    if dtype == torch.float32:
        return 0
    embed = getattr(model, "get_input_embeddings", lambda: None)()
    tied = getattr(embed, "weight", None)
    chosen: list[nn.Parameter] = []
    if whole:
        chosen = [p for p in model.parameters() if not p.requires_grad]
    else:
        for m in model.modules():
            params = list(m.parameters(recurse=False))
            if isinstance(m, nn.Linear) and params and not any(p.requires_grad for p in params):
                chosen += [p for p in params if p is not tied]
    saved = 0
    for p in chosen:
        if p.dtype != dtype and p.is_floating_point():
            saved += p.numel() * (p.element_size() - dtype.itemsize)
            p.data = p.data.to(dtype)
    return saved
