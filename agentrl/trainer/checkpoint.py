"""A backend's resumable checkpoint: an HF model directory plus the trainer's own state.

::

    save(be, path, extra)    # path/config.json, model.safetensors, trainer_state.pt, agentrl_checkpoint.json
    extra = load(be, path)   # weights, optimizer, scheduler, value head back; the saved ``extra``

``trainer_state.pt`` (optimizer, scheduler, update count, value head, the caller's ``extra``) is
written to a temporary name and renamed into place last, so a directory that has it is complete.
When the backend is sharded, saving gathers the full weights and optimizer state (a collective:
every rank calls it) and rank 0 writes; loading sets each rank's shards from the full state.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from agentrl.trainer.errors import CheckpointError

if TYPE_CHECKING:
    from agentrl.trainer.backend import FSDP2Backend

__all__ = ["load", "save"]


def save(be: FSDP2Backend, path: str | Path, extra: dict[str, Any] | None = None) -> None:
    """An HF directory (``config.json`` + ``model.safetensors``) plus ``trainer_state.pt``."""
    path = Path(path)
    full = be.state_dict()
    optim_state = _optim_state(be)
    if be.rank != 0:
        return
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / "trainer_state.pt.tmp"
    save_pretrained = getattr(be.model, "save_pretrained", None)
    if save_pretrained is None:
        raise CheckpointError(f"{type(be.model).__name__} has no save_pretrained; need an HF model")
    save_pretrained(str(path), state_dict=full, safe_serialization=True)
    state = {
        "optimizer": optim_state,
        "scheduler": be.scheduler.state_dict(),
        "updates": be.updates,
        "value_head": be.value_head.state_dict() if be.value_head is not None else None,
        "extra": extra or {},
    }
    torch.save(state, tmp)
    os.replace(tmp, path / "trainer_state.pt")
    (path / "agentrl_checkpoint.json").write_text(
        json.dumps({"updates": be.updates, **(extra or {}).get("meta", {})})
    )


def _optim_state(be: FSDP2Backend) -> dict[str, Any]:
    if not be.sharded:
        return be.optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(
        be.model, be.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )


def load(be: FSDP2Backend, path: str | Path) -> dict[str, Any]:
    """Restore weights, optimizer, scheduler and value head from :func:`save`; returns ``extra``."""
    from safetensors.torch import load_file

    path = Path(path)
    st_file, state_file = path / "model.safetensors", path / "trainer_state.pt"
    for f in (st_file, state_file):
        if not f.exists():
            raise CheckpointError(f"checkpoint {str(path)!r} is incomplete: {f.name} is missing")
    weights = load_file(str(st_file))
    state = torch.load(state_file, map_location="cpu", weights_only=False)
    if be.sharded:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True)
        set_model_state_dict(be.model, dict(weights.items()), options=opts)
        set_optimizer_state_dict(be.model, be.optimizer, state["optimizer"], options=opts)
    else:
        own = be.model.state_dict()
        missing = [k for k in own if k not in weights]
        # tied embeddings are saved once; fill them from their twin
        for k in missing:
            if k == "lm_head.weight" and "model.embed_tokens.weight" in weights:
                weights[k] = weights["model.embed_tokens.weight"]
        try:
            be.model.load_state_dict(weights, strict=True)
        except RuntimeError as e:
            raise CheckpointError(f"checkpoint {str(path)!r} does not match the model: {e}") from e
        be.optimizer.load_state_dict(state["optimizer"])
    be.scheduler.load_state_dict(state["scheduler"])
    be.updates = int(state["updates"])
    if be.value_head is not None and state.get("value_head") is not None:
        be.value_head.load_state_dict(state["value_head"])
    return dict(state.get("extra") or {})
