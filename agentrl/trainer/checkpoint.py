"""A backend's resumable checkpoint: an HF model directory plus the trainer's own state.

::

    save(be, path, extra)    # path/config.json, model.safetensors, trainer_state.pt, agentrl_checkpoint.json
    extra = load(be, path)   # weights, optimizer, scheduler, value head back; the saved ``extra``
    start_reference(be, run_dir, src, ...)  # the backend's KL reference; RUN_DIR/reference once per run
    store_reference(ref, run_dir, src)  # RUN_DIR/reference once per run (a KL run); checkpoints name it
    reference_of(path, extra)           # where a checkpoint's reference is; refuses when it has none
    load_reference(ref_dir, like=model) # that reference, checked against the policy's parameters

``trainer_state.pt`` (optimizer, scheduler, update count, value head, the caller's ``extra``) is
written to a temporary name and renamed into place last, so a directory that has it is complete.
When the backend is sharded, saving gathers the full weights and optimizer state (a collective:
every rank calls it) and rank 0 writes; loading sets each rank's shards from the full state.

The KL penalty's reference is the policy RL started from (after the warm start, before the
first update), not any checkpoint's weights. A run with ``kl_coef > 0`` writes it once, as an
HF directory ``RUN_DIR/reference`` (fp32, the size of one ``model.safetensors``), and each
checkpoint names it by a path relative to itself (``extra["reference"]``, ``../../reference``),
so checkpoints cost no extra bytes. A run resumed into another run directory hard-links the
files there (a copy where the file system cannot link), so its own checkpoints resume too.
Every rank reads the reference from the shared run directory, as it reads the checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from agentrl.trainer.errors import CheckpointError

if TYPE_CHECKING:
    from agentrl.trainer.backend import FSDP2Backend

__all__ = [
    "REFERENCE",
    "adapter_reference",
    "load",
    "load_reference",
    "reference_of",
    "save",
    "store_reference",
]

REFERENCE = "reference"
"""the run directory's HF directory of the KL reference (the policy RL started from)"""


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
    if be.lora:  # the adapter alone, in PEFT's format: PeftModel.from_pretrained(base, path) loads it
        _save_adapter(be.model, path, full)
    elif save_pretrained is None:
        raise CheckpointError(f"{type(be.model).__name__} has no save_pretrained; need an HF model")
    else:
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
    st_file = path / ("adapter_model.safetensors" if be.lora else "model.safetensors")
    state_file = path / "trainer_state.pt"
    for f in (st_file, state_file):
        if not f.exists():
            why = " (a --lora-rank run resumes from a LoRA checkpoint)" if be.lora else ""
            raise CheckpointError(f"checkpoint {str(path)!r} is incomplete: {f.name} is missing{why}")
    weights = _adapter_weights(be.model, path) if be.lora else load_file(str(st_file))
    state = torch.load(state_file, map_location="cpu", weights_only=False)
    if be.sharded:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        # with LoRA the adapter alone (strict=False: the frozen base is the model's own)
        opts = StateDictOptions(full_state_dict=True, strict=not be.lora)
        set_model_state_dict(be.model, dict(weights.items()), options=opts)
        set_optimizer_state_dict(be.model, be.optimizer, state["optimizer"], options=opts)
    elif be.lora:  # names and shapes checked by _adapter_weights
        be.model.load_state_dict(weights, strict=False)
        be.optimizer.load_state_dict(state["optimizer"])
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


def _save_adapter(model: torch.nn.Module, path: Path, tensors: dict[str, torch.Tensor]) -> None:
    from agentrl.models.lora import lora_base, lora_spec, save_adapter

    spec = lora_spec(model)
    assert spec is not None
    save_adapter(path, tensors, spec, base=lora_base(model))


def _adapter_weights(model: torch.nn.Module, path: Path) -> dict[str, torch.Tensor]:
    """A saved adapter's tensors, refused unless they fit ``model``'s adapter (:class:`CheckpointError`)."""
    from agentrl.models.lora import LoraError, check_adapter_fits, read_adapter

    try:
        spec, tensors, base = read_adapter(path)
        check_adapter_fits(model, tensors, str(path), base, spec)
    except LoraError as e:
        raise CheckpointError(f"checkpoint {str(path)!r}: {e}") from None
    return tensors


def adapter_reference(be: FSDP2Backend, run_dir: Path, src: Path | None, *, main: bool) -> Path:
    """LoRA's KL reference (``RUN_DIR/reference``, a PEFT adapter directory): the adapter RL started
    from (``src``'s on a resume), set on ``be``; a collective when sharded (every rank calls it)."""
    tensors = _adapter_weights(be.model, src) if src is not None else be.state_dict(all_ranks=True)
    be.set_reference_adapter(tensors)
    dest = Path(run_dir) / REFERENCE
    if main and not (src is not None and dest.exists() and dest.resolve() == Path(src).resolve()):
        tmp = dest.with_name(REFERENCE + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        _save_adapter(be.model, tmp, {k: v.cpu() for k, v in tensors.items()})
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    return dest


def store_reference(ref: Any, run_dir: Path, src: Path | None = None) -> Path:
    """``RUN_DIR/reference``: the reference ``ref`` saved (a fresh run), or ``src``'s files linked.

    Rank 0 only. Written under a temporary name and renamed into place, so a directory that
    exists is complete; a resumed run whose reference already is this directory writes nothing.
    """
    dest = Path(run_dir) / REFERENCE
    if src is not None and dest.exists() and dest.resolve() == Path(src).resolve():
        return dest
    tmp = dest.with_name(REFERENCE + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if src is None:
        ref.save_pretrained(str(tmp), safe_serialization=True)
    else:
        shutil.copytree(src, tmp, copy_function=_link_or_copy)
    shutil.rmtree(dest, ignore_errors=True)  # a fresh run in a used run directory replaces the old one
    os.replace(tmp, dest)
    return dest


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or one without hard links
        shutil.copy2(src, dst)


def reference_of(path: str | Path, extra: dict[str, Any]) -> Path:
    """The reference directory a checkpoint names (:func:`store_reference`); refuses when there is none.

    A checkpoint without one (its run had ``kl_coef = 0``, or an older version wrote it) falls
    back to ``RUN_DIR/reference`` beside its ``checkpoints/`` if a user put one there. There is
    no silent fallback to the checkpoint's own weights: that would anchor the KL penalty to a
    policy already trained, a different objective than the run's.
    """
    path = Path(path)
    named = extra.get("reference")
    ref = path / named if named else path.parent.parent / REFERENCE
    if (ref / "config.json").exists() or (ref / "adapter_config.json").exists():
        return ref
    if named:
        raise CheckpointError(
            f"checkpoint {str(path)!r} names its KL reference {named!r}, but {str(ref)!r} is missing; "
            f"copy the run directory's {REFERENCE}/ back beside its checkpoints/"
        )
    raise CheckpointError(
        f"checkpoint {str(path)!r} stores no KL reference (it was written with kl_coef = 0, or by a "
        f"version that did not store one) and {str(ref)!r} does not exist; kl_coef > 0 needs the policy "
        f"RL started from: put it there as a Hugging Face model directory (the base model's when the run "
        f"had no SFT warm start), or start the run over"
    )


def start_reference(be: Any, run_dir: Path, src: Path | None, *, model: str, like: torch.nn.Module,
                    main: bool) -> Path:  # fmt: skip
    """Give ``be`` its KL reference (full weights): the policy as it is now (a fresh run, ``src`` None) or
    the stored reference ``src`` (a resumed run); rank 0 keeps it as ``RUN_DIR/reference``, returned.

    A backend that cuts the reference from its own slices (``freeze_reference``: Megatron) does, so no
    rank holds a full copy of the model; any other gets a full fp32 copy on every rank, which it places.
    """
    freeze = getattr(be, "freeze_reference", None)
    if freeze is not None:
        ref = freeze(src)  # a collective (every rank)
    elif src is not None:
        ref = load_reference(src, like=like)
    else:
        from agentrl.models import load_model, resolve

        ref = load_model(resolve(model)).float()
        ref.load_state_dict(be.state_dict(all_ranks=True))
    if main:
        store_reference(ref, run_dir, src)
    if freeze is None:
        be.set_reference(ref)
    return Path(run_dir) / REFERENCE


def load_reference(path: Path, like: torch.nn.Module) -> Any:
    """The stored reference (fp32), refused unless its parameters are ``like``'s (names and shapes)."""
    from agentrl.models import load_model

    ref = load_model(path).float()
    want = {k: tuple(v.shape) for k, v in like.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    if got != want:
        diff = sorted(set(want.items()) ^ set(got.items()))[:3]
        raise CheckpointError(
            f"KL reference {str(path)!r} does not match the policy's parameters (first differences: "
            f"{diff}); it must be the policy this run started RL from"
        )
    return ref
