"""Weight transfer into engines: state-dict checks, safetensors loading, torch.distributed buckets.

The distributed transfer follows SGLang's protocol so one trainer code path
serves the embedded engine, ``agentrl serve-engine`` and a real SGLang server:

1. every engine joins a dedicated process group (``init_weights_update_group``:
   ``master_address``, ``master_port``, ``rank_offset``, ``world_size``,
   ``group_name``, ``backend``); the trainer is rank 0 and creates the group with
   :func:`init_weight_update_group` (same rendezvous: ``tcp://`` store,
   ``PrefixStore(group_name)``, a fresh process group independent of any default one);
2. per bucket the trainer announces ``names``/``dtypes``/``shapes``
   (``update_weights_from_distributed``) and broadcasts each tensor from rank 0,
   in that order (:func:`broadcast_bucket`).

Every rendezvous and collective has a deadline (``timeout_s``).
"""

from __future__ import annotations

import datetime
import inspect
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentrl.engines.errors import EngineTimeoutError, WeightUpdateError

__all__ = [
    "StagedWeights",
    "bucket_tensors",
    "broadcast_bucket",
    "destroy_weight_update_group",
    "dtype_from_name",
    "dtype_name",
    "init_weight_update_group",
    "load_safetensors_dir",
    "receive_bucket",
    "unnamed_group",
    "validate_state_dict",
]


@dataclass
class StagedWeights:
    """Buckets received but not yet committed (applied together by the committing bucket)."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


def validate_state_dict(
    model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Map each name of ``tensors`` to the model tensor it overwrites; reject unknown names and bad shapes.

    Raises :class:`WeightUpdateError` before anything is copied, so a rejected update leaves
    the model untouched.
    """
    if not tensors:
        raise WeightUpdateError("the weight update is empty; pass at least one named tensor")
    targets = dict(model.state_dict(keep_vars=True))
    unknown = [n for n in tensors if n not in targets]
    if unknown:
        sample = ", ".join(list(targets)[:3])
        raise WeightUpdateError(
            f"{len(unknown)} tensor name(s) are not in the model, e.g. {unknown[:3]}; expected names like "
            f"{sample} (strip wrapper prefixes such as 'module.' or '_orig_mod.')"
        )
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        dst = targets[name]
        if not isinstance(t, torch.Tensor):
            raise WeightUpdateError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != tuple(dst.shape):
            raise WeightUpdateError(
                f"{name}: shape {tuple(t.shape)} does not match the model's {tuple(dst.shape)}; "
                "is this checkpoint from the same architecture?"
            )
        if not (t.dtype.is_floating_point or t.dtype == dst.dtype):
            raise WeightUpdateError(f"{name}: dtype {t.dtype} cannot be copied into {dst.dtype}")
        out[name] = dst.data
    return out


def load_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    """Read every ``*.safetensors`` file of a directory (or one file) into one CPU state dict."""
    from safetensors.torch import load_file

    path = Path(path)
    files = [path] if path.is_file() else sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        raise WeightUpdateError(
            f"no safetensors weights at {str(path)!r}; pass a directory with *.safetensors files "
            "(as written by save_pretrained) or a .safetensors file"
        )
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            tensors.update(load_file(str(f), device="cpu"))
        except Exception as e:
            raise WeightUpdateError(f"cannot read {str(f)!r}: {e}") from e
    return tensors


_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


def dtype_name(dtype: torch.dtype) -> str:
    """The wire name of a dtype (``"bfloat16"``), as SGLang's ``dtypes`` field spells it."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    key = name.removeprefix("torch.")
    if key not in _DTYPES:
        raise WeightUpdateError(f"unknown dtype {name!r}; use one of {sorted(_DTYPES)}")
    return _DTYPES[key]


_NAMES_LOCK = threading.Lock()
_REGISTERED: set[str] = set()  # group names this process registered (or is registering) with c10d


def init_weight_update_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    backend: str = "gloo",
    timeout_s: float = 60.0,
    group_name: str = "weight_update_group",
) -> Any:
    """Create (rank 0) or join a dedicated process group for weight broadcasts; returns the group.

    It does not touch the default process group, so a trainer already running under
    ``torchrun`` can create it alongside its own.
    """
    from torch.distributed import distributed_c10d as c10d

    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        it = c10d.rendezvous(f"tcp://{master_address}:{master_port}", rank, world_size, timeout=timeout)
        store, rank, world_size = next(it)
        store.set_timeout(timeout)
        store = c10d.PrefixStore(group_name, store)
        with _NAMES_LOCK:
            registered = group_name in _REGISTERED or group_name in c10d._world.pg_names.values()
            _REGISTERED.add(group_name)
        if registered:
            # Another engine of this process joined under this name (replicas in one process):
            # the same key layout as the registered group, under no local name of its own.
            return unnamed_group(store, group_name, rank, world_size, backend, timeout)
        params = inspect.signature(c10d._new_process_group_helper).parameters
        options = "backend_options" if "backend_options" in params else "pg_options"
        pg, _ = c10d._new_process_group_helper(
            world_size,
            rank,
            [],
            c10d.Backend(backend),
            store,
            group_name=group_name,  # type: ignore[arg-type]
            timeout=timeout,
            **{options: None},
        )
        c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    except Exception as e:
        raise WeightUpdateError(
            f"cannot {'create' if rank == 0 else 'join'} weight update group {group_name!r} at "
            f"{master_address}:{master_port} (rank {rank} of {world_size}, backend {backend}) within "
            f"{timeout_s} s: {e}"
        ) from e
    return pg


def unnamed_group(
    store: Any, group_name: str, rank: int, world_size: int, backend: str, timeout: datetime.timedelta
) -> Any:
    """A process group on ``store`` (already prefixed with ``group_name``) under no local c10d name.

    The key layout is the one c10d's own helper gives a group named ``group_name`` (its prefix,
    then the device's: ``cpu/`` for gloo, ``cuda/`` for NCCL), so it meets a peer that registered
    its side normally, a vLLM worker (``vllm_ext/agentrl_vllm_worker.py`` writes the same layout
    out) or SGLang's.
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    base = c10d.PrefixStore(f"{group_name}/", store)
    if backend == "gloo":
        return dist.ProcessGroupGloo(c10d.PrefixStore("cpu/", base), rank, world_size, timeout)
    if backend == "nccl":
        if not (torch.cuda.is_available() and hasattr(dist, "ProcessGroupNCCL")):
            raise WeightUpdateError("backend 'nccl' needs a CUDA build of torch and a GPU; use 'gloo'")
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(c10d.PrefixStore("cuda/", base), rank, world_size, options)
    raise WeightUpdateError(f"weight group backend {backend!r}: use 'gloo' or 'nccl'")


def destroy_weight_update_group(group: Any) -> None:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    name = c10d._world.pg_names.get(group)
    if name is not None:
        dist.destroy_process_group(group)
        with _NAMES_LOCK:
            _REGISTERED.discard(name)
    # else: a group joined under no local name (see init_weight_update_group); dropping it frees it


def _broadcast(t: torch.Tensor, group: Any, timeout_s: float, what: str) -> None:
    work = group.broadcast(t, 0)  # rank 0 of the group; works for a group under no local name too
    try:
        ok = work.wait(timeout=datetime.timedelta(seconds=timeout_s))
    except Exception as e:
        raise EngineTimeoutError(f"broadcast of {what} failed or timed out after {timeout_s} s: {e}") from e
    if ok is False:
        raise EngineTimeoutError(f"broadcast of {what} did not complete within {timeout_s} s")


def receive_bucket(
    group: Any,
    names: list[str],
    dtypes: list[str],
    shapes: list[list[int]],
    timeout_s: float = 300.0,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """Receive one bucket broadcast from rank 0: one tensor per name, in order."""
    if not (len(names) == len(dtypes) == len(shapes)):
        raise WeightUpdateError(
            f"names, dtypes and shapes must have equal lengths, got {len(names)}, {len(dtypes)}, {len(shapes)}"
        )
    out: dict[str, torch.Tensor] = {}
    for name, dt, shape in zip(names, dtypes, shapes, strict=True):
        t = torch.empty(tuple(shape), dtype=dtype_from_name(dt), device=device)
        _broadcast(t, group, timeout_s, f"{name!r} from rank 0")
        out[name] = t
    return out


def broadcast_bucket(group: Any, tensors: Iterable[torch.Tensor], timeout_s: float = 300.0) -> None:
    """Trainer side (rank 0): broadcast one bucket's tensors in the announced order."""
    for i, t in enumerate(tensors):
        _broadcast(t.detach().contiguous(), group, timeout_s, f"tensor #{i} to the engines")


def bucket_tensors(
    named: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = 512 << 20
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group named tensors into buckets of at most ``bucket_bytes`` (a bigger tensor gets its own bucket)."""
    items = named.items() if isinstance(named, Mapping) else named
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in items:
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += nbytes
    if bucket:
        yield bucket
