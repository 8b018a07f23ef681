"""The engine thread: admission, batched prefill and decode, sampling, retirement, updates.

:class:`Scheduler` owns the running batch and every queue. Any thread may add a
request, flag an abort or queue an update (under one condition variable); only the
engine thread touches the model, the KV batch and the prefix cache. Each iteration:
apply aborts, apply queued updates (a ``drain`` update first waits for the running
batch to empty, with admission paused), admit waiting requests (one left-padded
prefill; prompts that extend a cached sequence prefill only their suffix), then one
batched decode step. A request's first token is sampled from its prefill; it leaves
the batch the step it finishes. The running batch's KV is a :class:`KVBatch`, or a
:class:`~agentrl.engines.static_kv.StaticKV` when the scheduler is handed one (fixed-shape
buffers that CUDA graphs replay; kept across an empty batch). A failing step fails the
running requests with :class:`EngineUnavailableError` and the loop keeps serving (the
queues and the loop are :class:`~agentrl.engines.engine_thread.EngineThread`'s).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from agentrl.engines.batch import Forward, KVBatch, PrefixCache
from agentrl.engines.engine_thread import EngineThread, resolve
from agentrl.engines.errors import EngineUnavailableError, WeightUpdateError
from agentrl.engines.protocol import FinishReason, Generation
from agentrl.engines.sampling import SamplingBatch, sample
from agentrl.engines.static_kv import StaticKV
from agentrl.types import SamplingParams

__all__ = ["Request", "Scheduler", "Update", "resolve"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Request:
    """One generation request and its progress (owned by the engine thread once queued)."""

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
    on_token: Callable[[int, float], None] | None = None
    """Called from the engine thread with each sampled token and its logprob (streaming)."""


@dataclass
class Update:
    """A queued weight update (or cache flush) for the engine thread."""

    apply: Callable[[], int]
    future: concurrent.futures.Future[int]
    drain: bool


class Scheduler(EngineThread[Request, Update]):
    """Runs the engine thread over ``forward`` (see the module docstring)."""

    engine_name = "HFEngine"

    def __init__(
        self,
        forward: Forward,
        device: torch.device,
        *,
        max_batch_size: int,
        max_prefill_tokens: int,
        max_context: int,
        prefix_cache_bytes: int,
        min_prefix_reuse: int,
        weight_version: int,
        num_threads: int | None = None,
        static_kv: StaticKV | None = None,
    ) -> None:
        self.forward = forward
        self.static_kv = static_kv  # when given, the running batch's KV lives there (kept while empty)
        self.num_threads = num_threads
        self.device = device
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.max_context = max_context
        self.min_prefix_reuse = min_prefix_reuse
        self.version = weight_version
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self.stats: dict[str, int] = {
            "requests": 0,
            "generated_tokens": 0,
            "prefill_tokens": 0,
            "cached_prompt_tokens": 0,
            "steps": 0,
        }
        self._init_queues()
        self._epoch = 0  # bumped whenever cached KV becomes invalid (new weights, flush)
        self._kv: KVBatch | StaticKV | None = None  # KV of the running batch, rows aligned with self._running
        self._thread = threading.Thread(target=self._loop, name="agentrl-engine", daemon=True)
        self._thread.start()

    # -- any thread

    def add(self, req: Request) -> None:
        self._enqueue(req, self.stats)

    def counts(self) -> dict[str, Any]:
        with self._cv:
            return {"closed": self._closed, "running": len(self._running), "waiting": len(self._waiting)}

    def close(self, timeout: float) -> None:
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout)

    def abort(self, rid: str) -> bool:
        """Flag a live request for abort (any thread); False if unknown or already finished."""
        return self._flag_abort(rid)

    def queue_update(self, apply: Callable[[], int], drain: bool) -> concurrent.futures.Future[int]:
        """Run ``apply`` in the engine thread between two steps (after the batch empties if ``drain``)."""
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()
        with self._cv:
            if self._closed:
                raise self._closed_error()
            self._updates.append(Update(apply, fut, drain))
            self._cv.notify_all()
        return fut

    def weights_changed(self, version: int | None) -> int:
        """Record new weights (engine thread only): drop old-weight KV, set and return the version."""
        self.prefix_cache.clear()  # KV computed by the old weights is never reused by new requests
        self._epoch += 1
        self.version = self.version + 1 if version is None else version
        return self.version

    def model_changed(self) -> None:
        """The model's modules were replaced (LoRA injected): captured decode graphs are stale."""
        if self.static_kv is not None:
            self.static_kv.invalidate()

    def flush_prefix_cache(self) -> int:
        self.prefix_cache.clear()
        self._epoch += 1
        return self.version

    def _loop(self) -> None:
        if self.num_threads:
            torch.set_num_threads(self.num_threads)  # this thread's intra-op team only
        super()._loop()

    def _has_work(self) -> bool:
        return super()._has_work() or any(r.abort_requested for r in self._by_id.values())

    @torch.no_grad()  # inference only: no autograd graph may link the KV cache across steps
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
                resolve(upd.future, upd.apply())
            except Exception as e:
                resolve(upd.future, exc=WeightUpdateError(f"weight update failed: {e}"))

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

    def _finish(self, req: Request, reason: FinishReason) -> None:
        gen = Generation(
            output_ids=list(req.output),
            logprobs=list(req.logprobs),
            finish_reason=reason,
            weight_version=self.version,
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
        resolve(req.future, gen)

    def _fail_running(self, exc: EngineUnavailableError) -> None:
        super()._fail_running(exc)
        self._kv = None

    def _shutdown(self) -> None:
        super()._shutdown()
        self._kv = None

    def _admit(self) -> None:
        with self._cv:
            room = self.max_batch_size - len(self._running)
            batch: list[Request] = []
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
        fresh: list[Request] = []
        for r in batch:
            hit = self.prefix_cache.lookup(r.prompt, self.min_prefix_reuse)
            if hit is None:
                fresh.append(r)
                continue
            n, kv = hit
            logits, kvb = KVBatch.prefill_suffix(self.forward, kv, r.prompt[n:], self.device)
            self.stats["prefill_tokens"] += len(r.prompt) - n
            self.stats["cached_prompt_tokens"] += n
            r.cached_tokens = n
            self._join([r], kvb, logits)
        if fresh:
            # Identical prompts (a GRPO group arriving together) are prefilled once and share it.
            unique: dict[tuple[int, ...], int] = {}
            for r in fresh:
                unique.setdefault(tuple(r.prompt), len(unique))
            logits, kvb = KVBatch.prefill(self.forward, [list(p) for p in unique], self.device)
            self.stats["prefill_tokens"] += sum(len(p) for p in unique)
            for i, p in enumerate(unique):
                self.prefix_cache.put(p, kvb.row(i))
            rows = [unique[tuple(r.prompt)] for r in fresh]
            if len(unique) < len(fresh):
                first_use: set[int] = set()
                for r, row in zip(fresh, rows, strict=True):
                    if row in first_use:
                        r.cached_tokens = len(r.prompt)
                        self.stats["cached_prompt_tokens"] += len(r.prompt)
                    first_use.add(row)
                shared = kvb.select(rows)
                assert shared is not None
                kvb, logits = shared, logits[rows]
            self._join(fresh, kvb, logits)

    def _join(self, reqs: list[Request], kvb: KVBatch, logits: torch.Tensor) -> None:
        """Add freshly prefilled requests to the running batch and sample their first tokens."""
        if self._kv is not None and self._running:
            self._kv = self._kv.extend(kvb)
        else:
            self._kv = kvb if self.static_kv is None else self.static_kv.start(kvb)
        self._running = self._running + reqs
        self._sample_and_advance(logits, reqs)

    def _remember(self, i: int) -> None:
        """Put running row ``i``'s KV (prompt + output but the last token) into the prefix cache."""
        r = self._running[i]
        if self._kv is None or r.epoch != self._epoch or self.prefix_cache.max_bytes <= 0:
            return
        tokens = r.prompt + r.output[:-1]
        if self._kv.length(i) == len(tokens):
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
        logits = self._kv.decode(self.forward, tokens, positions)
        self.stats["steps"] += 1
        self._sample_and_advance(logits, reqs)

    def _sample_and_advance(self, logits: torch.Tensor, reqs: list[Request]) -> None:
        """Sample one token for each of ``reqs`` (rows of ``logits``), record it, and retire finished requests."""
        params = SamplingBatch.build(
            [r.params.temperature for r in reqs],
            [r.params.top_p for r in reqs],
            [r.params.top_k for r in reqs],
            device=logits.device,
        )
        uniforms = torch.cat([torch.rand(1, generator=r.generator) for r in reqs])
        toks, lps = sample(logits, params, uniforms)
        version = self.version
        done: list[tuple[Request, FinishReason]] = []
        for r, t, lp in zip(reqs, toks.tolist(), lps.tolist(), strict=True):
            r.output.append(t)
            r.logprobs.append(lp)
            r.versions.append(version)
            if r.on_token is not None:
                try:
                    r.on_token(t, lp)
                except Exception:  # a listener's failure never stops the batch
                    log.exception("on_token listener of request %s failed", r.rid)
                    r.on_token = None
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
