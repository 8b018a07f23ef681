"""The trainer's optimizer and learning-rate schedule, one definition for every backend.

AdamW (betas 0.9 / 0.99, ``optim.weight_decay``) over the parameters that train, with a linear
warm-up over ``optim.warmup_steps`` updates; a caller's ``factory`` (tests: plain SGD) replaces
AdamW under the same schedule. A backend calls it again after the warm start (a fresh optimizer for RL).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from agentrl.trainer.config import OptimConfig

__all__ = ["Factory", "make_optimizer"]

Factory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


def make_optimizer(
    params: Iterable[nn.Parameter], optim: OptimConfig, factory: Factory | None = None
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """``(optimizer, scheduler)`` over ``params`` that require a gradient."""
    trained = [p for p in params if p.requires_grad]
    opt = (
        factory(trained)
        if factory is not None
        else torch.optim.AdamW(trained, lr=optim.lr, weight_decay=optim.weight_decay, betas=(0.9, 0.99))
    )
    warmup = optim.warmup_steps
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
    )
    return opt, schedule
