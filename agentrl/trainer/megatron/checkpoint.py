"""A Megatron run's checkpoint: the same HF directory as FSDP2's, plus each shard's optimizer state.

::

    path/config.json, model.safetensors      # the full model under HF names (rank 0 writes)
    path/megatron/tp{T}_pp{P}.pt             # optimizer (and value head) of tensor rank T, stage P
    path/trainer_state.pt                    # scheduler, update count, layout, the caller's extra
    path/agentrl_checkpoint.json

Every engine, ``agentrl eval`` and ``--model`` read the directory as any HF model. Resuming needs
the same ``--tp`` / ``--pp`` (the optimizer's moments are per shard; the weights alone load under
any layout). The first data-parallel replica writes the shard files (replicas hold equal states);
``trainer_state.pt`` is renamed into place after every rank has written, so a directory that has it
is complete.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from agentrl.trainer.errors import CheckpointError

if TYPE_CHECKING:
    from agentrl.trainer.megatron.backend import MegatronBackend

__all__ = ["HFDir", "load", "save", "save_hf"]


def _shard_file(path: Path, be: MegatronBackend) -> Path:
    return path / "megatron" / f"tp{be.g.tp_rank}_pp{be.g.pp_rank}.pt"


def save_hf(be: MegatronBackend, full: dict[str, torch.Tensor], path: str | Path) -> None:
    """``full`` (:meth:`MegatronBackend.state_dict`'s, rank 0) as an HF model directory at ``path``."""
    from safetensors.torch import save_file

    be.hf_config.save_pretrained(str(path))
    tensors = {k: v.contiguous() for k, v in full.items() if not (be.lay.tied and k == "lm_head.weight")}
    save_file(tensors, str(Path(path) / "model.safetensors"))


class HFDir:
    """Gathered weights that save like an HF model: what ``RUN_DIR/reference`` stores for a Megatron run."""

    def __init__(self, be: MegatronBackend, full: dict[str, torch.Tensor]) -> None:
        self.be, self.full = be, full

    def save_pretrained(self, path: str, safe_serialization: bool = True) -> None:
        save_hf(self.be, self.full, path)


def save(be: MegatronBackend, path: str | Path, extra: dict[str, Any] | None = None) -> None:
    path = Path(path)
    full = be.state_dict()
    if be.g.dp_rank == 0:
        _shard_file(path, be).parent.mkdir(parents=True, exist_ok=True)
        shard = {
            "optimizer": be.optimizer.state_dict(),
            "value_head": be.value_head.state_dict() if be.value_head is not None else None,
        }
        torch.save(shard, _shard_file(path, be))
    if be.rank == 0:
        save_hf(be, full, path)
    if be.world > 1:
        dist.barrier()
    if be.rank != 0:
        return
    state = {
        "scheduler": be.scheduler.state_dict(),
        "updates": be.updates,
        "layout": {"tp": be.lay.tp, "pp": be.lay.pp},
        "extra": extra or {},
    }
    tmp = path / "trainer_state.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path / "trainer_state.pt")
    (path / "agentrl_checkpoint.json").write_text(
        json.dumps({"updates": be.updates, **(extra or {}).get("meta", {})})
    )


def load(be: MegatronBackend, path: str | Path) -> dict[str, Any]:
    from agentrl.trainer.megatron.weights import SafetensorsWeights, load_stage

    path = Path(path)
    for f in (path / "model.safetensors", path / "trainer_state.pt", _shard_file(path, be)):
        if not f.exists():
            raise CheckpointError(
                f"checkpoint {str(path)!r} is incomplete for --backend megatron: {f.relative_to(path)} is missing"
            )
    state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
    saved = state.get("layout", {})
    if saved != {"tp": be.lay.tp, "pp": be.lay.pp}:
        raise CheckpointError(
            f"checkpoint {str(path)!r} was saved with --tp {saved.get('tp')} --pp {saved.get('pp')}; "
            f"resume it with the same (asked --tp {be.lay.tp} --pp {be.lay.pp}), or start a new run "
            "from its weights with --model"
        )
    load_stage(be.model, SafetensorsWeights(path), be.lay, be.g)  # this rank's tensors only, read lazily
    shard = torch.load(_shard_file(path, be), map_location="cpu", weights_only=False)
    be.optimizer.load_state_dict(shard["optimizer"])
    if be.value_head is not None and shard.get("value_head") is not None:
        be.value_head.load_state_dict(shard["value_head"])
    be.scheduler.load_state_dict(state["scheduler"])
    be.updates = int(state["updates"])
    return dict(state.get("extra") or {})
