"""The embedded engine: continuous batching over a transformers causal LM, in-process.

One background thread owns the model. Requests arrive from any thread or event
loop; at every iteration the thread (1) applies aborts and weight updates,
(2) admits waiting requests with one left-padded prefill (their first token is
sampled from it), and (3) runs one batched decode step for every running
request. A request leaves the batch the step it finishes. The KV cache of the
running batch is one ``DynamicCache`` whose rows are left-padded to a common
length; an explicit 4-D attention mask hides the padding and each row carries
its own position ids, so a row computes what it would compute alone.

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
import inspect
import itertools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from agentrl.engines.batch import KVBatch, PrefixCache
from agentrl.engines.errors import (
    ContextLengthError,
    EngineRequestError,
    EngineTimeoutError,
    EngineUnavailableError,
    InvalidSamplingError,
    InvalidTokenError,
    WeightUpdateError,
)
from agentrl.engines.protocol import FinishReason, Generation
from agentrl.engines.sampling import SamplingBatch, sample
from agentrl.engines.weights import StagedWeights, load_safetensors_dir, validate_state_dict
from agentrl.errors import ConfigError
from agentrl.types import SamplingParams

__all__ = ["HFEngine", "load_causal_lm", "parse_sampling"]

log = logging.getLogger(__name__)

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


@dataclass(eq=False)
class _Request:
    rid: str
    prompt: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    generator: torch.Generator
    future: concurrent.futures.Future[Generation]
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    abort_requested: bool = False
    arrived: float = field(default_factory=time.monotonic)
    first_token_at: float = 0.0
    cached_tokens: int = 0
    epoch: int = 0  # the engine's KV epoch when prefilled (KV from another epoch is never cached)


@dataclass
class _Update:
    apply: Callable[[], int]
    future: concurrent.futures.Future[int]
    drain: bool


def _resolve(
    fut: concurrent.futures.Future[Any], value: Any = None, exc: BaseException | None = None
) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)


class HFEngine:
    """Continuous-batching engine over a transformers causal LM (see the module docstring).

    ``model`` is a ``PreTrainedModel`` or an agentrl model name / local path / hub id. The
    engine owns the model it is given (it runs forwards on it from its own thread and
    ``update_weights`` writes into it): pass a copy if you keep training the original. ``device`` defaults to CUDA when present, else CPU.
    ``max_batch_size`` bounds the running batch; ``max_prefill_tokens`` bounds one
    prefill (padded tokens); ``stop_on_eos`` also stops at the model's EOS ids;
    ``max_context`` overrides the model's ``max_position_embeddings``;
    ``prefix_cache_bytes`` bounds the KV kept for prompt-prefix reuse (0 disables it); a cached
    prefix is reused when it covers at least ``min_prefix_reuse`` prompt tokens.
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
        if isinstance(model, (str, os.PathLike)):
            self.model_name = name or str(model)
            if dtype is None and self.device.type == "cpu":
                dtype = torch.float32
            model = load_causal_lm(model, self.device, dtype)
        else:
            self.model_name = (
                name or getattr(getattr(model, "config", None), "name_or_path", "") or type(model).__name__
            )
            model = model.to(device=self.device, dtype=dtype) if dtype is not None else model.to(self.device)
        self.model = model.eval()
        config = model.config
        layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
        if layer_types != {"full_attention"}:
            raise ConfigError(
                f"HFEngine supports full-attention models only; this model has layer types {sorted(layer_types)} "
                "(disable sliding windows in its config, or serve it with SGLang)"
            )
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        self.max_context = int(max_context or getattr(config, "max_position_embeddings", 0) or 1 << 30)
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            eos = getattr(config, "eos_token_id", None)
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_token_ids: frozenset[int] = frozenset(eos_ids) if stop_on_eos else frozenset()
        self._cache_kw = (
            "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        )
        self._mask_dtype = next(model.parameters()).dtype
        self._seeds = itertools.count(seed * 1_000_003 + 1)
        self._version = weight_version

        self._cv = threading.Condition()
        self._waiting: list[_Request] = []
        self._running: list[_Request] = []
        self._by_id: dict[str, _Request] = {}
        self._updates: list[_Update] = []
        self._staged: dict[str, StagedWeights] = {}
        self._groups: dict[str, Any] = {}
        self._closed = False
        self._epoch = 0
        self._kv: KVBatch | None = None  # KV of the running batch, rows aligned with self._running
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self.min_prefix_reuse = min_prefix_reuse
        self.stats: dict[str, int] = {
            "requests": 0,
            "generated_tokens": 0,
            "prefill_tokens": 0,
            "cached_prompt_tokens": 0,
            "steps": 0,
        }
        self._thread = threading.Thread(target=self._loop, name="agentrl-hf-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public API

    @property
    def weight_version(self) -> int:
        return self._version

    async def generate(
        self, input_ids: list[int], sampling: SamplingLike = None, *, request_id: str | None = None
    ) -> Generation:
        """Generate one completion; see the module docstring for batching, seeds and versions."""
        fut = self.submit(input_ids, sampling, request_id=request_id)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            self._abort(self._rid_of(fut))
            raise

    def generate_sync(
        self,
        input_ids: list[int],
        sampling: SamplingLike = None,
        *,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> Generation:
        """Blocking ``generate`` for scripts (no event loop needed)."""
        fut = self.submit(input_ids, sampling, request_id=request_id)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            self._abort(self._rid_of(fut))
            raise EngineTimeoutError(
                f"generate did not finish within {timeout} s (request aborted)"
            ) from None

    def submit(
        self,
        input_ids: list[int],
        sampling: SamplingLike = None,
        *,
        request_id: str | None = None,
        ignore_eos: bool = False,
    ) -> concurrent.futures.Future[Generation]:
        """Validate and enqueue a request; the future resolves to its ``Generation``. Bad input raises now.

        ``ignore_eos`` keeps generating past the model's EOS ids (``stop_token_ids`` still stop).
        """
        params = parse_sampling(sampling)
        prompt = self._validate_prompt(input_ids, params)
        rid = request_id or uuid.uuid4().hex
        gen = torch.Generator(device="cpu")
        gen.manual_seed(params.seed if params.seed is not None else next(self._seeds))
        fut: concurrent.futures.Future[Generation] = concurrent.futures.Future()
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if ignore_eos else self.eos_token_ids)
        req = _Request(rid, prompt, params, stop_ids, gen, fut)
        fut.request_id = rid  # type: ignore[attr-defined]
        with self._cv:
            if self._closed:
                raise EngineUnavailableError("the engine is closed; create a new HFEngine")
            if rid in self._by_id:
                raise EngineRequestError(f"request id {rid!r} is already running; use a unique request_id")
            self._by_id[rid] = req
            self._waiting.append(req)
            self.stats["requests"] += 1
            self._cv.notify_all()
        return fut

    async def abort(self, request_id: str) -> bool:
        """Stop a request; its ``generate`` returns the tokens so far with finish_reason "abort"."""
        return self._abort(request_id)

    def abort_sync(self, request_id: str) -> bool:
        return self._abort(request_id)

    async def update_weights(
        self,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        *,
        path: str | os.PathLike[str] | None = None,
        version: int | None = None,
        drain: bool = False,
    ) -> int:
        """Load new weights from an in-memory ``state_dict`` or a safetensors ``path``; return the new version.

        Names and shapes are checked before anything is copied (a rejected update leaves the old
        weights). Partial state dicts update only the named tensors. The version becomes ``version``
        when given, else the current version + 1. With ``drain=False`` (default) in-flight requests
        continue and their later tokens carry the new version; with ``drain=True`` admission pauses
        until running requests finish, then the update applies.
        """
        fut = self.update_weights_future(state_dict, path=path, version=version, drain=drain)
        return await asyncio.wrap_future(fut)

    def update_weights_sync(
        self,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        *,
        path: str | os.PathLike[str] | None = None,
        version: int | None = None,
        drain: bool = False,
        timeout: float | None = None,
    ) -> int:
        fut = self.update_weights_future(state_dict, path=path, version=version, drain=drain)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            raise EngineTimeoutError(f"weight update did not apply within {timeout} s") from None

    def update_weights_future(
        self,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        *,
        path: str | os.PathLike[str] | None = None,
        version: int | None = None,
        drain: bool = False,
    ) -> concurrent.futures.Future[int]:
        if (state_dict is None) == (path is None):
            raise WeightUpdateError("update_weights needs exactly one of state_dict=... or path=...")
        tensors = dict(state_dict) if state_dict is not None else load_safetensors_dir(Path(path))  # type: ignore[arg-type]
        targets = validate_state_dict(self.model, tensors)
        return self._queue_update(lambda: self._copy_weights(targets, tensors, version), drain)

    async def flush_cache(self) -> None:
        """Drop the prompt-prefix cache (KV that no running request needs)."""
        await asyncio.wrap_future(self._queue_update(self._flush, drain=False))

    def _flush(self) -> int:
        self.prefix_cache.clear()
        self._epoch += 1
        return self._version

    async def abort_all(self) -> int:
        """Abort every waiting and running request; returns how many were aborted."""
        with self._cv:
            live = [r for r in self._by_id.values() if not r.future.done()]
            for r in live:
                r.abort_requested = True
            self._cv.notify_all()
        return len(live)

    # torch.distributed weight transfer (the SGLang endpoint names; see agentrl.engines.weights)

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "gloo",
        timeout_s: float = 60.0,
    ) -> None:
        """Join a process group with the trainer (rank 0 broadcasts); this engine takes rank ``rank_offset``."""
        from agentrl.engines.weights import init_weight_update_group

        if group_name in self._groups:
            raise WeightUpdateError(f"weight update group {group_name!r} already exists on this engine")
        self._groups[group_name] = await asyncio.to_thread(
            init_weight_update_group,
            master_address,
            master_port,
            rank_offset,
            world_size,
            backend,
            timeout_s,
            group_name,
        )

    async def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str = "weight_update_group",
        flush_cache: bool = True,
        weight_version: int | str | None = None,
        timeout_s: float = 300.0,
    ) -> int:
        """Receive one bucket of tensors broadcast from rank 0; commit all staged buckets when ``flush_cache``.

        Intermediate buckets (``flush_cache=False``) are staged, so no token is ever sampled from a
        half-updated model; the committing call applies them together and bumps the version once.
        """
        from agentrl.engines.weights import receive_bucket

        group = self._groups.get(group_name)
        if group is None:
            raise WeightUpdateError(
                f"no weight update group {group_name!r}; call init_weights_update_group first "
                f"(known: {sorted(self._groups)})"
            )
        staged = self._staged.setdefault(group_name, StagedWeights())
        received = await asyncio.to_thread(
            receive_bucket, group, names, dtypes, shapes, timeout_s, self.device
        )
        staged.tensors.update(received)
        version = _as_version(weight_version)
        if not flush_cache:
            return self._version
        tensors = self._staged.pop(group_name).tensors
        targets = validate_state_dict(self.model, tensors)
        fut = self._queue_update(lambda: self._copy_weights(targets, tensors, version), False)
        return await asyncio.wrap_future(fut)

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> None:
        from agentrl.engines.weights import destroy_weight_update_group

        group = self._groups.pop(group_name, None)
        self._staged.pop(group_name, None)
        if group is None:
            raise WeightUpdateError(f"no weight update group {group_name!r} to destroy")
        destroy_weight_update_group(group)

    async def health(self) -> dict[str, Any]:
        with self._cv:
            return {
                "status": "closed" if self._closed else "ok",
                "model": self.model_name,
                "weight_version": self._version,
                "running": len(self._running),
                "waiting": len(self._waiting),
                **self.stats,
            }

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.model_name,
            "vocab_size": self.vocab_size,
            "max_context": self.max_context,
            "device": str(self.device),
            "dtype": str(self._mask_dtype).replace("torch.", ""),
            "weight_version": self._version,
        }

    def close(self, timeout: float = 10.0) -> None:
        """Stop the engine thread; pending and running requests end with finish_reason "abort"."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout)

    def __enter__(self) -> HFEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ validation

    def _validate_prompt(self, input_ids: Any, params: SamplingParams) -> list[int]:
        if isinstance(input_ids, torch.Tensor):
            input_ids = input_ids.flatten().tolist()
        if not isinstance(input_ids, (list, tuple)):
            raise InvalidTokenError(f"input_ids must be a list of ints, got {type(input_ids).__name__}")
        if len(input_ids) == 0:
            raise InvalidTokenError("input_ids is empty; a prompt needs at least one token")
        for i, t in enumerate(input_ids):
            if isinstance(t, bool) or not isinstance(t, int):
                raise InvalidTokenError(f"input_ids[{i}] = {t!r} is not an int token id")
            if not 0 <= t < self.vocab_size:
                raise InvalidTokenError(
                    f"input_ids[{i}] = {t} is outside the model's vocabulary [0, {self.vocab_size}); "
                    "was the prompt tokenized with a different tokenizer?"
                )
        total = len(input_ids) + params.max_new_tokens
        if total > self.max_context:
            raise ContextLengthError(
                f"prompt of {len(input_ids)} tokens + max_new_tokens={params.max_new_tokens} = {total} "
                f"exceeds the model's context of {self.max_context} tokens; shorten the prompt or lower "
                "max_new_tokens"
            )
        return list(input_ids)

    @staticmethod
    def _rid_of(fut: concurrent.futures.Future[Generation]) -> str:
        return str(getattr(fut, "request_id", ""))

    # ------------------------------------------------------------------ engine thread

    def _abort(self, rid: str) -> bool:
        with self._cv:
            req = self._by_id.get(rid)
            if req is None or req.future.done():
                return False
            req.abort_requested = True
            self._cv.notify_all()
            return True

    def _queue_update(self, apply: Callable[[], int], drain: bool) -> concurrent.futures.Future[int]:
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()
        with self._cv:
            if self._closed:
                raise EngineUnavailableError("the engine is closed; create a new HFEngine")
            self._updates.append(_Update(apply, fut, drain))
            self._cv.notify_all()
        return fut

    @torch.no_grad()
    def _copy_weights(
        self, targets: dict[str, torch.Tensor], tensors: Mapping[str, torch.Tensor], version: int | None
    ) -> int:
        for name, dst in targets.items():
            dst.copy_(tensors[name])
        self.prefix_cache.clear()  # KV computed by the old weights is never reused by new requests
        self._epoch += 1
        self._version = self._version + 1 if version is None else version
        return self._version

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not (
                    self._closed or self._waiting or self._running or self._updates or self._aborts_pending()
                ):
                    self._cv.wait()
                if self._closed:
                    break
            try:
                self._iteration()
            except Exception as e:  # a model failure must not kill the engine: fail the batch, keep serving
                log.exception("engine step failed")
                self._fail_running(EngineUnavailableError(f"engine step failed: {type(e).__name__}: {e}"))
        self._shutdown()

    def _aborts_pending(self) -> bool:
        return any(r.abort_requested for r in self._by_id.values())

    def _iteration(self) -> None:
        self._apply_aborts()
        draining = self._apply_updates()
        if not draining:
            self._admit()
        if self._running:
            self._decode()

    def _apply_updates(self) -> bool:
        """Apply queued updates in order; return True while a drain update waits for the batch to empty."""
        while True:
            with self._cv:
                if not self._updates:
                    return False
                upd = self._updates[0]
                if upd.drain and self._running:
                    return True
                self._updates.pop(0)
            try:
                _resolve(upd.future, upd.apply())
            except Exception as e:
                _resolve(upd.future, exc=WeightUpdateError(f"weight update failed: {e}"))

    def _apply_aborts(self) -> None:
        with self._cv:
            waiting_aborted = [r for r in self._waiting if r.abort_requested]
            self._waiting = [r for r in self._waiting if not r.abort_requested]
        for r in waiting_aborted:
            self._finish(r, "abort")
        keep = [i for i, r in enumerate(self._running) if not r.abort_requested]
        if len(keep) != len(self._running):
            for i, r in enumerate(self._running):
                if r.abort_requested:
                    self._remember(i)
                    self._finish(r, "abort")
            self._select_rows(keep)

    def _finish(self, req: _Request, reason: FinishReason) -> None:
        gen = Generation(
            output_ids=list(req.output),
            logprobs=list(req.logprobs),
            finish_reason=reason,
            weight_version=self._version,
            weight_versions=list(req.versions),
            request_id=req.rid,
            prompt_tokens=len(req.prompt),
            meta={
                "cached_tokens": req.cached_tokens,
                "queue_s": (req.first_token_at or time.monotonic()) - req.arrived,
                "e2e_s": time.monotonic() - req.arrived,
            },
        )
        with self._cv:
            self._by_id.pop(req.rid, None)
        _resolve(req.future, gen)

    def _fail_running(self, exc: EngineUnavailableError) -> None:
        for r in self._running:
            with self._cv:
                self._by_id.pop(r.rid, None)
            _resolve(r.future, exc=exc)
        self._running = []
        self._kv = None

    def _shutdown(self) -> None:
        with self._cv:
            pending = self._waiting + self._running
            self._waiting = []
        for r in pending:
            self._finish(r, "abort")
        self._running = []
        self._kv = None
        for upd in self._updates:
            _resolve(
                upd.future,
                exc=EngineUnavailableError("the engine was closed before the weight update applied"),
            )

    # -- batching

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

    def _admit(self) -> None:
        with self._cv:
            room = self.max_batch_size - len(self._running)
            batch: list[_Request] = []
            longest = 0
            for r in self._waiting:
                if len(batch) >= room:
                    break
                longest_if = max(longest, len(r.prompt))
                if batch and longest_if * (len(batch) + 1) > self.max_prefill_tokens:
                    break
                batch.append(r)
                longest = longest_if
            self._waiting = self._waiting[len(batch) :]
        if not batch:
            return
        now = time.monotonic()
        for r in batch:
            r.first_token_at = now
            r.epoch = self._epoch
        # Prompts that extend a cached sequence prefill only their suffix, one at a time;
        # the others share one left-padded prefill.
        fresh: list[_Request] = []
        for r in batch:
            hit = self.prefix_cache.lookup(r.prompt, self.min_prefix_reuse)
            if hit is None:
                fresh.append(r)
                continue
            n, kv = hit
            logits, kvb = KVBatch.prefill_suffix(self._forward, kv, r.prompt[n:], self.device)
            self.stats["prefill_tokens"] += len(r.prompt) - n
            self.stats["cached_prompt_tokens"] += n
            r.cached_tokens = n
            self._join([r], kvb, logits)
        if fresh:
            logits, kvb = KVBatch.prefill(self._forward, [r.prompt for r in fresh], self.device)
            self.stats["prefill_tokens"] += sum(len(r.prompt) for r in fresh)
            for i, r in enumerate(fresh):
                self.prefix_cache.put(r.prompt, kvb.row(i))
            self._join(fresh, kvb, logits)

    def _join(self, reqs: list[_Request], kvb: KVBatch, logits: torch.Tensor) -> None:
        """Add freshly prefilled requests to the running batch and sample their first tokens."""
        self._kv = kvb if self._kv is None or not self._running else self._kv.extend(kvb)
        self._running = self._running + reqs
        self._sample_and_advance(logits, reqs)

    def _remember(self, i: int) -> None:
        """Put running row ``i``'s KV (prompt + output but the last token) into the prefix cache."""
        r = self._running[i]
        if self._kv is None or r.epoch != self._epoch or self.prefix_cache.max_bytes <= 0:
            return
        tokens = r.prompt + r.output[:-1]
        if int(self._kv.mask[i].sum()) == len(tokens):
            self.prefix_cache.put(tokens, self._kv.row(i))

    def _select_rows(self, keep: list[int]) -> None:
        """Keep only rows ``keep`` of the running batch."""
        self._kv = self._kv.select(keep) if self._kv is not None else None
        self._running = [self._running[i] for i in keep]

    def _decode(self) -> None:
        assert self._kv is not None
        reqs = self._running
        tokens = torch.tensor([[r.output[-1]] for r in reqs], dtype=torch.long, device=self.device)
        positions = torch.tensor([[len(r.prompt) + len(r.output) - 1] for r in reqs], device=self.device)
        logits = self._kv.decode(self._forward, tokens, positions)
        self.stats["steps"] += 1
        self._sample_and_advance(logits, reqs)

    def _sample_and_advance(self, logits: torch.Tensor, reqs: list[_Request]) -> None:
        """Sample one token for each of ``reqs`` (rows of ``logits``), record it, and retire finished requests."""
        params = SamplingBatch.build(
            [r.params.temperature for r in reqs],
            [r.params.top_p for r in reqs],
            [r.params.top_k for r in reqs],
            device=logits.device,
        )
        uniforms = torch.cat([torch.rand(1, generator=r.generator) for r in reqs])
        toks, lps = sample(logits, params, uniforms)
        version = self._version
        done: list[tuple[_Request, FinishReason]] = []
        for r, t, lp in zip(reqs, toks.tolist(), lps.tolist(), strict=True):
            r.output.append(t)
            r.logprobs.append(lp)
            r.versions.append(version)
            if t in r.stop_ids:
                done.append((r, "stop"))
            elif (
                len(r.output) >= r.params.max_new_tokens or len(r.prompt) + len(r.output) >= self.max_context
            ):
                done.append((r, "length"))
        self.stats["generated_tokens"] += len(reqs)
        if done:
            finished = {id(r) for r, _ in done}
            for i, r in enumerate(self._running):
                if id(r) in finished:
                    self._remember(i)
            for r, reason in done:
                self._finish(r, reason)
            self._select_rows([i for i, r in enumerate(self._running) if id(r) not in finished])


def _as_version(v: int | str | None) -> int | None:
    if v is None or isinstance(v, int):
        return v
    try:
        return int(v)
    except ValueError:
        raise WeightUpdateError(
            f"weight_version must be an integer (or an integer string), got {v!r}"
        ) from None
