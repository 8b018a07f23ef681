"""Weights between the ranks of a Megatron run: HF tensors in, full HF tensors out.

* :func:`load_stage` copies this rank's shard (:func:`~.convert.hf_to_stage`) of full HF weights into
  its stage, checking that every parameter is covered and every shape matches.
* :func:`gather_hf` is the inverse, what weight sync and checkpoints need: each tensor-parallel group
  all-gathers its stage's shards (one collective per tensor), converts them to HF names
  (:func:`~.convert.stage_to_hf`), and each stage broadcasts its tensors along the pipeline, one
  tensor at a time, so that every rank of the pipeline ends with the whole model and no rank ever
  holds more than the model plus one stage's shards. The names, shapes and dtypes each stage sends
  are exchanged once and cached (they never change during a run).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from agentrl.trainer.errors import BackendError
from agentrl.trainer.megatron.convert import hf_to_stage, stage_to_hf
from agentrl.trainer.megatron.model import Layout

__all__ = ["Groups", "gather_hf", "load_stage", "parameters_of"]


class Groups:
    """This rank's coordinates and process groups (Megatron's ``parallel_state``)."""

    def __init__(self) -> None:
        from megatron.core import parallel_state as ps

        self.tp_rank, self.tp = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
        self.pp_rank, self.pp = (
            ps.get_pipeline_model_parallel_rank(),
            ps.get_pipeline_model_parallel_world_size(),
        )
        self.dp_rank, self.dp = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.pp_group = ps.get_pipeline_model_parallel_group()
        self.dp_group = ps.get_data_parallel_group()
        self.mp_group = ps.get_model_parallel_group()
        self.pp_ranks = [dist.get_global_rank(self.pp_group, i) for i in range(self.pp)]
        self.mp = self.tp * self.pp
        self.embedding_group = ps.get_embedding_group() if self.pp > 1 else None


def parameters_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """The stage's tensors by Megatron name (no ``_extra_state`` entries)."""
    return {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}


@torch.no_grad()
def load_stage(model: nn.Module, hf: dict[str, torch.Tensor], lay: Layout, g: Groups) -> None:
    """Copy this rank's shard of the full HF weights ``hf`` into ``model`` (its stage)."""
    shard = hf_to_stage(hf, lay, g.tp_rank, g.pp_rank)
    own = dict(model.named_parameters())
    missing = sorted(set(own) - set(shard))
    extra = sorted(set(shard) - set(own))
    if missing or extra:
        raise BackendError(
            f"the HF weights do not cover the Megatron stage: missing {missing[:4]}, unexpected {extra[:4]}"
        )
    for name, p in own.items():
        src = shard[name]
        if src.shape != p.shape:
            raise BackendError(
                f"{name}: the HF weights give shape {tuple(src.shape)}, the stage has {tuple(p.shape)}"
            )
        p.copy_(src)


@torch.no_grad()
def gather_hf(model: nn.Module, lay: Layout, g: Groups, *, device: torch.device) -> dict[str, torch.Tensor]:
    """The full model under HF names on every rank of this rank's pipeline (a collective over the
    tensor- and pipeline-parallel groups; data-parallel replicas each gather their own)."""
    local = parameters_of(model)
    if g.tp > 1:
        parts: list[dict[str, torch.Tensor]] = [{} for _ in range(g.tp)]
        for name, t in local.items():
            t = t.detach().to(device).contiguous()
            got = [torch.empty_like(t) for _ in range(g.tp)]
            dist.all_gather(got, t, group=g.tp_group)
            for r in range(g.tp):
                parts[r][name] = got[r]
    else:
        parts = [{k: v.detach().to(device) for k, v in local.items()}]
    mine = stage_to_hf(parts, lay, g.pp_rank)
    if g.pp == 1:
        return {k: v.cpu() for k, v in mine.items()}
    meta: list[Any] | None = getattr(model, "_agentrl_stage_meta", None)
    if meta is None:  # each stage's (name, shape, dtype), once per model
        meta = [None] * g.pp
        dist.all_gather_object(
            meta, [(k, tuple(v.shape), v.dtype) for k, v in mine.items()], group=g.pp_group
        )
        setattr(model, "_agentrl_stage_meta", meta)  # noqa: B010 - a module attribute, not a submodule
    out: dict[str, torch.Tensor] = {}
    for stage, entries in enumerate(meta):
        for name, shape, dtype in entries:
            t = mine[name] if stage == g.pp_rank else torch.empty(shape, dtype=dtype, device=device)
            dist.broadcast(t, src=g.pp_ranks[stage], group=g.pp_group)
            out[name] = t.cpu()
    return out
