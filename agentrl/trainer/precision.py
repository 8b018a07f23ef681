"""The update's compute precision (``--precision``): bf16 compute over float32 weights, or float32.

``bf16`` runs the forward (and so the backward) of the trainer's model in bfloat16 under
``torch.autocast``, while everything that accumulates stays float32: the parameters (the master
weights), their gradients, the optimizer's state, the logprobs (:mod:`agentrl.trainer.forward`
casts the bf16 logits to float32 before the softmax) and the losses' reductions. Under FSDP2
sharding the same knob sets ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``
instead of autocast. ``auto`` is bf16 on CUDA and float32 on CPU, where bf16 matmuls are several
times slower without AMX.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from agentrl.trainer.errors import BackendError

__all__ = ["PRECISIONS", "autocast", "compute_dtype"]

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
