"""Weights between the ranks of a Megatron run: HF tensors in, full HF tensors out.

* :func:`load_stage` copies this rank's shard (:func:`~.convert.hf_to_stage`) of full HF weights into
  its stage, checking that every parameter is covered and every shape matches.
* :class:`SafetensorsWeights` reads a Hugging Face directory's tensors one at a time as they are
  asked for, so a rank loads its shard without ever holding the whole model.
* :func:`gather_hf` is the inverse, what weight sync and checkpoints need: each tensor-parallel group
  all-gathers its stage's shards (one collective per tensor), converts them to HF names
  (:func:`~.convert.stage_to_hf`), and each stage broadcasts its tensors along the pipeline, one
  tensor at a time, so that every rank of the pipeline ends with the whole model and no rank ever
  holds more than the model plus one stage's shards. The names, shapes and dtypes each stage sends
  are exchanged once and cached (they never change during a run).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from agentrl.trainer.errors import BackendError
from agentrl.trainer.megatron.convert import hf_to_stage, stage_to_hf
from agentrl.trainer.megatron.model import Layout

__all__ = ["Groups", "SafetensorsWeights", "gather_hf", "lazy_policy", "load_stage", "parameters_of"]


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


class SafetensorsWeights(Mapping[str, torch.Tensor]):
    """The tensors of a Hugging Face model directory (``model.safetensors``, or the shards its
    ``model.safetensors.index.json`` maps), each read from disk as float32 when it is asked for."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            self.files: dict[str, str] = dict(json.loads(index.read_text())["weight_map"])
        elif (self.path / "model.safetensors").is_file():
            from safetensors import safe_open

            with safe_open(str(self.path / "model.safetensors"), framework="pt") as f:
                self.files = dict.fromkeys(f.keys(), "model.safetensors")
        else:
            raise BackendError(
                f"{str(self.path)!r} has no model.safetensors nor model.safetensors.index.json; "
                "save the model with safe_serialization=True"
            )

    @classmethod
    def available(cls, path: str | Path) -> bool:
        p = Path(path)
        return (p / "model.safetensors.index.json").is_file() or (p / "model.safetensors").is_file()

    def __getitem__(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        # opened per read (a header parse): no file stays mapped once the stage holds its copy
        with safe_open(str(self.path / self.files[name]), framework="pt") as f:
            return f.get_tensor(name).float()

    def __iter__(self) -> Iterator[str]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)


def lazy_policy(path: str | Path) -> tuple[Any, SafetensorsWeights] | None:
    """The HF model at ``path`` on the meta device (its config, names and shapes) and its tensors, read
    as they are asked for; None when ``path`` holds no safetensors (load it whole then)."""
    if not SafetensorsWeights.available(path):
        return None
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), torch_dtype=torch.float32)
    return model, SafetensorsWeights(path)


def parameters_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """The stage's tensors by Megatron name (no ``_extra_state`` entries)."""
    return {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}


@torch.no_grad()
def load_stage(model: nn.Module, hf: Mapping[str, torch.Tensor], lay: Layout, g: Groups) -> None:
    """Copy this rank's shard of the full HF weights ``hf`` (a dict, or read lazily) into ``model``,
    each tensor as it is cut (never the whole shard beside the stage); a name the stage does not
    have, a shape it does not match, or a parameter left uncovered is refused, naming it."""
    own = dict(model.named_parameters())
    done: set[str] = set()

    def put(name: str, src: torch.Tensor) -> None:
        p = own.get(name)
        if p is None:
            raise BackendError(f"the HF weights give {name!r}, which the Megatron stage does not have")
        if src.shape != p.shape:
            raise BackendError(
                f"{name}: the HF weights give shape {tuple(src.shape)}, the stage has {tuple(p.shape)}"
            )
        p.copy_(src)
        done.add(name)

    hf_to_stage(hf, lay, g.tp_rank, g.pp_rank, sink=put)
    missing = sorted(set(own) - done)
    if missing:
        raise BackendError(f"the HF weights do not cover the Megatron stage: missing {missing[:4]}")


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
