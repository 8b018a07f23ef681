"""The pipeline schedule: micro-batches through the stages, one-forward-one-backward.

Every rank of a pipeline holds the same micro-batches (the backend gives the whole model-parallel
group the same rows), so each stage knows every message's shape without asking: the hidden states
of micro-batch ``i`` are ``shapes[i] = (S, B, H)``. Stage ``s`` receives them from stage ``s - 1``,
runs its layers and sends its output to ``s + 1``; in backward the gradients flow the other way.

Training runs the non-interleaved 1F1B order (Megatron's and PipeDream-Flush's): stage ``s`` first
runs ``pp - s - 1`` forwards, then alternates one forward and one backward, then drains the
backwards, so it keeps at most ``pp - s`` micro-batches' activations instead of all of them.
Sends are non-blocking (waited at the end); receives block, each bounded by the process group's
timeout (:func:`agentrl.trainer.distributed.init_distributed`). With one stage this is plain
gradient accumulation.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Pipe", "run"]


class Pipe:
    """This rank's place in its pipeline: the global ranks of the previous and next stages."""

    def __init__(self, stage: int, stages: int, prev_rank: int | None, next_rank: int | None) -> None:
        self.stage, self.stages = stage, stages
        self.prev_rank, self.next_rank = prev_rank, next_rank
        self.first, self.last = stage == 0, stage == stages - 1
        self._pending: list[tuple[Any, torch.Tensor]] = []

    def send(self, t: torch.Tensor, dst: int | None) -> None:
        assert dst is not None
        t = t.detach().contiguous()
        self._pending.append((dist.isend(t, dst), t))  # keep t alive until the send completes

    def recv(
        self, shape: Sequence[int], dtype: torch.dtype, device: torch.device, src: int | None
    ) -> torch.Tensor:
        assert src is not None
        t = torch.empty(tuple(shape), dtype=dtype, device=device)
        work = dist.irecv(t, src)
        if work is not None:  # None only for a rank outside the default group
            work.wait()
        return t

    def flush(self) -> None:
        for work, _ in self._pending:
            if work is not None:
                work.wait()
        self._pending.clear()


def run(
    pipe: Pipe,
    shapes: Sequence[Sequence[int]],
    forward: Callable[[int, torch.Tensor | None], torch.Tensor | None],
    *,
    train: bool,
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    """Run ``len(shapes)`` micro-batches through the pipeline.

    ``forward(i, hidden_in)`` runs this stage on micro-batch ``i`` (``hidden_in`` is None on the
    first stage) and returns the hidden states to send on, or, on the last stage, the micro-batch's
    scalar loss (``train``) or None (scoring: the closure keeps what it needs).
    """
    n = len(shapes)
    inputs: deque[torch.Tensor | None] = deque()
    outputs: deque[torch.Tensor | None] = deque()

    def fwd(i: int) -> None:
        x = None
        if not pipe.first:
            x = pipe.recv(shapes[i], dtype, device, pipe.prev_rank).requires_grad_(train)
        y = forward(i, x)
        if not pipe.last:
            assert y is not None
            pipe.send(y.to(dtype), pipe.next_rank)
        if train:
            inputs.append(x)
            outputs.append(y)

    def bwd(i: int) -> None:
        x, y = inputs.popleft(), outputs.popleft()
        assert y is not None
        if pipe.last:
            y.backward()
        else:
            y.backward(pipe.recv(y.shape, y.dtype, device, pipe.next_rank))
        if not pipe.first:
            assert x is not None and x.grad is not None
            pipe.send(x.grad, pipe.prev_rank)

    try:
        if not train:
            for i in range(n):
                with torch.no_grad():
                    fwd(i)
            return
        warmup = min(pipe.stages - pipe.stage - 1, n)
        for i in range(warmup):
            fwd(i)
        for i in range(warmup, n):
            fwd(i)
            bwd(i - warmup)
        for i in range(n - warmup, n):
            bwd(i)
    finally:
        pipe.flush()
