"""The trainer's side of LoRA (``--lora-rank``): the adapter's full tensors, and the KL reference.

::

    sd = adapter_weights(model, all_ranks=True)  # the adapter only, gathered when FSDP2 shards it
    ref = AdapterReference(model, sd)             # the adapter RL started from, frozen (None: the base)
    with ref.active(model):                       # the model computes the reference policy inside
        ...

The reference needs no second copy of the model: it is the same base under a frozen copy of the
adapter (megabytes), swapped in for the reference's forward and back out after it. A run without
a warm start begins RL from the base (the adapter's ``B`` is zero), so its reference is the base
with the adapter switched off.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch
import torch.distributed as dist
from torch import nn

from agentrl.models.lora import adapter_state_dict, adapters_disabled, is_lora
from agentrl.trainer.errors import BackendError

__all__ = ["AdapterReference", "adapter_weights", "base_nbytes", "is_lora"]


def adapter_weights(model: nn.Module, all_ranks: bool = False) -> dict[str, torch.Tensor]:
    """The adapter's tensors, whole, named as the model names them (``...lora_A.default.weight``).

    When FSDP2 shards the model this gathers each one (a collective: every rank calls it); like
    :meth:`~agentrl.trainer.backend.FSDP2Backend.state_dict`, only rank 0 gets them (on CPU) unless
    ``all_ranks``.
    """
    out: dict[str, torch.Tensor] = {}
    rank = dist.get_rank() if dist.is_initialized() else 0
    for name, t in adapter_state_dict(model).items():
        full = getattr(t, "full_tensor", None)
        if full is None:
            out[name] = t
            continue
        whole = full()
        if all_ranks:
            out[name] = whole
        elif rank == 0:
            out[name] = whole.cpu()
    return out


def base_nbytes(model: nn.Module) -> int:
    """What a full weight sync of ``model``'s base would push: every parameter but the adapter's (tied
    ones once; whole sizes, also when FSDP2 shards them)."""
    lora = set(adapter_state_dict(model))
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if n not in lora)


class AdapterReference:
    """The KL reference of a LoRA run: ``model``'s base under ``tensors`` (the adapter RL started from).

    ``tensors`` are whole (as :func:`adapter_weights` gives them); they are kept distributed like the
    parameters they replace. None, or an adapter whose ``B`` are all zero: the base alone.
    """

    def __init__(self, model: nn.Module, tensors: Mapping[str, torch.Tensor] | None) -> None:
        names = set(adapter_state_dict(model))
        params = {n: p for n, p in model.named_parameters() if n in names}
        self._saved: dict[str, torch.Tensor] | None = None
        if tensors is None or all(not bool(t.any()) for n, t in tensors.items() if ".lora_B." in n):
            return
        if set(tensors) != set(params):
            raise BackendError(
                f"the reference adapter names {len(tensors)} tensors, the policy's adapter {len(params)}; "
                f"first differences: {sorted(set(tensors) ^ set(params))[:3]}"
            )
        self._saved = {n: _placed_like(p, tensors[n]) for n, p in params.items()}

    @property
    def is_base(self) -> bool:
        return self._saved is None

    @contextlib.contextmanager
    def active(self, model: nn.Module) -> Iterator[None]:
        """Inside the block ``model`` computes the reference policy; outside, its own adapter again."""
        if self._saved is None:
            with adapters_disabled(model):
                yield
            return
        params = {n: p for n, p in model.named_parameters() if n in self._saved}
        live = {n: p.detach().clone() for n, p in params.items()}
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(self._saved[n])
        try:
            yield
        finally:
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(live[n])


def _placed_like(param: torch.Tensor, whole: torch.Tensor) -> torch.Tensor:
    """``whole`` on ``param``'s device and dtype, sharded as ``param`` is when it is a DTensor."""
    mesh = getattr(param, "device_mesh", None)
    if mesh is None:
        return whole.detach().to(device=param.device, dtype=param.dtype).clone()
    from torch.distributed.tensor import distribute_tensor

    placements = param.placements  # type: ignore[attr-defined]
    return distribute_tensor(whole.detach().to(device=param.device, dtype=param.dtype), mesh, placements)
