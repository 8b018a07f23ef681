"""A simulated engine for benchmarks: continuous batching whose decode step costs ``a + b * n`` seconds.

**This is a simulation, not a model.** :class:`SimulatedEngine` keeps the whole
:class:`~agentrl.engines.Engine` contract (continuous batching, seeds, stop ids, logprobs,
per-token weight versions, abort, deadlines, weight updates) but computes nothing: each
decode step samples one token for every running request from one fixed categorical
distribution, then waits until ``step_s + per_request_s * n_running`` seconds have passed
since the step began. That is a GPU-like cost (a fixed per-step latency that dominates),
where an engine on a CPU costs time that grows with the batch and hides the scheduling
bubbles an async-rollout benchmark is meant to measure. Use it for benchmarks of what sits
around an engine (the rollout loop, the session server), never for training.

What is simulated, and how:

- **The model** is :class:`SimulatedLM` (:mod:`agentrl.engines.simulated_model`): one logits
  vector ``(V,)`` used at every position (default: a seeded Zipf distribution). Its forward is
  ``check_engine``'s teacher-forced reference; weight updates overwrite the vector.
- **Decoding** runs in one engine thread (as in ``HFEngine``), so the engine serves any event
  loop: a long-lived one in a thread, or ``run_sync``'s fresh one per call. A request joins
  the running batch at the next step (up to ``max_batch_size``; the rest wait in order) and
  leaves the step it finishes; its tokens are published at the end of that step. Prefill is
  not simulated: the first token comes from the first step after arrival.
- **Sampling** draws from the categorical under the request's temperature / top-k / top-p
  with one uniform per token from its own ``random.Random`` (``SamplingParams.seed``, else the
  engine's seed sequence), so a request's tokens do not depend on what else is batched.
- **Lengths**: with ``output_lengths`` (e.g. :class:`LogNormalLengths`), each request draws
  its natural length from its own generator before its first token; when it reaches that
  length the engine places the first of ``sampling.stop_token_ids`` as its last token, with
  logprob 0 (the simulated model put all its mass there). Without stop ids it runs to
  ``max_new_tokens`` (``"length"``). A stop id sampled from the categorical also ends the
  request, as in any engine. Without ``output_lengths`` only sampled stop ids and
  ``max_new_tokens`` end a request.
- **Weight updates** (state dict or safetensors path) are applied by the engine thread
  between two steps, after waiting ``update_s`` seconds (decoding stalls meanwhile), so
  every token carries the version in force when its step sampled it. The distributed path is
  not served (``capabilities.distributed`` is False; :class:`WeightGroupEngine`'s calls refuse it).

``stats`` accounts the simulated time: ``simulated_s`` is the sum of every step's
``step_s + per_request_s * n``, and ``overrun_steps`` counts the steps whose sampling took
longer than their simulated cost (the machine could not keep the pace; the step then took
its real time).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import itertools
import logging
import math
import os
import random
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentrl.engines.engine_thread import EngineThread, resolve
from agentrl.engines.errors import (
    EngineUnavailableError,
    InvalidSamplingError,
    WeightUpdateError,
)
from agentrl.engines.hf import SamplingLike, parse_sampling
from agentrl.engines.protocol import EngineCapabilities, FinishReason, Generation, check_prompt
from agentrl.engines.simulated_model import (
    Distribution,
    LengthFn,
    LogNormalLengths,
    SimulatedLM,
    check_logits,
    zipf_logits,
)
from agentrl.engines.weight_groups import WeightGroupEngine
from agentrl.engines.weights import load_safetensors_dir, validate_state_dict
from agentrl.errors import ConfigError
from agentrl.types import SamplingParams

__all__ = ["LengthFn", "LogNormalLengths", "SimulatedEngine", "SimulatedLM"]

log = logging.getLogger(__name__)

_MAX_DISTRIBUTIONS = 16  # sampling settings whose filtered distribution is kept (a few in practice)


@dataclass(eq=False)
class _Request:
    rid: str
    prompt_tokens: int
    params: SamplingParams
    rng: random.Random
    length: int | None  # the natural length drawn from output_lengths, if any
    future: concurrent.futures.Future[Generation]
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    abort_requested: bool = False
    arrived: float = field(default_factory=time.monotonic)
    first_step: int = 0


@dataclass
class _Update:
    tensors: dict[str, torch.Tensor]
    version: int | None
    future: concurrent.futures.Future[int]


class SimulatedEngine(WeightGroupEngine, EngineThread[_Request, _Update]):
    """A simulated continuous-batching engine for benchmarks (see the module docstring).

    ``vocab_size``: token ids are ``[0, vocab_size)`` (give a tokenizer's ``len(tokenizer)`` to
    serve behind a session manager). A decode step over ``n`` running requests costs
    ``step_s + per_request_s * n`` seconds; a weight update costs ``update_s``.
    ``output_lengths`` draws each request's natural length (``None``: only sampled stop ids and
    ``max_new_tokens`` end it). ``logits`` are the simulated model's weights (default: a Zipf
    distribution seeded by ``seed``, which also seeds requests without their own seed).
    """

    engine_name = "SimulatedEngine"
    step_failed = "simulated engine step failed"

    def __init__(
        self,
        vocab_size: int,
        *,
        step_s: float = 0.02,
        per_request_s: float = 0.0002,
        output_lengths: LengthFn | None = None,
        max_batch_size: int = 256,
        max_context: int = 32768,
        update_s: float = 0.0,
        logits: torch.Tensor | None = None,
        seed: int = 0,
        weight_version: int = 0,
    ) -> None:
        costs = {"step_s": step_s, "per_request_s": per_request_s, "update_s": update_s}
        bad = {k: v for k, v in costs.items() if not (math.isfinite(v) and v >= 0)}
        if bad:
            raise ConfigError(f"SimulatedEngine costs must be finite seconds >= 0, got {bad}")
        if vocab_size < 2 or max_batch_size < 1 or max_context < 2:
            raise ConfigError(
                f"SimulatedEngine needs vocab_size >= 2, max_batch_size >= 1 and max_context >= 2, got "
                f"{vocab_size}, {max_batch_size} and {max_context}"
            )
        self.vocab_size, self.max_context, self.max_batch_size = vocab_size, max_context, max_batch_size
        self.step_s, self.per_request_s, self.update_s = step_s, per_request_s, update_s
        self.output_lengths = output_lengths
        if logits is None:
            logits = zipf_logits(vocab_size, seed)
        self._model = SimulatedLM(logits)
        try:
            check_logits({"logits": self._model.logits.data}, vocab_size)
        except WeightUpdateError as e:
            raise ConfigError(f"SimulatedEngine(logits=...): {e}") from None
        self._version = weight_version
        self._seeds = itertools.count(seed * 1_000_003 + 1)
        self._dists: dict[tuple[float, float, int], Distribution] = {}
        self._stats: dict[str, float] = {
            "requests": 0,
            "generated_tokens": 0,
            "steps": 0,
            "simulated_s": 0.0,
            "overrun_steps": 0,
            "updates": 0,
        }
        self._init_queues()
        self._stop = threading.Event()  # set by close(): ends a step's or an update's wait early
        self._thread = threading.Thread(target=self._loop, name="agentrl-simulated-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public API

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def capabilities(self) -> EngineCapabilities:
        """A state dict or a safetensors path; no ``torch.distributed`` group (nothing to broadcast to)."""
        return EngineCapabilities(state_dict=True, checkpoint=True, distributed=False)

    @property
    def stats(self) -> dict[str, float]:
        """Counters: requests, generated_tokens, steps, simulated_s, overrun_steps, updates."""
        return dict(self._stats)

    async def generate(
        self, input_ids: list[int], sampling: SamplingLike = None, *, request_id: str | None = None
    ) -> Generation:
        """Generate one simulated completion; bad input raises before queueing, cancelling aborts it."""
        rid = request_id or uuid.uuid4().hex
        fut = self._submit(input_ids, parse_sampling(sampling), rid)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            self._flag_abort(rid)
            raise

    async def abort(self, request_id: str) -> bool:
        """Stop a request at the next step; its ``generate`` returns the tokens so far with ``"abort"``."""
        return self._flag_abort(request_id)

    async def health(self) -> dict[str, Any]:
        with self._cv:
            running, waiting, closed = len(self._running), len(self._waiting), self._closed
        return {
            "status": "closed" if closed else "ok",
            "model": "simulated",
            "simulated": True,
            "weight_version": self.weight_version,
            "running": running,
            "waiting": waiting,
            **self.stats,
        }

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": "simulated",
            "simulated": True,
            "vocab_size": self.vocab_size,
            "max_context": self.max_context,
            "max_batch_size": self.max_batch_size,
            "step_s": self.step_s,
            "per_request_s": self.per_request_s,
            "update_s": self.update_s,
            "weight_version": self.weight_version,
        }

    def reference_model(self) -> SimulatedLM:
        """A copy of the simulated model as it is now (the teacher-forced reference for ``check_engine``)."""
        with self._cv:
            return copy.deepcopy(self._model)

    async def update_weights_from_state_dict(
        self, state_dict: Mapping[str, torch.Tensor], *, version: int | None = None
    ) -> int:
        """Queue new logits (``{"logits": (V,)}``) for the next step boundary; return the new version.

        Checked here (a rejected update raises ``WeightUpdateError`` and changes nothing); the
        engine thread waits ``update_s``, overwrites the logits and sets the version atomically
        for the sampler: tokens of the step before carry the old version, of the step after the new.
        """
        tensors = dict(state_dict)
        validate_state_dict(self._model, tensors)
        check_logits(tensors, self.vocab_size)
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()
        with self._cv:
            if self._closed:
                raise self._closed_error()
            self._updates.append(
                _Update({k: t.detach().float().cpu() for k, t in tensors.items()}, version, fut)
            )
            self._cv.notify_all()
        return await asyncio.wrap_future(fut)

    async def update_weights_from_path(
        self, path: str | os.PathLike[str], *, version: int | None = None
    ) -> int:
        """Read a safetensors directory or file holding ``logits``; as above otherwise."""
        tensors = await asyncio.to_thread(load_safetensors_dir, Path(path))
        return await self.update_weights_from_state_dict(tensors, version=version)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the engine thread; waiting and running requests end with ``"abort"``."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._stop.set()
        self._thread.join(timeout)

    def __enter__(self) -> SimulatedEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ caller side

    def _submit(
        self, input_ids: Any, params: SamplingParams, rid: str
    ) -> concurrent.futures.Future[Generation]:
        """Validate and enqueue a request (bad input raises here, in the caller)."""
        prompt_tokens = self._validate(input_ids, params)
        rng = random.Random(params.seed if params.seed is not None else next(self._seeds))
        length = self._draw_length(rng) if self.output_lengths is not None else None
        fut: concurrent.futures.Future[Generation] = concurrent.futures.Future()
        self._enqueue(_Request(rid, prompt_tokens, params, rng, length, fut), self._stats)
        return fut

    def _draw_length(self, rng: random.Random) -> int:
        assert self.output_lengths is not None
        n = self.output_lengths(rng)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"output_lengths returned {n!r}; it must return an int >= 1 (tokens)")
        return n

    def _validate(self, input_ids: Any, params: SamplingParams) -> int:
        ids = check_prompt(
            input_ids, params, vocab_size=self.vocab_size, max_context=self.max_context, whose="the simulated"
        )
        bad_stops = [t for t in params.stop_token_ids if not 0 <= t < self.vocab_size]
        if bad_stops:
            raise InvalidSamplingError(
                f"stop_token_ids {bad_stops} are outside the simulated vocabulary [0, {self.vocab_size})"
            )
        return len(ids)

    # ------------------------------------------------------------------ engine thread

    def _iteration(self) -> None:
        """Apply updates, retire aborted requests, admit waiting ones, then one decode step."""
        self._apply_updates()
        with self._cv:
            aborted = [r for r in self._waiting + self._running if r.abort_requested]
            self._waiting = [r for r in self._waiting if not r.abort_requested]
            self._running = [r for r in self._running if not r.abort_requested]
            room = self.max_batch_size - len(self._running)
            self._running += self._waiting[:room]
            self._waiting = self._waiting[room:]
        for r in aborted:
            self._finish(r, "abort")
        if self._running:
            self._step()

    # Not the Scheduler's: a simulated update waits update_s and overwrites the logits; nothing drains.
    def _apply_updates(self) -> None:
        while True:
            with self._cv:
                if not self._updates:
                    return
                upd = self._updates.pop(0)
            if self.update_s > 0 and self._stop.wait(self.update_s):
                resolve(
                    upd.future, exc=EngineUnavailableError("the engine was closed during a weight update")
                )
                return
            with self._cv:  # atomic for the sampler (this thread) and for reference_model()
                self._model.logits.data.copy_(upd.tensors["logits"])
                self._dists.clear()
                self._version = self._version + 1 if upd.version is None else upd.version
                self._stats["updates"] += 1
                version = self._version
            resolve(upd.future, version)

    def _step(self) -> None:
        """Sample one token for every running request, wait out the step's cost, then publish."""
        start = time.monotonic()
        reqs = self._running
        cost = self.step_s + self.per_request_s * len(reqs)
        version = self._version
        self._stats["steps"] += 1
        step = int(self._stats["steps"])
        done: list[tuple[_Request, FinishReason]] = []
        for r in reqs:
            r.first_step = r.first_step or step
            token, logprob, reason = self._next_token(r)
            r.output.append(token)
            r.logprobs.append(logprob)
            r.versions.append(version)
            if reason is not None:
                done.append((r, reason))
        self._stats["generated_tokens"] += len(reqs)
        self._stats["simulated_s"] += cost
        left = start + cost - time.monotonic()
        if left > 0:
            self._stop.wait(left)
        else:
            self._stats["overrun_steps"] += 1
        finished = {id(r) for r, _ in done}
        with self._cv:
            self._running = [r for r in self._running if id(r) not in finished]
        for r, reason in done:
            self._finish(r, reason, last_step=step)

    def _next_token(self, r: _Request) -> tuple[int, float, FinishReason | None]:
        n = len(r.output) + 1  # this token's position in the output
        stops = r.params.stop_token_ids
        if r.length is not None and n >= r.length and stops:
            return stops[0], 0.0, "stop"  # the simulated model ends the request here
        token, logprob = self._distribution(r.params).draw(r.rng.random())
        if token in stops:
            return token, logprob, "stop"
        if n >= r.params.max_new_tokens:  # prompt + max_new_tokens fits the context (checked on submit)
            return token, logprob, "length"
        return token, logprob, None

    def _distribution(self, params: SamplingParams) -> Distribution:
        key = (params.temperature, params.top_p, params.top_k)
        dist = self._dists.get(key)
        if dist is None:
            if len(self._dists) >= _MAX_DISTRIBUTIONS:
                self._dists.clear()
            dist = self._dists[key] = Distribution.build(self._model.logits.data, params)
        return dist

    def _forget(self, r: _Request) -> None:
        with self._cv:
            self._by_id.pop(r.rid, None)

    def _finish(self, r: _Request, reason: FinishReason, last_step: int = 0) -> None:
        self._forget(r)
        resolve(
            r.future,
            Generation(
                output_ids=list(r.output),
                logprobs=list(r.logprobs),
                finish_reason=reason,
                weight_version=self._version,
                weight_versions=list(r.versions),
                request_id=r.rid,
                prompt_tokens=r.prompt_tokens,
                meta={
                    "simulated": True,
                    "first_step": r.first_step,
                    "last_step": last_step or int(self._stats["steps"]),
                    "e2e_s": time.monotonic() - r.arrived,
                },
            ),
        )
