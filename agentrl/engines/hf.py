"""The embedded engine: continuous batching over a transformers causal LM, in-process.

:class:`HFEngine` validates requests in the caller's thread (bad input raises there and
never reaches the batch), then hands them to the engine thread
(:mod:`agentrl.engines.scheduler`), which batches every running request into one
decode step. The running batch's KV cache is left-padded with an explicit 4-D mask
and per-row positions (:mod:`agentrl.engines.batch`), so a row computes what it would
compute alone.

Randomness is per request: each request owns a ``torch.Generator`` (seeded from
``SamplingParams.seed``, else from the engine's seed sequence) and draws one
uniform per token, so its tokens do not depend on what else is batched.

Weight updates never drain by default: they are applied between two decode
steps, and in-flight requests continue; every sampled token is tagged with the
version of the weights that produced it (``Generation.weight_versions``). The KV
already computed for in-flight requests is kept (it was computed by the older
weights). ``drain=True`` instead pauses admission, lets running requests finish,
then applies the update. See docs/engines.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import itertools
import logging
import os
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from agentrl.engines.batch import PrefixCache
from agentrl.engines.errors import (
    InvalidSamplingError,
    WeightUpdateError,
)
from agentrl.engines.protocol import EngineCapabilities, Generation, TokenDelta, check_prompt
from agentrl.engines.scheduler import Request, Scheduler
from agentrl.engines.static_kv import static_layout
from agentrl.engines.weight_groups import GroupJoin, WeightBucket, WeightGroupEngine
from agentrl.engines.weights import StagedWeights, load_safetensors_dir, validate_state_dict
from agentrl.errors import ConfigError
from agentrl.models.lora import LoraSpec, apply_lora, check_adapter_fits, lora_spec, read_adapter
from agentrl.types import SamplingParams

__all__ = ["HFEngine", "load_causal_lm", "parse_sampling"]

log = logging.getLogger(__name__)

_BUCKET_TIMEOUT_S = 300.0  # a bucket's deadline when the caller gives none

SamplingLike = SamplingParams | Mapping[str, Any] | None


def parse_sampling(sampling: SamplingLike) -> SamplingParams:
    """Turn a ``SamplingParams``, a plain mapping or ``None`` into ``SamplingParams``; bad fields raise."""
    if sampling is None:
        return SamplingParams.model_validate({})
    if isinstance(sampling, SamplingParams):
        return sampling
    if not isinstance(sampling, Mapping):
        raise InvalidSamplingError(
            f"sampling must be SamplingParams or a mapping, got {type(sampling).__name__}"
        )
    try:
        return SamplingParams.model_validate(dict(sampling))
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']} (got {err.get('input')!r})"
            for err in e.errors()
        )
        known = ", ".join(SamplingParams.model_fields)
        raise InvalidSamplingError(f"invalid sampling params: {problems}. Known fields: {known}") from None


def load_causal_lm(
    name_or_path: str | os.PathLike[str], device: torch.device, dtype: torch.dtype | None
) -> Any:
    """Load a causal LM by agentrl model name (built offline on first use), local path or hub id."""
    from agentrl.models import load_model

    return load_model(str(name_or_path), dtype=dtype, device=str(device))


class HFEngine(WeightGroupEngine):
    """Continuous-batching engine over a transformers causal LM (see the module docstring).

    ``model`` is a ``PreTrainedModel`` or an agentrl model name / local path / hub id. The
    engine owns the model it is given (it runs forwards on it from its own thread and
    ``update_weights`` writes into it): pass a copy if you keep training the original. ``device`` defaults to CUDA when present, else CPU.
    ``max_batch_size`` bounds the running batch; ``max_prefill_tokens`` bounds one
    prefill (padded tokens); ``stop_on_eos`` also stops at the model's EOS ids;
    ``max_context`` overrides the model's ``max_position_embeddings``;
    ``prefix_cache_bytes`` bounds the KV kept for prompt-prefix reuse (0 disables it); a cached
    prefix is reused when it covers at least ``min_prefix_reuse`` prompt tokens.
    ``num_threads``, when given, calls ``torch.set_num_threads`` from the engine thread. That
    setting is process-wide, so it is off by default; on a small busy CPU, 1 thread made
    decoding 6-10x faster here (OpenMP teams stall on descheduled members).
    ``lora`` injects a LoRA adapter now (its tensors then update like any others); without it, the
    first :meth:`update_adapter_from_path` injects the adapter it is given. ``cuda_graphs`` (None: on iff
    CUDA) replays the decode step as CUDA graphs over ``static_kv`` (None: as ``cuda_graphs``), the
    fixed-shape KV layout of :mod:`agentrl.engines.static_kv`, which also runs alone (on CPU too).
    """

    def __init__(
        self,
        model: Any,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        max_batch_size: int = 64,
        max_prefill_tokens: int = 8192,
        stop_on_eos: bool = True,
        max_context: int | None = None,
        seed: int = 0,
        weight_version: int = 0,
        name: str | None = None,
        prefix_cache_bytes: int = 256 << 20,
        min_prefix_reuse: int = 16,
        num_threads: int | None = None,
        lora: LoraSpec | None = None,
        cuda_graphs: bool | None = None,
        static_kv: bool | None = None,
    ) -> None:
        if max_batch_size < 1 or max_prefill_tokens < 1:
            raise ConfigError(
                f"max_batch_size and max_prefill_tokens must be >= 1, got {max_batch_size} and {max_prefill_tokens}"
            )
        self.device = (
            torch.device(device)
            if device is not None
            else torch.device("cuda" if torch.cuda.is_available() else "cpu")
        )
        self.model_name, model = _place_model(model, self.device, dtype, name)
        self.model = model.eval()
        if lora is not None:  # the trainer's adapter arrives as a partial state dict, or a PEFT directory
            apply_lora(model, lora)
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        self.max_context = int(max_context or getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.eos_token_ids: frozenset[int] = _eos_ids(model) if stop_on_eos else frozenset()
        self._cache_kw = (
            "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        )
        self._mask_dtype = next(model.parameters()).dtype
        self._seeds = itertools.count(seed * 1_000_003 + 1)
        self._staged: dict[str, StagedWeights] = {}
        self._groups: dict[str, Any] = {}
        self._sched = Scheduler(
            self._forward,
            self.device,
            max_batch_size=max_batch_size,
            max_prefill_tokens=max_prefill_tokens,
            max_context=self.max_context,
            prefix_cache_bytes=prefix_cache_bytes,
            min_prefix_reuse=min_prefix_reuse,
            weight_version=weight_version,
            num_threads=num_threads,
            static_kv=static_layout(self.device, cuda_graphs, static_kv, max_batch_size, self.max_context),
        )

    # ------------------------------------------------------------------ public API

    @property
    def weight_version(self) -> int:
        return self._sched.version

    @property
    def stats(self) -> dict[str, int]:
        """Counters: requests, generated_tokens, prefill_tokens, cached_prompt_tokens, steps."""
        return self._sched.stats

    @property
    def prefix_cache(self) -> PrefixCache:
        return self._sched.prefix_cache

    async def generate(
        self, input_ids: list[int], sampling: SamplingLike = None, *, request_id: str | None = None
    ) -> Generation:
        """Generate one completion; see the module docstring for batching, seeds and versions.

        Bad input raises before the request is queued. Cancelling the call aborts the request.
        Sync code calls ``run_sync(engine.generate(...), timeout_s=..., what=...)``.
        """
        rid = request_id or uuid.uuid4().hex
        fut = self._submit(input_ids, parse_sampling(sampling), rid)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            self._sched.abort(rid)
            raise

    async def generate_stream(
        self, input_ids: list[int], sampling: SamplingLike = None, *, request_id: str | None = None
    ) -> AsyncIterator[TokenDelta | Generation]:
        """Tokens as the engine thread samples them (batched per wake-up), then the Generation.

        Bad input raises before anything is queued; closing or cancelling the iterator early
        aborts the request (the engine frees its row at the next step).
        """
        rid = request_id or uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, float, int] | None] = asyncio.Queue()

        def post(item: tuple[int, float, int] | None) -> None:
            with contextlib.suppress(RuntimeError):  # the caller's loop is gone: nobody listens
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def on_token(t: int, lp: float) -> None:  # in the engine thread, right after sampling t
            post((t, lp, self._sched.version))  # so the scheduler's version is the one that sampled t

        fut = self._submit(input_ids, parse_sampling(sampling), rid, on_token=on_token)
        fut.add_done_callback(lambda _: post(None))  # after every token: one thread posts both, in order
        finished = False
        try:
            while True:
                item = await queue.get()
                items = [item]
                while item is not None and not queue.empty():
                    item = queue.get_nowait()
                    items.append(item)
                toks = [x for x in items if x is not None]
                if toks:
                    yield TokenDelta([x[0] for x in toks], [x[1] for x in toks], [x[2] for x in toks])
                if items[-1] is None:
                    finished = True
                    gen: Generation = await asyncio.wrap_future(fut)
                    yield gen
                    return
        finally:
            if not finished:
                self._sched.abort(rid)

    def _submit(
        self,
        input_ids: list[int],
        params: SamplingParams,
        rid: str,
        on_token: Callable[[int, float], None] | None = None,
    ) -> concurrent.futures.Future[Generation]:
        """Validate and enqueue a request (bad input raises here); the future resolves to its ``Generation``."""
        prompt = self._validate_prompt(input_ids, params)
        gen = torch.Generator(device="cpu")
        gen.manual_seed(params.seed if params.seed is not None else next(self._seeds))
        fut: concurrent.futures.Future[Generation] = concurrent.futures.Future()
        eos = frozenset() if params.ignore_eos else self.eos_token_ids
        req = Request(
            rid, prompt, params, frozenset(params.stop_token_ids) | eos, gen, fut, on_token=on_token
        )
        self._sched.add(req)
        return fut

    async def abort(self, request_id: str) -> bool:
        """Stop a request; its ``generate`` returns the tokens so far with finish_reason "abort"."""
        return self._sched.abort(request_id)

    @property
    def capabilities(self) -> EngineCapabilities:
        """Every path: tensors in this process, a safetensors path, a ``torch.distributed`` group."""
        return EngineCapabilities(state_dict=True, checkpoint=True, distributed=True, adapter=True)

    async def update_weights_from_state_dict(
        self, state_dict: Mapping[str, torch.Tensor], *, version: int | None = None, drain: bool = False
    ) -> int:
        """Copy ``state_dict`` into the model between two decode steps; return the new version.

        Names and shapes are checked before anything is copied (a rejected update leaves the old
        weights). A partial state dict updates only the named tensors. The version becomes
        ``version`` when given, else the current version + 1. With ``drain=False`` (default)
        in-flight requests continue and their later tokens carry the new version; with
        ``drain=True`` admission pauses until running requests finish, then the update applies.
        """
        return await asyncio.wrap_future(self._queue_weights(dict(state_dict), version, drain))

    async def update_weights_from_path(
        self, path: str | os.PathLike[str], *, version: int | None = None, drain: bool = False
    ) -> int:
        """Load a safetensors directory (as ``save_pretrained`` writes it) or file; as above otherwise."""
        # reading a checkpoint must not block the caller's event loop
        tensors = await asyncio.to_thread(load_safetensors_dir, Path(path))
        return await asyncio.wrap_future(self._queue_weights(tensors, version, drain))

    async def update_adapter_from_path(
        self, path: str | os.PathLike[str], *, version: int | None = None, drain: bool = False
    ) -> int:
        """Load a PEFT LoRA adapter directory in place of the current adapter (the base is untouched);
        the first one injects its LoRA layers. Checked against the model first (:class:`LoraError`)."""
        spec, tensors, base = await asyncio.to_thread(read_adapter, Path(path))
        check_adapter_fits(self.model, tensors, str(path), base, spec)

        def apply() -> int:  # the engine thread, between two decode steps
            if lora_spec(self.model) is None:
                apply_lora(self.model, spec)
                self._sched.model_changed()  # new modules: captured decode graphs are stale
            return self._copy_weights(validate_state_dict(self.model, tensors), tensors, version)

        return await asyncio.wrap_future(self._sched.queue_update(apply, drain))

    async def update_weights(
        self,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        *,
        path: str | os.PathLike[str] | None = None,
        version: int | None = None,
        drain: bool = False,
    ) -> int:
        """Shorthand for scripts: exactly one of ``state_dict`` or ``path`` (not part of the protocol)."""
        if (state_dict is None) == (path is None):
            raise WeightUpdateError("update_weights needs exactly one of state_dict=... or path=...")
        if path is not None:
            return await self.update_weights_from_path(path, version=version, drain=drain)
        assert state_dict is not None
        return await self.update_weights_from_state_dict(state_dict, version=version, drain=drain)

    def _queue_weights(
        self, tensors: dict[str, torch.Tensor], version: int | None, drain: bool
    ) -> concurrent.futures.Future[int]:
        """Check the new weights now (raises here), queue them for the engine thread."""
        targets = validate_state_dict(self.model, tensors)
        return self._sched.queue_update(lambda: self._copy_weights(targets, tensors, version), drain)

    async def flush_cache(self) -> None:
        """Drop the prompt-prefix cache (KV that no running request needs)."""
        await asyncio.wrap_future(self._sched.queue_update(self._sched.flush_prefix_cache, drain=False))

    # torch.distributed weight transfer: WeightGroupEngine's hooks (see agentrl.engines.weights)

    async def _join_weight_group(self, join: GroupJoin) -> None:
        """Join a process group with the trainer (rank 0 broadcasts); this engine takes rank ``rank_offset``."""
        from agentrl.engines.weights import init_weight_update_group

        if join.group_name in self._groups:
            raise WeightUpdateError(f"weight update group {join.group_name!r} already exists on this engine")
        self._groups[join.group_name] = await asyncio.to_thread(
            init_weight_update_group,
            join.master_address,
            join.master_port,
            join.rank_offset,
            join.world_size,
            join.backend,
            join.timeout_s,
            join.group_name,
        )

    async def _receive_weights(self, bucket: WeightBucket) -> int:
        """Receive one bucket of tensors broadcast from rank 0; commit all staged buckets when ``flush_cache``.

        Intermediate buckets (``flush_cache=False``) are staged, so no token is ever sampled from a
        half-updated model; the committing call applies them together and bumps the version once.
        """
        from agentrl.engines.weights import receive_bucket

        group_name = bucket.group_name
        group = self._groups.get(group_name)
        if group is None:
            raise WeightUpdateError(
                f"no weight update group {group_name!r}; call init_weights_update_group first "
                f"(known: {sorted(self._groups)})"
            )
        staged = self._staged.setdefault(group_name, StagedWeights())
        timeout_s = _BUCKET_TIMEOUT_S if bucket.timeout_s is None else bucket.timeout_s
        received = await asyncio.to_thread(
            receive_bucket, group, bucket.names, bucket.dtypes, bucket.shapes, timeout_s, self.device
        )
        staged.tensors.update(received)
        version = _as_version(bucket.weight_version)
        if not bucket.flush_cache:
            return self.weight_version
        tensors = self._staged.pop(group_name).tensors
        return await asyncio.wrap_future(self._queue_weights(tensors, version, False))

    async def _leave_weight_group(self, group_name: str) -> None:
        from agentrl.engines.weights import destroy_weight_update_group

        group = self._groups.pop(group_name, None)
        self._staged.pop(group_name, None)
        if group is None:
            raise WeightUpdateError(f"no weight update group {group_name!r} to destroy")
        destroy_weight_update_group(group)

    async def health(self) -> dict[str, Any]:
        counts = self._sched.counts()
        return {
            "status": "closed" if counts["closed"] else "ok",
            "model": self.model_name,
            "weight_version": self.weight_version,
            "running": counts["running"],
            "waiting": counts["waiting"],
            **self.stats,
        }

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.model_name,
            "vocab_size": self.vocab_size,
            "max_context": self.max_context,
            "device": str(self.device),
            "dtype": str(self._mask_dtype).replace("torch.", ""),
            "weight_version": self.weight_version,
        }

    def close(self, timeout: float = 10.0) -> None:
        """Stop the engine thread; pending and running requests end with finish_reason "abort"."""
        self._sched.close(timeout)

    def __enter__(self) -> HFEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ validation

    def _validate_prompt(self, input_ids: Any, params: SamplingParams) -> list[int]:
        if isinstance(input_ids, torch.Tensor):
            input_ids = input_ids.flatten().tolist()
        return check_prompt(
            input_ids, params, vocab_size=self.vocab_size, max_context=self.max_context, whose="the model's"
        )

    def _forward(
        self, input_ids: torch.Tensor, allowed: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """One forward over ``input_ids`` (B, Q) with ``allowed`` (B, Q, K) attention; returns last logits (B, V)."""
        neg = torch.finfo(self._mask_dtype).min
        mask4d = torch.zeros(allowed.shape, dtype=self._mask_dtype, device=self.device).masked_fill_(
            ~allowed, neg
        )
        mask4d = mask4d.unsqueeze(1)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask4d,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kw: cache},
        )
        return out.logits[:, -1, :]

    @torch.no_grad()
    def _copy_weights(
        self, targets: dict[str, torch.Tensor], tensors: Mapping[str, torch.Tensor], version: int | None
    ) -> int:
        """Engine thread only, between two steps: overwrite the weights in place (captured graphs stay valid)."""
        for name, dst in targets.items():
            dst.copy_(tensors[name])
        return self._sched.weights_changed(version)


def _place_model(
    model: Any, device: torch.device, dtype: torch.dtype | None, name: str | None
) -> tuple[str, Any]:
    """``(model name, model on device)``: a name or path is loaded (float32 on CPU unless ``dtype``),
    a module is moved; a model with other than full-attention layers is refused."""
    if isinstance(model, (str, os.PathLike)):
        model_name = name or str(model)
        if dtype is None and device.type == "cpu":
            dtype = torch.float32
        model = load_causal_lm(model, device, dtype)
    else:
        model_name = (
            name or getattr(getattr(model, "config", None), "name_or_path", "") or type(model).__name__
        )
        model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
    layer_types = set(getattr(model.config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise ConfigError(
            f"HFEngine supports full-attention models only; this model has layer types {sorted(layer_types)} "
            "(disable sliding windows in its config, or serve it with SGLang)"
        )
    return model_name, model


def _eos_ids(model: Any) -> frozenset[int]:
    """The model's EOS ids: its generation config's, else its config's."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    return frozenset([eos] if isinstance(eos, int) else list(eos or []))


def _as_version(v: int | str | None) -> int | None:
    if v is None or isinstance(v, int):
        return v
    try:
        return int(v)
    except ValueError:
        raise WeightUpdateError(
            f"weight_version must be an integer (or an integer string), got {v!r}"
        ) from None
