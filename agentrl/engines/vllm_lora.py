"""LoRA adapters on a vLLM server: the adapter half of :class:`~agentrl.engines.vllm.VLLMEngine`.

A server started for adapters (:func:`agentrl.engines.launcher.launch_vllm_server` with
``lora_rank``: ``--enable-lora --max-lora-rank R --max-loras 1`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``, which mounts vLLM's ``/v1/load_lora_adapter``) serves
one adapter, :data:`ADAPTER_NAME`, replaced in place at every update. An update
(:meth:`VLLMAdapters.update_adapter_from_path`) is atomic and versioned like a weight update:

1. the PEFT directory is checked here first (:func:`check_vllm_adapter`: its files, its rank
   against the server's ``--max-lora-rank``, its target modules against what vLLM adapts, each
   tensor's shape against the served model's layer); a refused adapter changes nothing;
2. under the engine's pause / checked prefix-cache reset / version / resume sequence
   (``VLLMEngine._atomic_update``), the load: the first one through vLLM's
   ``POST /v1/load_lora_adapter`` (which registers the name, gives it a LoRA id and loads it),
   every later one through agentrl's worker extension (``/collective_rpc`` ``agentrl_load_lora``),
   which replaces the tensors under the same id. vLLM loads the new tensors first and only then
   swaps them for the old ones (``WorkerLoRAManager.add_adapter`` in
   ``vllm/lora/worker_manager.py``), so a directory it refuses leaves the previous adapter
   serving. vLLM's own in-place load (``load_inplace: true`` on its route) is not used: the flag
   stays in the request every later generation carries, and the worker then reloads that
   request's directory at every step, so a request sent before an update put the old adapter
   back into the slot (measured: after an update, a running request's tokens scored under the
   old adapter, |Δlogp| 1.3 against the new one). The adapter's name, id and registered path
   stay the same across updates, and vLLM's prefix-cache hash includes only those: the checked
   reset and the new cache salt are what keep old KV from serving;
3. from the first adapter on, every generation names it (``"model": ADAPTER_NAME`` in the
   ``/inference/v1/generate`` body; vLLM maps a served LoRA name to its ``LoRARequest``). A request
   sent before the first adapter keeps running on the base alone across that load; its tokens
   keep the base's version label (vLLM's spans would give the later ones the new version).

A load or reset that fails is rolled back by loading the last good adapter directory again
(or unloading the adapter when there was none); if that fails too the client refuses to
generate, as for weights. A LoRA client refuses full-weight updates: the base stays the one
the server was started from.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.engines.errors import (
    EngineError,
    EngineUnavailableError,
    UnsupportedWeightUpdateError,
    WeightUpdateError,
)
from agentrl.engines.protocol import EngineCapabilities, Generation
from agentrl.httpkit import StatusMap
from agentrl.models.lora import LoraError, read_adapter

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from agentrl.httpkit.client import Answer

__all__ = [
    "ADAPTER_NAME",
    "VLLM_LORA_MODULES",
    "VLLMAdapters",
    "check_vllm_adapter",
    "vllm_max_lora_rank",
]

_REFUSED = StatusMap[WeightUpdateError](default=WeightUpdateError)

ADAPTER_NAME = "agentrl-lora"
"""The one adapter a LoRA vLLM server serves (requests name it in their ``model`` field)."""

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``--max-lora-rank`` values vLLM 0.32 accepts (``MaxLoRARanks`` in ``vllm/config/lora.py``)."""

VLLM_LORA_MODULES = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
"""The linear layers vLLM adapts in the Qwen2/Qwen3/Llama decoder blocks (it packs q/k/v and gate/up
into one layer each and splits the adapter to match); embeddings and the output head are not served."""


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds an adapter of ``rank``."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise LoraError(f"lora_rank {rank!r}: the adapter's rank must be an integer >= 1 (e.g. 16)")
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise LoraError(
        f"lora_rank {rank}: vLLM serves adapters of rank at most {VLLM_LORA_RANKS[-1]}; use a smaller --lora-rank"
    )


def check_vllm_adapter(
    path: str | os.PathLike[str], max_rank: int, manifest: dict[str, tuple[int, ...]], model_path: str
) -> None:
    """Refuse (:class:`LoraError`) an adapter directory vLLM would not serve on this model; reads it whole.

    ``manifest``: the served model's tensor shapes (``name -> shape``): each adapted layer must be
    one of its linear layers, ``lora_A`` ``(rank, in)`` and ``lora_B`` ``(out, rank)`` its shape.
    """
    spec, tensors, base = read_adapter(path)
    where = f"adapter {str(path)!r}"
    if spec.rank > max_rank:
        raise LoraError(
            f"{where} has rank {spec.rank}, above the server's --max-lora-rank {max_rank}; start the server "
            f"with lora_rank >= {spec.rank} (launch_vllm_server(lora_rank=...)) or train a smaller rank"
        )
    modules = {name.split(".lora_")[0] for name in tensors}
    unserved = sorted({m.rsplit(".", 1)[-1] for m in modules} - VLLM_LORA_MODULES)
    if unserved:
        raise LoraError(
            f"{where} adapts {unserved}, which vLLM does not serve LoRA on; target only "
            f"{sorted(VLLM_LORA_MODULES)} (--lora-target-modules)"
        )
    problems = []
    for module in sorted(modules):
        weight = manifest.get(f"{module}.weight")
        a, b = tensors.get(f"{module}.lora_A.default.weight"), tensors.get(f"{module}.lora_B.default.weight")
        if weight is None:
            problems.append(f"{module!r} is not a layer of the served model")
        elif a is None or b is None:
            problems.append(f"{module!r} lacks its lora_A or lora_B tensor")
        elif tuple(a.shape) != (spec.rank, weight[1]) or tuple(b.shape) != (weight[0], spec.rank):
            problems.append(
                f"{module!r}: lora_A {tuple(a.shape)}, lora_B {tuple(b.shape)} for a layer of shape {weight}"
            )
    if problems:
        raise LoraError(
            f"{where} (trained on base {base!r}) does not fit the served model {model_path!r}: "
            + "; ".join(problems[:3])
            + f"{f' (and {len(problems) - 3} more)' if len(problems) > 3 else ''}; load it on the base it was trained on"
        )


class VLLMAdapters:
    """The LoRA-adapter half of :class:`~agentrl.engines.vllm.VLLMEngine` (see the module docstring)."""

    # What VLLMEngine provides.
    base_url: str
    model_path: str
    _manifest: dict[str, tuple[int, ...]]
    _version: int
    _broken: str | None
    stats: dict[str, int]

    if TYPE_CHECKING:  # VLLMEngine's (after this class in its bases: never defined here at run time)

        def _next_version(self, version: int | str | None) -> int: ...
        async def _post_ok(self, path: str, body: Any, what: str, *, params: dict[str, Any] | None = None,
                           timeout_s: float = 300.0) -> Any: ...  # fmt: skip
        async def _call(self, method: str, path: str, body: Any = None, **kw: Any) -> Answer: ...
        async def _rpc(
            self, method: str, what: str, deadline_s: float | None = None, **kwargs: Any
        ) -> Any: ...
        async def _atomic_update(
            self,
            new: int,
            load: Callable[[], Awaitable[None]],
            *,
            good_path: str | None = None,
            restore: Callable[[], Awaitable[None]] | None = None,
        ) -> None: ...

    def _init_adapters(self, lora_rank: int | None) -> None:
        self.lora_rank = lora_rank
        self.max_lora_rank = vllm_max_lora_rank(lora_rank) if lora_rank is not None else None
        self._adapter_path: str | None = None  # the last adapter that loaded: the rollback target
        self._adapter_served = False  # whether requests name the adapter (from the first load on)
        self._adapter_registered = False  # whether vLLM's API server knows its name (the first load)
        self._base_last: int | None = None  # the last version the base alone served (set by the first load)

    @property
    def capabilities(self) -> EngineCapabilities:
        """A LoRA server: adapter directories only. Otherwise a checkpoint path or a weight group."""
        lora = self.lora_rank is not None
        return EngineCapabilities(state_dict=False, checkpoint=not lora, distributed=not lora, adapter=lora)

    def _base_labels(self, gen: Generation, body: dict[str, Any]) -> Generation:
        """A request sent before the first adapter (no ``model``) runs on the base to its end, though vLLM
        labels its tokens after that load with the new version: they are labelled with the base's."""
        if "model" not in body and self._base_last is not None:
            gen.weight_versions = [min(v, self._base_last) for v in gen.weight_versions]
        return gen

    def _adapter_fields(self) -> dict[str, Any]:
        """What a generation body adds: the adapter's name once one is loaded."""
        return {"model": ADAPTER_NAME} if self._adapter_served else {}

    def _refuse_full_update(self, what: str) -> None:
        if self.lora_rank is not None:
            self.stats["rejected_updates"] += 1
            raise UnsupportedWeightUpdateError(
                f"{what} on {self.base_url}: this client serves LoRA adapters (lora_rank={self.lora_rank}); "
                "the base weights stay the ones the server started with. Push the adapter with "
                "update_adapter_from_path, or start the server without lora_rank to update full weights"
            )

    async def update_adapter_from_path(
        self, path: str | os.PathLike[str], *, version: int | None = None
    ) -> int:
        """Load the PEFT adapter directory ``path`` in place of the current adapter, atomically; the new version.

        Checked first (:func:`check_vllm_adapter`): a refused adapter raises :class:`LoraError` and
        changes nothing. A server started without LoRA raises :class:`UnsupportedWeightUpdateError`.
        """
        if self.lora_rank is None or self.max_lora_rank is None:
            raise UnsupportedWeightUpdateError(
                f"update_adapter_from_path({str(path)!r}): the vLLM server at {self.base_url} was not started "
                "for LoRA; start it with launch_vllm_server(..., lora_rank=R) (or start_engine(..., lora_rank=R)) "
                "and make the client with VLLMEngine(..., lora_rank=R)"
            )
        new = self._next_version(version)
        path = str(Path(path).resolve())
        try:
            check_vllm_adapter(path, self.max_lora_rank, self._manifest, self.model_path)
        except LoraError:
            self.stats["rejected_updates"] += 1
            raise

        async def load() -> None:
            await self._load_adapter(path)
            if not self._adapter_served:
                self._base_last, self._adapter_served = self._version, True

        await self._atomic_update(new, load, restore=self._restore_adapter)
        self._adapter_path = path
        return new

    async def _load_adapter(self, path: str) -> None:
        """The first load registers the adapter with vLLM; later ones replace its tensors in the worker."""
        if not self._adapter_registered:
            body = {"lora_name": ADAPTER_NAME, "lora_path": path, "load_inplace": False}
            resp = await self._call("POST", "/v1/load_lora_adapter", body, timeout_s=300.0)
            if resp.status == 404 and '"Not Found"' in resp.text:  # FastAPI's answer for a route it lacks
                raise UnsupportedWeightUpdateError(
                    f"{self.base_url} has no /v1/load_lora_adapter: the server was not started for LoRA; start "
                    "it with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 (launch_vllm_server(..., lora_rank=R))"
                )
            if resp.status == 200:
                self._adapter_registered = True
                return
            if "has already been loaded" not in resp.text:
                raise _REFUSED.error(
                    resp.status, resp.body, f"loading the LoRA adapter {path!r}: {self.base_url}"
                )
            self._adapter_registered = True  # by an earlier client of this server: replaced below
        await self._rpc("agentrl_load_lora", f"loading the LoRA adapter {path!r}", lora_name=ADAPTER_NAME,
                        lora_path=path)  # fmt: skip

    async def _restore_adapter(self) -> None:
        """Serve the last good adapter again (none: unload it) after a failed load or reset; else refuse to serve."""
        try:
            if self._adapter_path is not None:
                await self._load_adapter(self._adapter_path)
            elif self._adapter_registered:
                self._base_last, self._adapter_served, self._adapter_registered = None, False, False
                await self._post_ok(
                    "/v1/unload_lora_adapter", {"lora_name": ADAPTER_NAME}, "unloading the LoRA adapter"
                )
        except EngineError as e:
            self._broken = (
                f"vLLM at {self.base_url} may serve a partly loaded LoRA adapter: a load failed and so did "
                f"restoring {self._adapter_path or 'the base model'!r} ({e}); restart the server"
            )
            raise EngineUnavailableError(self._broken) from e
