"""What Megatron-core 0.16 needs to run on a CPU, applied only when there is no CUDA.

Megatron-core is written for CUDA; its local (non-Transformer-Engine) layers run on a CPU over gloo
once the model is built with ``use_cpu_initialization`` and the fused kernels off
(:func:`agentrl.trainer.megatron.model.build`), except for three calls, each worked around here:

* **The CUDA RNG tracker.** Attention and MLP dropout run inside
  ``get_cuda_rng_tracker().fork()`` (megatron/core/tensor_parallel/random.py,
  ``CudaRNGStatesTracker.fork``), which reads and sets the CUDA generator's state, and
  ``model_parallel_cuda_manual_seed`` that would seed it calls ``torch.cuda.manual_seed``. Megatron's
  own inference tracker (same file, ``InferenceCudaRNGStatesTracker.fork`` returns a
  ``contextlib.nullcontext()``) is installed instead: agentrl builds every model with dropout 0
  (RL scores the tokens an engine sampled without dropout), so no random draw happens in a fork.
* **The RoPE table.** ``RotaryEmbedding.get_emb`` (megatron/core/models/common/embeddings/
  rotary_pos_embedding.py) moves ``inv_freq`` to ``torch.cuda.current_device()`` on its first call.
  :func:`rope_table` computes the same table (``cat(freqs, freqs)``, ``freqs = outer(0..S-1,
  inv_freq)``: non-interleaved, full rotary, no interpolation, as :mod:`.model` builds it) on the
  CPU, and calls Megatron's own module when CUDA is there.
* **The attention scores' buffer.** ``DotProductAttention.forward`` (megatron/core/transformer/
  dot_product_attention.py) takes its ``baddbmm`` input from ``parallel_state``'s global memory
  buffer, whose ``GlobalMemoryBuffer.get_tensor`` (megatron/core/utils.py) allocates with
  ``device=torch.cuda.current_device()``. The buffer is replaced by :class:`_HostBuffer`, the same
  buffer on the host (``initialize_model_parallel`` creates it; :func:`apply_cpu_shims` runs after).

Two more CUDA calls are not reached at all rather than shimmed: the default causal mask
(``get_default_causal_mask`` in megatron/core/transformer/utils.py builds it on CUDA; :mod:`.model`
passes its own) and the tied embedding's initial all-reduce across stages (``weight.data.cuda()``
in ``LanguageModule.setup_embeddings_and_output_layer``; on a CPU the last stage builds its own
output layer, loaded from the same embedding and kept equal by summing the two gradients).

The pipeline schedule is agentrl's own (:mod:`.schedule`): Megatron's allocates its token counter
with ``device="cuda"`` (megatron/core/pipeline_parallel/schedules.py, ``forward_backward_no_pipelining``
and both pipelined schedules) and its p2p buffers with ``torch.cuda.current_device()``
(pipeline_parallel/p2p_communication.py), which no shim can redirect without patching torch itself.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["apply_cpu_shims", "rope_table"]


def apply_cpu_shims() -> bool:
    """Install the CPU shims when CUDA is absent (idempotent; after Megatron's parallel state is
    initialised); returns whether they apply."""
    if torch.cuda.is_available():
        return False
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import random as mrandom

    if not getattr(mrandom, "_CUDA_RNG_STATE_TRACKER_INITIALIZED", False):
        mrandom.initialize_rng_tracker(inference_rng_tracker=True)
    if not isinstance(ps._GLOBAL_MEMORY_BUFFER, _HostBuffer):
        ps._GLOBAL_MEMORY_BUFFER = _HostBuffer()
    return True


class _HostBuffer:
    """``GlobalMemoryBuffer`` on the host: one reusable tensor per ``(name, dtype)``."""

    def __init__(self) -> None:
        self.buffer: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def get_tensor(
        self, shape: tuple[int, ...], dtype: torch.dtype, name: str, mem_alloc_context: object = None
    ) -> torch.Tensor:
        n = math.prod(shape)
        buf = self.buffer.get((name, dtype))
        if buf is None or buf.numel() < n:
            buf = self.buffer[(name, dtype)] = torch.empty(n, dtype=dtype)
        return buf[:n].view(*shape)


def rope_table(model: Any, seq_len: int) -> torch.Tensor:
    """The rotary embedding ``(S, 1, 1, head_dim)`` of positions ``0..seq_len-1`` for ``model``'s decoder."""
    rope = model.rotary_pos_emb
    if torch.cuda.is_available():
        return rope(seq_len)
    inv_freq = rope.inv_freq
    freqs = torch.outer(torch.arange(seq_len, device=inv_freq.device, dtype=inv_freq.dtype), inv_freq)
    return torch.cat((freqs, freqs), dim=-1)[:, None, None, :]
