"""Weight sync: pushing the trainer's new weights into the inference engine after a train step.

Three transports behind one ``push(state_dict) -> SyncResult``:

- :class:`InProcessSync`: engine and trainer share a process; the engine copies the
  tensors into its own parameters between two decode steps.
- :class:`DiskSync`: write ``model.safetensors`` into a fresh directory, rename it into
  place atomically, and have the engine reload from it (works across processes and
  machines that share a file system).
- :class:`BroadcastSync`: a dedicated ``torch.distributed`` group (trainer = rank 0,
  engine = rank 1..); tensors go out in buckets of ``bucket_bytes``, announced with
  names/dtypes/shapes first (SGLang's ``update_weights_from_distributed`` protocol).
  Intermediate buckets are staged by the engine and committed by the last one.

Every push into an engine goes through here: the RL step's sync, and also the warm
start and the resume, which set an explicit ``version``. Each transport calls only the
:class:`~agentrl.engines.protocol.Engine` protocol, from this sync code through ``run``: the
run's event loop (:meth:`agentrl.eventloop.LoopThread.run`, so engine clients live on the one
loop of the run), or ``run_sync`` on a fresh loop by default. It checks the engine's
``capabilities`` when it is built, so a transport the engine cannot serve fails at setup
with ``UnsupportedWeightUpdateError``.

The version bump is atomic: the engine applies a whole update (all buckets) at once
and returns the new version, which must equal the version asked for, else
:class:`WeightSyncError`. Every push is timed (``seconds``, ``bytes``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

from agentrl.engines.protocol import Engine, require_capability, run_sync
from agentrl.models.lora import is_lora, lora_base, lora_spec, save_adapter
from agentrl.trainer.adapter import base_nbytes
from agentrl.trainer.distributed import Ranks
from agentrl.trainer.errors import WeightSyncError

__all__ = [
    "BroadcastSync",
    "Runner",
    "DiskSync",
    "InProcessSync",
    "SyncResult",
    "WeightSync",
    "make_sync",
    "save_weights_dir",
    "sync_metrics",
]


T = TypeVar("T")


class Runner(Protocol):
    """Runs one engine coroutine from sync code under a deadline (``run_sync``, ``LoopThread.run``)."""

    def __call__(self, coro: Coroutine[Any, Any, T], *, timeout_s: float, what: str) -> T: ...


@dataclass
class SyncResult:
    version: int
    seconds: float
    bytes: int
    buckets: int = 1
    full_bytes: int = 0
    """with LoRA: what a push of the whole model would have been (``bytes`` is the adapter's); else 0"""


def sync_metrics(engine: Engine, pushed: SyncResult | None) -> dict[str, float]:
    """A step's ``sync/*`` metrics: the engine's version, the bytes pushed (and, with LoRA, a full push's)."""
    row = {"sync/version": float(engine.weight_version), "sync/bytes": float(pushed.bytes if pushed else 0)}
    if pushed is not None and pushed.full_bytes:
        row["sync/full_bytes"] = float(pushed.full_bytes)
    return row


class WeightSync(Protocol):
    def push(self, state_dict: Mapping[str, torch.Tensor], *, version: int | None = None) -> SyncResult:
        """Push the weights; the engine's version becomes ``version``, else its current version + 1."""
        ...

    def close(self) -> None: ...


def state_nbytes(sd: Mapping[str, torch.Tensor]) -> int:
    """The bytes of a state dict's tensors (a push's ``SyncResult.bytes``)."""
    return sum(t.numel() * t.element_size() for t in sd.values())


def checked_version(engine: Engine, got: int, want: int, how: str) -> int:
    """``got``, the version the engine reports after a push, if it is the one asked for; else raises."""
    if got != want:
        raise WeightSyncError(f"{how} weight sync: engine reports version {got}, expected {want}")
    return got


def target_version(engine: Engine, version: int | None) -> int:
    """The version a push sets: ``version`` when given, else the engine's next."""
    return engine.weight_version + 1 if version is None else version


class InProcessSync:
    """Copy tensors straight into an in-process engine (``update_weights_from_state_dict``)."""

    def __init__(
        self, engine: Engine, timeout_s: float = 300.0, *, run: Runner = run_sync,
        adapter: torch.nn.Module | None = None,
    ) -> None:  # fmt: skip
        require_capability(engine, "state_dict", "run.weight_sync='inprocess'")
        self.engine, self.timeout_s, self._run = engine, timeout_s, run
        self.adapter = adapter if adapter is not None and is_lora(adapter) else None

    def push(self, state_dict: Mapping[str, torch.Tensor], *, version: int | None = None) -> SyncResult:
        t0 = time.perf_counter()
        want = target_version(self.engine, version)
        try:
            got = self._run(
                self.engine.update_weights_from_state_dict(state_dict, version=want),
                timeout_s=self.timeout_s,
                what=f"in-process weight update to version {want}",
            )
        except Exception as e:  # noqa: BLE001 - any engine failure leaves the old weights
            raise WeightSyncError(f"in-process weight sync to version {want} failed: {e}") from e
        full = base_nbytes(self.adapter) + state_nbytes(state_dict) if self.adapter is not None else 0
        return SyncResult(checked_version(self.engine, got, want, "in-process"), time.perf_counter() - t0,
                          state_nbytes(state_dict), full_bytes=full)  # fmt: skip

    def close(self) -> None:
        pass


class DiskSync:
    """Write safetensors to ``root/vN`` (atomically renamed into place), then the engine reloads it.

    With ``ranks`` (data-parallel trainer ranks, every one with its own engine and the same full
    weights): rank 0 writes the version rank 0 chose, the ranks meet, then every rank's engine
    reloads that one file (the directory must be one every rank sees).
    """

    def __init__(
        self,
        engine: Engine,
        root: str | Path,
        keep: int = 1,
        timeout_s: float = 300.0,
        *,
        run: Runner = run_sync,
        ranks: Ranks | None = None,
        adapter: torch.nn.Module | None = None,
    ) -> None:
        self.adapter = adapter if adapter is not None and is_lora(adapter) else None
        if self.adapter is not None:
            require_capability(engine, "adapter", "--lora-rank with run.weight_sync='disk'")
        else:
            require_capability(engine, "checkpoint", "run.weight_sync='disk'")
        self.ranks = ranks or Ranks()
        self.engine, self.root, self.timeout_s = engine, Path(root), timeout_s
        # a slower rank may still be reading the previous version
        self.keep = keep if self.ranks.world == 1 else max(keep, 2)
        self._run = run
        self.root.mkdir(parents=True, exist_ok=True)

    def push(self, state_dict: Mapping[str, torch.Tensor], *, version: int | None = None) -> SyncResult:
        t0 = time.perf_counter()
        want = self.ranks.broadcast(target_version(self.engine, version))
        final = self.root / f"v{want}"
        tensors = state_dict
        if self.ranks.main:
            tensors = save_weights_dir(state_dict, final, self.adapter)
        self.ranks.barrier()  # the file is complete before any rank's engine reads it
        adapter = self.adapter is not None  # an engine with the "adapter" capability has the method
        load = self.engine.update_adapter_from_path if adapter else self.engine.update_weights_from_path  # type: ignore[attr-defined]
        try:
            got = self._run(
                load(final, version=want),
                timeout_s=self.timeout_s,
                what=f"weight update from {str(final)!r}",
            )
        except Exception as e:  # noqa: BLE001
            raise WeightSyncError(f"disk weight sync from {str(final)!r} failed: {e}") from e
        stale = sorted(self.root.glob("v*"), key=lambda p: int(p.name[1:]))[: -self.keep]
        for old in stale if self.ranks.main else []:
            shutil.rmtree(old, ignore_errors=True)
        full = base_nbytes(self.adapter) + state_nbytes(tensors) if self.adapter is not None else 0
        return SyncResult(checked_version(self.engine, got, want, "disk"), time.perf_counter() - t0, state_nbytes(tensors),
                          full_bytes=full)  # fmt: skip

    def close(self) -> None:
        pass


class BroadcastSync:
    """Broadcast in buckets over a dedicated process group to an engine joined as rank 1 (or replicas as 1..n).

    Uses the protocol's distributed path (``init_weights_update_group``,
    ``update_weights_from_distributed``, ``destroy_weights_update_group``): the embedded
    engine serves it, and so does an HTTP client of a separate engine process. ``backend``: gloo
    (tensors through host memory; the CPU tests' path) or NCCL (from the trainer's GPU straight into
    the engine's: its device tensors, no host copy). The bucketing, ordering and commit are the same.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        master_address: str = "127.0.0.1",
        master_port: int = 0,
        bucket_bytes: int = 64 << 20,
        timeout_s: float = 120.0,
        group_name: str = "agentrl_weight_sync",
        run: Runner = run_sync,
        backend: str = "gloo",
    ) -> None:
        self.engine, self.bucket_bytes, self.timeout_s, self.group_name = (
            engine,
            bucket_bytes,
            timeout_s,
            group_name,
        )
        self._run, self.backend = run, backend
        require_capability(engine, "distributed", "run.weight_sync='broadcast'")
        if backend == "nccl" and not torch.cuda.is_available():
            raise WeightSyncError("a broadcast over NCCL needs the trainer on a CUDA GPU; use backend='gloo'")
        port = master_port or _free_port(master_address)

        world = 1 + int(getattr(engine, "weight_ranks", 1))  # several replicas join as ranks 1..n

        async def setup() -> Any:
            join = asyncio.create_task(
                engine.init_weights_update_group(
                    master_address, port, 1, world, group_name, backend, timeout_s
                )
            )
            group = await asyncio.to_thread(
                _trainer_group, master_address, port, world, timeout_s, group_name, backend
            )
            await join
            return group

        try:
            self.group = self._run(
                setup(), timeout_s=timeout_s + 30, what=f"weight group rendezvous at {master_address}:{port}"
            )
        except Exception as e:  # noqa: BLE001
            raise WeightSyncError(
                f"could not set up the broadcast group at {master_address}:{port}: {e}"
            ) from e

    def push(self, state_dict: Mapping[str, torch.Tensor], *, version: int | None = None) -> SyncResult:
        if _in_event_loop():
            raise WeightSyncError("push() was called inside a running event loop; await apush() instead")
        return self._run(
            self.apush(state_dict, version=version),
            timeout_s=self.timeout_s * 2 + 60,  # apush bounds each bucket by timeout_s itself
            what="broadcast weight sync",
        )

    async def apush(
        self, state_dict: Mapping[str, torch.Tensor], *, version: int | None = None
    ) -> SyncResult:
        from agentrl.engines.weights import bucket_tensors, dtype_name

        t0 = time.perf_counter()
        want = target_version(self.engine, version)
        # gloo sends from host memory; NCCL from the GPU (a tensor the trainer kept on the host goes up)
        device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else "cpu"
        buckets = list(
            bucket_tensors(
                {k: v.detach().contiguous().to(device) for k, v in state_dict.items()}, self.bucket_bytes
            )
        )
        got = -1
        try:
            for i, bucket in enumerate(buckets):
                last = i == len(buckets) - 1
                recv = asyncio.create_task(
                    self.engine.update_weights_from_distributed(
                        [n for n, _ in bucket],
                        [dtype_name(t.dtype) for _, t in bucket],
                        [list(t.shape) for _, t in bucket],
                        group_name=self.group_name,
                        flush_cache=last,
                        weight_version=want if last else None,
                        timeout_s=self.timeout_s,
                    )
                )
                await asyncio.to_thread(self._send, [t for _, t in bucket])
                got = await asyncio.wait_for(recv, self.timeout_s)
        except Exception as e:  # noqa: BLE001
            raise WeightSyncError(f"broadcast weight sync to version {want} failed: {e}") from e
        return SyncResult(
            checked_version(self.engine, got, want, "broadcast"),
            time.perf_counter() - t0,
            state_nbytes(state_dict),
            len(buckets),
        )

    def _send(self, tensors: list[torch.Tensor]) -> None:
        import datetime

        for t in tensors:
            work = self.group.broadcast(t, 0)
            if not work.wait(datetime.timedelta(seconds=self.timeout_s)):
                raise WeightSyncError(
                    f"broadcast of a {tuple(t.shape)} tensor did not finish in {self.timeout_s} s"
                )
        if self.backend == "nccl":  # NCCL's wait orders the stream only: the bucket is sent once it drains
            torch.cuda.current_stream().synchronize()

    def close(self) -> None:
        self._run(
            self.engine.destroy_weights_update_group(self.group_name),
            timeout_s=self.timeout_s,
            what=f"leaving weight group {self.group_name!r}",
        )


def _trainer_group(
    host: str, port: int, world_size: int, timeout_s: float, group_name: str, backend: str
) -> Any:
    """Rank 0 of the weight-update group (same rendezvous as the engine's side, its own local name).

    The engine registers its side under ``group_name``; when both sides live in one process
    the trainer's process group needs another local name, while the store prefix (which is
    what the two sides rendezvous on) stays ``group_name``.
    """
    import datetime

    from torch.distributed import distributed_c10d as c10d

    from agentrl.engines.weights import unnamed_group

    timeout = datetime.timedelta(seconds=timeout_s)
    store, rank, world = next(c10d.rendezvous(f"tcp://{host}:{port}", 0, world_size, timeout=timeout))
    store.set_timeout(timeout)
    return unnamed_group(c10d.PrefixStore(group_name, store), group_name, rank, world, backend, timeout)


def save_weights_dir(
    state_dict: Mapping[str, torch.Tensor], final: str | Path, adapter: torch.nn.Module | None = None
) -> dict[str, torch.Tensor]:
    """Write ``final/model.safetensors`` via a temporary sibling renamed into place; returns what was written.

    A reader never sees a half-written directory: ``final`` appears complete or not at all. With
    ``adapter`` (the LoRA policy whose adapter ``state_dict`` is) it is a PEFT adapter directory.
    """
    from safetensors.torch import save_file

    final = Path(final)
    tmp = final.parent / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = _dedupe_tied(state_dict)
    if adapter is not None:
        spec = lora_spec(adapter)
        assert spec is not None
        save_adapter(tmp, tensors, spec, base=lora_base(adapter))
    else:
        save_file(tensors, str(tmp / "model.safetensors"))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return tensors


def _dedupe_tied(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tied tensors (``lm_head.weight`` = ``embed_tokens.weight``) once, as safetensors requires.

    The engine's model ties them too, so updating one name updates both.
    """
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int]] = set()
    for k, v in state_dict.items():
        key = (v.untyped_storage().data_ptr(), int(v.storage_offset()))
        if key in seen:
            continue
        seen.add(key)
        out[k] = v.detach().contiguous().cpu()
    return out


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def make_sync(
    kind: str, engine: Engine, run_dir: str | Path, *, run: Runner = run_sync, ranks: Ranks | None = None,
    adapter: torch.nn.Module | None = None, device: str | torch.device | None = None, colocate: bool = False,
) -> WeightSync:  # fmt: skip
    """The transport for ``run.weight_sync``; raises ``UnsupportedWeightUpdateError`` if the engine lacks it.

    ``run`` runs the engine's coroutines (the run's event loop; a fresh loop per call by default).
    ``ranks``: data-parallel trainer ranks, each with its own engine (disk: rank 0 writes, all reload).
    ``adapter``: the policy; when it carries a LoRA adapter, only the adapter is pushed (in process,
    its tensors; on disk, a PEFT directory the engine loads in place of the last one).
    ``device``: the trainer's; a broadcast from a CUDA trainer goes over NCCL, else over gloo.
    ``colocate``: the engine (vLLM) shares the trainer's GPU and sleeps through every update
    (:class:`~agentrl.trainer.colocate.ColocatedSync` around the transport).
    """
    if colocate:
        from agentrl.trainer.colocate import ColocatedSync

        inner = make_sync(kind, engine, run_dir, run=run, ranks=ranks, adapter=adapter, device=device)
        return ColocatedSync(inner, engine, run=run)
    if adapter is not None and is_lora(adapter) and kind in ("broadcast", "ipc"):
        raise WeightSyncError(
            f"a LoRA adapter is pushed in process or as a PEFT directory (disk), not over {kind}"
        )
    if kind == "inprocess":
        return InProcessSync(engine, run=run, adapter=adapter)
    if kind == "disk":
        return DiskSync(engine, Path(run_dir) / "weights", run=run, ranks=ranks, adapter=adapter)
    if kind == "ipc":  # a vLLM on the trainer's GPU opens the trainer's tensors in place
        from agentrl.trainer.ipc_sync import IpcSync

        return IpcSync(engine, run=run)
    if kind == "broadcast":  # over NCCL from a trainer on a GPU, else gloo through host memory
        return BroadcastSync(
            engine,
            run=run,
            backend="nccl" if device is not None and torch.device(device).type == "cuda" else "gloo",
        )
    raise WeightSyncError(f"unknown weight sync {kind!r}; use inprocess, disk, broadcast or ipc")
