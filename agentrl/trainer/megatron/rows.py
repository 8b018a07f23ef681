"""One replica's rows: every rank of a model-parallel group computes on the union of their rollouts.

The loop hands each rank its own rows (its share of the step's tasks, as under FSDP2). Tensor- and
pipeline-parallel ranks of one replica must run the same rows, so :func:`gather` all-gathers the
group's batches (right-padded to the longest row) into one, in group-rank order, and returns the
:class:`Share` that cuts a per-row result back to this rank's own rows. The rollout store's
per-row capture (the backend's ``capture``) is computed on the last stage for the whole replica and
handed back the same way (:func:`distribute_capture`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from agentrl.trainer.batch import TrainBatch

__all__ = ["Share", "capture", "distribute_capture", "gather"]


@dataclass
class Share:
    whole: TrainBatch
    offset: int  # this rank's first row in ``whole``
    rows: int
    cols: int
    row_ids: list[int] | None  # this rank's own ``row_ids`` (what its capture is keyed by)

    def mine(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's rows (and columns) of a ``(B_whole, T_whole)`` result."""
        return t[self.offset : self.offset + self.rows, : self.cols]


def _pad(t: torch.Tensor, T: int) -> torch.Tensor:
    if t.dim() < 2 or t.shape[1] == T:
        return t
    return torch.cat([t, t.new_zeros(t.shape[0], T - t.shape[1], *t.shape[2:])], dim=1)


def _cat(batches: list[TrainBatch]) -> TrainBatch:
    T = max(b.input_ids.shape[1] for b in batches)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(TrainBatch):
        vals = [getattr(b, f.name) for b in batches]
        if any(v is None for v in vals):
            fields[f.name] = None
            continue
        pad = T if vals[0].dim() >= 2 and vals[0].shape[1] == batches[0].input_ids.shape[1] else None
        fields[f.name] = torch.cat([_pad(v, T) if pad else v for v in vals])
    return TrainBatch(**fields)


def gather(batch: TrainBatch, g: Any) -> Share:
    """The replica's rows (every rank of the model-parallel group the same) and this rank's share."""
    ids = None if batch.row_ids is None else batch.row_ids[:, 0].tolist()
    if g.mp == 1:
        whole = dataclasses.replace(batch, row_ids=torch.arange(len(batch))[:, None])
        return Share(whole, 0, len(batch), batch.input_ids.shape[1], ids)
    parts: list[Any] = [None] * g.mp
    dist.all_gather_object(parts, batch.to("cpu"), group=g.mp_group)
    me = dist.get_rank(g.mp_group)
    offset = sum(len(p) for p in parts[:me])
    whole = _cat(parts)
    whole.row_ids = torch.arange(len(whole))[:, None]
    return Share(whole, offset, len(batch), batch.input_ids.shape[1], ids)


def capture(into: dict[int, Any], mb: TrainBatch, logp: torch.Tensor, ent: torch.Tensor | None) -> None:
    """Each row's sampled positions, logprobs and entropies, the first time the update scores it
    (keyed by the row's index in the replica's batch)."""
    assert mb.row_ids is not None
    sampled = mb.loss_mask[:, 1:] > 0
    lp = logp.detach().float().cpu()
    en = ent.detach().float().cpu() if ent is not None else torch.zeros_like(lp)
    for b, rid in enumerate(mb.row_ids[:, 0].tolist()):
        if rid in into:
            continue
        cols = sampled[b].nonzero().squeeze(-1).cpu()
        into[rid] = ((cols + 1).tolist(), lp[b, cols].tolist(), en[b, cols].tolist())


def distribute_capture(found: dict[int, Any], share: Share, g: Any, last_rank: int) -> dict[int, Any]:
    """The last stage's ``found`` (whole-batch indices) as this rank's capture (its own ``row_ids``)."""
    if g.pp > 1:
        box = [found]
        dist.broadcast_object_list(box, src=last_rank, group=g.pp_group)
        found = box[0]
    if share.row_ids is None:
        return {}
    return {rid: found[share.offset + j] for j, rid in enumerate(share.row_ids) if share.offset + j in found}
