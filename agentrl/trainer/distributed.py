"""Data-parallel ranks of one training run under ``torchrun``.

Every rank holds a full engine and rolls out its share of the step's tasks
(``seeds[rank::world]``); the finished groups are gathered so that every rank
computes the same advantages over the whole batch; each rank then trains on its
rows (``rows[rank::world]``) of that batch through the sharded FSDP2 backend,
whose loss is normalised by global counts, so the update equals the one-rank
update. The full weights are gathered to every rank and copied into its engine.
Only rank 0 writes the run directory, logs and checkpoints.

Every collective here runs on the process group created by
:func:`agentrl.trainer.backend.init_distributed`, whose timeout bounds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

__all__ = ["Ranks"]

T = TypeVar("T")


@dataclass(frozen=True)
class Ranks:
    """This process's place among the data-parallel ranks (``world == 1``: no collectives at all)."""

    rank: int = 0
    world: int = 1

    @classmethod
    def current(cls) -> Ranks:
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @property
    def main(self) -> bool:
        return self.rank == 0

    def shard(self, items: Sequence[T]) -> list[T]:
        """This rank's strided share of ``items``."""
        return list(items[self.rank :: self.world])

    def gather(self, obj: Any) -> list[Any]:
        """``obj`` of every rank, in rank order (pickled; meant for rollout results, not tensors)."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_sum(self, values: Sequence[float]) -> list[float]:
        if self.world == 1:
            return list(values)
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"  # NCCL reduces device tensors only
        t = torch.tensor(list(values), dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return [float(x) for x in t.cpu().tolist()]

    def barrier(self) -> None:
        """Wait for every rank (bounded by the group's timeout)."""
        if self.world > 1:
            self.all_sum([0.0])

    def any(self, flag: bool) -> bool:
        """True on every rank when it is true on some rank."""
        return self.all_sum([float(flag)])[0] > 0
