"""``--weight-sync ipc``: a colocated vLLM reads the trainer's new weights where they lie on the GPU.

The fourth transport behind :class:`~agentrl.trainer.weight_sync.WeightSync`. For every tensor
the trainer pushes, it exports a CUDA IPC handle (``reduce_tensor``: the GPU memory stays the
trainer's, the handle lets another process on the same GPU open it), and the engine's
:meth:`~agentrl.engines.vllm_ipc.VLLMIpc.update_weights_from_ipc` has vLLM's workers copy the
values into their own parameters, under the engine's usual pause / version / resume. No byte
crosses the host, the disk or a collective, and no copy of the model is made on the trainer's
side when its tensors are already contiguous on the GPU (the fp32 weights themselves are
shared; vLLM casts to its dtype as it copies).

It serves a vLLM on the trainer's own GPU only (``--engine vllm --colocate``); a trainer without
a GPU is refused when the sync is built. The tensors are kept alive until the engine answers,
then the IPC references are collected (``torch.cuda.ipc_collect``). Never run on a GPU yet: the
GPU check (``scripts/gpu-check.sh``) has its row.
"""

from __future__ import annotations

import base64
import pickle
import time
from collections.abc import Mapping

import torch

from agentrl.engines.errors import UnsupportedWeightUpdateError
from agentrl.engines.protocol import Engine
from agentrl.engines.weights import dtype_name
from agentrl.trainer.errors import WeightSyncError
from agentrl.trainer.weight_sync import Runner, SyncResult, checked_version, state_nbytes, target_version

__all__ = ["IpcSync", "ipc_handles"]


def ipc_handles(tensors: Mapping[str, torch.Tensor]) -> str:
    """``tensors`` (on one CUDA device) as vLLM's IPC payload: base64 of the pickled list of
    ``{gpu_uuid: reduce_tensor args}``, one per tensor, in order."""
    from torch.multiprocessing.reductions import reduce_tensor

    handles = []
    for name, t in tensors.items():
        if t.device.type != "cuda":
            raise WeightSyncError(f"CUDA IPC shares GPU memory; {name!r} is on {t.device}")
        uuid = str(torch.cuda.get_device_properties(t.device).uuid)
        handles.append({uuid: reduce_tensor(t)[1]})
    return base64.b64encode(pickle.dumps(handles)).decode("ascii")


class IpcSync:
    """Push over CUDA IPC into a vLLM on the trainer's GPU (see the module docstring)."""

    def __init__(self, engine: Engine, *, run: Runner, timeout_s: float = 300.0) -> None:
        if not hasattr(engine, "update_weights_from_ipc"):
            raise UnsupportedWeightUpdateError(
                f"run.weight_sync='ipc' needs a vLLM engine on the trainer's GPU; {type(engine).__name__} takes "
                "no IPC handles (use --weight-sync disk or broadcast)"
            )
        if not torch.cuda.is_available():
            raise WeightSyncError(
                "run.weight_sync='ipc' shares the trainer's GPU memory with vLLM, and this trainer has no CUDA "
                "GPU; use --weight-sync disk (or broadcast over gloo)"
            )
        self.engine, self._run, self.timeout_s = engine, run, timeout_s

    def push(self, state_dict: Mapping[str, torch.Tensor], *, version: int | None = None) -> SyncResult:
        t0 = time.perf_counter()
        want = target_version(self.engine, version)
        device = torch.device("cuda", torch.cuda.current_device())
        # the trainer's own tensors where they are contiguous on the GPU (no copy), else a copy kept alive here
        tensors = {k: v.detach().to(device).contiguous() for k, v in state_dict.items()}
        torch.cuda.current_stream(device).synchronize()  # the values are written before vLLM reads them
        names = list(tensors)
        try:
            got = self._run(
                self.engine.update_weights_from_ipc(
                    names,
                    [dtype_name(t.dtype) for t in tensors.values()],
                    [list(t.shape) for t in tensors.values()],
                    ipc_handles(tensors),
                    version=want,
                ),
                timeout_s=self.timeout_s + 30,
                what="CUDA IPC weight sync",
            )
        except WeightSyncError:
            raise
        except Exception as e:  # noqa: BLE001
            raise WeightSyncError(f"CUDA IPC weight sync to version {want} failed: {e}") from e
        finally:
            del tensors
            torch.cuda.ipc_collect()  # the handles vLLM closed give their memory back to the allocator
        return SyncResult(
            checked_version(self.engine, got, want, "ipc"), time.perf_counter() - t0, state_nbytes(state_dict)
        )

    def close(self) -> None:
        """Nothing to release: the engine keeps no handle past an update."""
