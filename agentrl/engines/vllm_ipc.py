"""CUDA-IPC weight updates for a vLLM server on the trainer's own GPU (``--weight-sync ipc``).

The IPC half of :class:`~agentrl.engines.vllm.VLLMEngine`. The trainer exports a CUDA IPC
handle for each of its weight tensors (``torch.multiprocessing.reductions.reduce_tensor``:
the memory stays where it is, the handle names it); vLLM's workers open the handles and
copy the values into their own parameters. Nothing goes through host memory, the disk or
a collective. It serves a vLLM on the same physical GPU only (a colocated run).

vLLM's own weight-transfer routes carry it (``vllm/entrypoints/rl/online/api_router.py``, the
``ipc`` backend of ``vllm/distributed/weight_transfer/ipc_engine.py``); the server is started
with ``--weight-transfer-config '{"backend": "ipc"}'`` and ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``
(the handles travel pickled in the JSON body: a server on 127.0.0.1 that the run started):

- ``POST /init_weight_transfer_engine`` ``{"init_info": {"packed": false}}``, once;
- then per update, inside this client's usual pause / load / prefix-cache reset / version /
  resume (``_atomic_update``): ``/start_weight_update``, ``/update_weights`` with the names,
  dtypes, shapes and handles, ``/finish_weight_update``.

Every update is checked against the checkpoint's manifest first (each served tensor once, with
its shape), so a wrong set is refused before the server sees it. After an IPC update no file
holds the served weights: a later failed update leaves the server paused and refuses to serve
(the rollback of a weight-group update).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from agentrl.engines.errors import WeightUpdateError

__all__ = ["IPC_TRANSFER_CONFIG", "VLLMIpc", "manifest_problems"]

IPC_TRANSFER_CONFIG = '{"backend": "ipc"}'
"""vLLM's ``--weight-transfer-config`` for :class:`VLLMIpc`"""


def manifest_problems(
    manifest: dict[str, tuple[int, ...]],
    names: Sequence[str],
    shapes: Sequence[Sequence[int]],
    *,
    sent: Collection[str] | None = None,
) -> str | None:
    """What is wrong with an update of ``names`` / ``shapes`` against the served model (None: nothing).

    Every name must be a served tensor of the same shape (``lm_head.weight`` may come for a tied
    head); ``sent``, when given, is every name of the whole update, which must cover the model.
    """
    bad = [f"{n}: {tuple(s)}" for n, s in zip(names, shapes, strict=True)
           if n != "lm_head.weight" and manifest.get(n) != tuple(s)]  # fmt: skip
    if bad:
        return f"unknown tensors or shapes {bad[:5]}"
    missing = sorted(set(manifest) - set(sent)) if sent is not None else []
    return f"tensors never sent {missing[:5]}" if missing else None


class VLLMIpc:
    """``update_weights_from_ipc`` over vLLM's weight-transfer routes (see the module docstring)."""

    # What VLLMEngine provides.
    base_url: str
    stats: dict[str, int]
    _manifest: dict[str, tuple[int, ...]]
    _good_path: str | None

    if TYPE_CHECKING:  # VLLMEngine's and RemoteEngine's (later in VLLMEngine's bases)
        timeout_s: float

        def _refuse_full_update(self, what: str) -> None: ...
        def _next_version(self, version: int | str | None) -> int: ...
        async def _atomic_update(self, new: int, load: Callable[[], Any], *, good_path: str | None = None,
                                 restore: Callable[[], Any] | None = None) -> None: ...  # fmt: skip
        async def _post_ok(self, path: str, body: Any, what: str, *, params: dict[str, Any] | None = None,
                           timeout_s: float = 300.0) -> Any: ...  # fmt: skip

    _ipc_ready = False  # the server's IPC transfer engine was initialised by this client

    async def update_weights_from_ipc(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        handles: str,
        *,
        version: int | None = None,
    ) -> int:
        """Load every served tensor from the trainer's GPU memory, atomically; returns the new version.

        ``handles``: base64 of the pickled list of ``{gpu_uuid: reduce_tensor args}``, one per name
        (:class:`agentrl.trainer.ipc_sync.IpcSync` builds it). The trainer keeps the tensors alive
        until this returns.
        """
        self._refuse_full_update("update_weights_from_ipc")
        if not len(names) == len(dtypes) == len(shapes):
            raise WeightUpdateError(
                f"an IPC update names {len(names)} tensors with {len(dtypes)} dtypes and {len(shapes)} shapes; "
                "give one of each per tensor"
            )
        if (why := manifest_problems(self._manifest, names, shapes, sent=names)) is not None:
            self.stats["rejected_updates"] += 1
            raise WeightUpdateError(f"IPC weight update rejected: {why}; nothing was changed")
        new = self._next_version(version)
        if not self._ipc_ready:
            await self._post_ok("/init_weight_transfer_engine", {"init_info": {"packed": False}},
                                "initialising vLLM's IPC weight transfer (started with --weight-transfer-config "
                                f"{IPC_TRANSFER_CONFIG!r}?)")  # fmt: skip
            self._ipc_ready = True
        info = {"names": names, "dtype_names": dtypes, "shapes": shapes, "ipc_handles_pickled": handles}

        async def load() -> None:
            await self._post_ok("/start_weight_update", None, "starting an IPC weight update")
            await self._post_ok("/update_weights", {"update_info": info}, "loading the weights over CUDA IPC",
                                timeout_s=self.timeout_s)  # fmt: skip
            await self._post_ok("/finish_weight_update", {}, "finishing the IPC weight update")

        await self._atomic_update(new, load)
        self._good_path = None  # no file holds these weights: a later failed update cannot roll back to them
        return new
