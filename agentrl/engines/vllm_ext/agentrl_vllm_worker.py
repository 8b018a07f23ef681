"""agentrl's vLLM worker extension: methods ``/collective_rpc`` can call inside vLLM's worker processes.

This file runs in vLLM's environment, not agentrl's: it imports only the standard library,
torch and vLLM. :func:`agentrl.engines.launcher.vllm_command` puts its directory on the
server's ``PYTHONPATH`` and passes ``--worker-extension-cls agentrl_vllm_worker.WorkerExtension``.

Why it exists: vLLM's in-place ``reload_weights`` re-processes only the layers whose tensors
the checkpoint names. A tied output head (``tie_word_embeddings``, as every agentrl catalogue
model and small Qwen models have) is never named, so on the CPU backend its prepacked GEMM
weight kept the *old* embedding: after an update, tokens were sampled from new hidden states
through the old head (measured: |Δlogp| up to 2.4 against the new weights, 1e-6 for every
other layer). :meth:`WorkerExtension.agentrl_reload` reloads, then re-processes the head.
"""

from __future__ import annotations

from typing import Any


class _Group:
    """A weight-update group joined by this worker: the process group, where it receives, what it staged."""

    def __init__(self, pg: Any, device: Any) -> None:
        self.pg, self.device = pg, device
        self.staged: dict[str, Any] = {}


def _join(master_address: str, master_port: int, rank: int, world_size: int, group_name: str,
          timeout_s: float, backend: str) -> Any:  # fmt: skip
    """Rank ``rank`` of the trainer's weight group, over gloo (host memory) or NCCL (this worker's GPU).

    The rendezvous and key layout are those of ``agentrl.engines.weights.init_weight_update_group``
    and ``unnamed_group`` (a ``tcp://`` store, the group's prefixes, then ``cpu/`` for gloo or
    ``cuda/`` for NCCL, as c10d's own helper nests them), written out here because this file cannot
    import agentrl: it runs in vLLM's environment.
    """
    import datetime

    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if backend not in ("gloo", "nccl"):
        raise ValueError(f"weight group backend {backend!r}: use 'gloo' or 'nccl'")
    if backend == "nccl" and not (torch.cuda.is_available() and hasattr(dist, "ProcessGroupNCCL")):
        raise ValueError("backend 'nccl' needs a vLLM worker on a CUDA GPU; this one has none: use 'gloo'")
    timeout = datetime.timedelta(seconds=timeout_s)
    store, rank, world = next(
        c10d.rendezvous(f"tcp://{master_address}:{master_port}", rank, world_size, timeout=timeout)
    )
    store.set_timeout(timeout)
    base = c10d.PrefixStore(f"{group_name}/", c10d.PrefixStore(group_name, store))
    if backend == "gloo":
        return dist.ProcessGroupGloo(c10d.PrefixStore("cpu/", base), rank, world, timeout)
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return dist.ProcessGroupNCCL(c10d.PrefixStore("cuda/", base), rank, world, options)


def _groups(worker: Any) -> dict[str, _Group]:
    if not hasattr(worker, "_agentrl_groups"):
        worker._agentrl_groups = {}
    groups: dict[str, _Group] = worker._agentrl_groups
    return groups


class WorkerExtensionGroups:
    """The distributed weight path: join the trainer's group, receive buckets, commit them in one reload.

    Over gloo the buckets arrive in host memory; over NCCL on this worker's GPU (staged there until
    the commit: the update costs one more copy of the weights in GPU memory while it is received).
    """

    def agentrl_join(self, master_address: str, master_port: int, rank: int, world_size: int,
                     group_name: str, timeout_s: float, backend: str = "gloo") -> str:  # fmt: skip
        groups = _groups(self)
        if group_name in groups:
            raise ValueError(f"already in weight group {group_name!r}; leave it first")
        pg = _join(master_address, int(master_port), int(rank), int(world_size), group_name, float(timeout_s),
                   backend)  # fmt: skip
        groups[group_name] = _Group(pg, self.device if backend == "nccl" else "cpu")  # type: ignore[attr-defined]
        return group_name

    def agentrl_receive(self, names: list[str], dtypes: list[str], shapes: list[list[int]], group_name: str,
                        timeout_s: float, commit: bool) -> dict[str, Any]:  # fmt: skip
        """Receive one bucket (broadcast from rank 0, in order); ``commit`` applies every staged tensor at once."""
        import datetime

        import torch

        group = _groups(self).get(group_name)
        if group is None:
            raise ValueError(f"no weight group {group_name!r}; join it first")
        for name, dt, shape in zip(names, dtypes, shapes, strict=True):
            t = torch.empty(tuple(shape), dtype=getattr(torch, dt), device=group.device)
            if not group.pg.broadcast(t, 0).wait(datetime.timedelta(seconds=float(timeout_s))):
                raise TimeoutError(f"receiving {name!r} took longer than {timeout_s} s")
            group.staged[name] = t
        if group.device != "cpu":  # NCCL's wait orders the stream only: the bucket is here once it drains
            torch.cuda.current_stream().synchronize()
        if not commit:
            return {"staged": len(group.staged)}
        tensors, group.staged = group.staged, {}
        self.reload_weights(weights_iterator=list(tensors.items()))  # type: ignore[attr-defined]
        return {"applied": len(tensors), "refreshed": _refresh_head(self)}

    def agentrl_discard(self, group_name: str) -> int:
        group = _groups(self).get(group_name)
        n = len(group.staged) if group else 0
        if group:
            group.staged = {}
        return n

    def agentrl_leave(self, group_name: str) -> bool:
        return _groups(self).pop(group_name, None) is not None


def _refresh_head(worker: Any) -> list[str]:
    """Re-process the output head, which vLLM derives from the (tied) embedding at load time."""
    model = worker.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)
        return ["lm_head"]
    return []


class WorkerExtension(WorkerExtensionGroups):
    """Mixed into vLLM's worker class (``self`` is the worker: ``model_runner``, ``reload_weights``)."""

    def agentrl_load_lora(self, lora_name: str, lora_path: str) -> dict[str, Any]:
        """Replace the one LoRA adapter this worker holds with the one at ``lora_path``, under its LoRA id.

        vLLM's own in-place load (``/v1/load_lora_adapter`` with ``load_inplace``) stores the flag in
        the request that every later generation carries, and the worker then reloads that request's
        directory at every step: a request sent before an update put its old adapter back in the
        slot the new one had just filled. Here the requests keep the first load's plain request
        (the id already loaded: nothing to reload), and the worker loads the new tensors once,
        validated before they replace the old ones (``load_inplace`` on this call only).
        """
        from vllm.lora.request import LoRARequest

        ids = sorted(self.list_loras())  # type: ignore[attr-defined]
        if len(ids) != 1:
            raise ValueError(f"expected one loaded LoRA adapter to replace, found ids {ids}")
        request = LoRARequest(lora_name=lora_name, lora_int_id=ids[0], lora_path=lora_path, load_inplace=True)
        self.add_lora(request)  # type: ignore[attr-defined]
        return {"lora_int_id": ids[0], "path": lora_path}

    def agentrl_reload(self, weights_path: str) -> dict[str, Any]:
        """Reload every weight from ``weights_path`` in place, then refresh what derives from tied tensors."""
        self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]
        return {"path": weights_path, "refreshed": _refresh_head(self)}
