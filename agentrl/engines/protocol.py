"""The Engine protocol: token ids in, sampled token ids with logprobs out; the whole contract.

Engines never see chat text; the session server owns tokenization. Every sampled token
carries the weight version that produced it, so the trainer can bound staleness and
correct off-policy tokens. The trainer, the session server and weight sync
(:mod:`agentrl.trainer.weight_sync`) call an engine only through :class:`Engine`;
:func:`agentrl.engines.checker.check_engine` verifies an implementation against it.

**Async first; one way for sync callers.** Every operation that may wait is a
coroutine, because the session server is an asyncio server and a remote engine is an
HTTP client. Sync code (the train loop, weight sync, scripts) calls
:func:`run_sync`, which runs one coroutine to completion on a fresh event loop in the
calling thread, under a deadline, and raises :class:`EngineTimeoutError` naming the
operation when it passes. Engines therefore must not bind state to one event loop for
their lifetime (``HFEngine`` runs its own thread; ``SGLangEngine`` keeps one HTTP pool
per loop). ``run_sync`` refuses to run inside a running loop (await the coroutine there).

**Weight updates.** Three transports, each with its own typed method; an engine states
which it serves in :attr:`Engine.capabilities`, and the trainer checks that with
:func:`require_capability` when it is configured, so an unsupported path fails before
any training with :class:`UnsupportedWeightUpdateError`, never mid-run:

- ``state_dict``: tensors in this process (the engine copies them into its weights);
- ``checkpoint``: a safetensors directory (or file) the engine can read;
- ``distributed``: a ``torch.distributed`` group the engine joins
  (``init_weights_update_group``), then buckets announced by name/dtype/shape and
  broadcast from rank 0 (``update_weights_from_distributed``; the bucket with
  ``flush_cache=True`` commits them all), then ``destroy_weights_update_group``.

Version semantics, the same on every path: an accepted update sets the version to
``version`` when given, else to the current version + 1, atomically for the sampler
(no token is sampled from a half-updated model), and returns it. A rejected update
raises :class:`WeightUpdateError` and leaves the old weights and version.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, runtime_checkable

from agentrl.engines.errors import (
    ContextLengthError,
    EngineError,
    EngineTimeoutError,
    InvalidTokenError,
    UnsupportedWeightUpdateError,
)
from agentrl.types import SamplingParams

if TYPE_CHECKING:
    import torch

__all__ = [
    "Engine",
    "EngineCapabilities",
    "FinishReason",
    "Generation",
    "StreamingEngine",
    "TokenDelta",
    "WeightPath",
    "check_prompt",
    "require_capability",
    "run_sync",
    "stream_generate",
]

FinishReason = Literal["stop", "length", "abort"]
WeightPath = Literal["state_dict", "checkpoint", "distributed", "adapter"]
T = TypeVar("T")


@dataclass
class Generation:
    """The result of one ``generate`` call.

    ``logprobs[i]`` is the log-probability of ``output_ids[i]`` under the
    distribution it was sampled from (see docs/engines.md). ``weight_versions[i]``
    is the engine's weight version when token ``i`` was sampled, where the engine
    knows it (in-process engines, vLLM's spans, ``agentrl serve-engine``); a server
    that reports no per-token versions (a real SGLang) gets every token labelled
    with the version when the request was sent, the oldest that can have sampled
    it. Either way a label is never newer than the weights that sampled the token.
    ``weight_version`` is the version at the end of the request.
    """

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    weight_version: int
    weight_versions: list[int] = field(default_factory=list)
    request_id: str = ""
    prompt_tokens: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class TokenDelta:
    """Tokens sampled since the previous delta of a streamed generation (``logprobs`` aligned)."""

    output_ids: list[int]
    logprobs: list[float]
    weight_versions: list[int] = field(default_factory=list)
    """The version that sampled each token, where the engine says so as it streams (``HFEngine``);
    empty otherwise (the final :class:`Generation` labels every token)."""


@dataclass(frozen=True)
class EngineCapabilities:
    """Which weight-update paths an engine serves (see the module docstring)."""

    state_dict: bool
    """``update_weights_from_state_dict``: only an engine in the trainer's process."""
    checkpoint: bool
    """``update_weights_from_path``: a path on a file system the engine can read."""
    distributed: bool
    """``init_weights_update_group`` + ``update_weights_from_distributed`` + ``destroy_weights_update_group``."""
    adapter: bool = False
    """``update_adapter_from_path``: a LoRA adapter directory in PEFT's format (:mod:`agentrl.models.lora`),
    loaded in place of the previous one, atomic and versioned like a weight update."""

    def supports(self, path: WeightPath) -> bool:
        return bool(getattr(self, path))


@runtime_checkable
class Engine(Protocol):
    """What every inference engine offers (embedded HF engine, SGLang client, ...).

    ``isinstance(x, Engine)`` checks names only; :func:`~agentrl.engines.checker.check_engine`
    checks behaviour.
    """

    @property
    def weight_version(self) -> int:
        """The version of the weights new tokens are sampled from (the count of updates, unless set)."""
        ...

    @property
    def capabilities(self) -> EngineCapabilities: ...

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, request_id: str | None = None
    ) -> Generation:
        """Sample a completion of ``input_ids``; bad input raises ``EngineRequestError`` before queueing."""
        ...

    async def abort(self, request_id: str) -> bool:
        """Stop a request; its ``generate`` returns the tokens so far with finish reason ``"abort"``."""
        ...

    async def health(self) -> dict[str, Any]:
        """At least ``{"status": "ok" | ...}``; never raises for an unhealthy engine that answered."""
        ...

    async def update_weights_from_state_dict(
        self, state_dict: Mapping[str, torch.Tensor], *, version: int | None = None
    ) -> int: ...

    async def update_weights_from_path(
        self, path: str | os.PathLike[str], *, version: int | None = None
    ) -> int: ...

    # The contract; engine classes inherit one implementation from engines/weight_groups.py.
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
        """Join the group as ``rank_offset``; rank 0 (the trainer) broadcasts."""
        ...

    async def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str = "weight_update_group",
        flush_cache: bool = True,
        weight_version: int | None = None,
        timeout_s: float = 300.0,
    ) -> int:
        """Receive one bucket (rank 0 broadcasts it meanwhile); ``flush_cache`` commits all staged buckets."""
        ...

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> None: ...

    def close(self) -> None:
        """Release this side's resources (threads, connections); a remote engine keeps running."""
        ...


@runtime_checkable
class StreamingEngine(Protocol):
    """An engine that yields tokens as it samples them (see the module docstring)."""

    def generate_stream(
        self, input_ids: list[int], sampling: SamplingParams, *, request_id: str | None = None
    ) -> AsyncIterator[TokenDelta | Generation]:
        """:class:`TokenDelta` items in sampling order, then the :class:`Generation` (its
        ``output_ids`` are the deltas' concatenation); closing the iterator aborts the request."""
        ...


async def stream_generate(
    engine: Engine, input_ids: list[int], sampling: SamplingParams, *, request_id: str | None = None
) -> AsyncGenerator[TokenDelta | Generation, None]:
    """Stream from any engine: its ``generate_stream`` if it has one, else one delta after ``generate``."""
    if isinstance(engine, StreamingEngine):
        stream = engine.generate_stream(input_ids, sampling, request_id=request_id)
        try:
            async for item in stream:
                yield item
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        return
    gen = await engine.generate(input_ids, sampling, request_id=request_id)
    yield TokenDelta(list(gen.output_ids), [float(x) for x in gen.logprobs])
    yield gen


def require_capability(engine: Engine, path: WeightPath, what: str) -> None:
    """Raise :class:`UnsupportedWeightUpdateError` now if ``engine`` cannot serve ``path``.

    Called when the trainer is configured (``make_sync``), so the failure names the setting
    instead of surfacing after the first train step.
    """
    caps = engine.capabilities
    if not caps.supports(path):
        served = [p for p in ("state_dict", "checkpoint", "distributed") if caps.supports(p)]
        raise UnsupportedWeightUpdateError(
            f"{what} needs weight updates by {path}, which {type(engine).__name__} does not serve "
            f"(it serves: {', '.join(served) or 'none'}); choose a weight sync that uses one of those"
        )


def run_sync(coro: Coroutine[Any, Any, T], *, timeout_s: float, what: str) -> T:
    """Run one engine coroutine from sync code under a deadline (see the module docstring)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        coro.close()
        raise EngineError(f"{what} was called through run_sync inside a running event loop; await it instead")

    async def bounded() -> T:
        try:
            return await asyncio.wait_for(coro, timeout_s)
        except TimeoutError:
            raise EngineTimeoutError(f"{what} did not finish within {timeout_s} s") from None

    return asyncio.run(bounded())


def check_prompt(
    input_ids: Any, sampling: SamplingParams, *, vocab_size: int, max_context: int, whose: str
) -> list[int]:
    """The prompt as a list of token ids, or the engine error every engine raises for it.

    ``InvalidTokenError`` for a non-list, an empty prompt, a non-int or an id outside
    ``[0, vocab_size)``; ``ContextLengthError`` when prompt + ``max_new_tokens`` exceeds
    ``max_context``. ``whose`` names the vocabulary/context in messages ("the model's").
    """
    if not isinstance(input_ids, (list, tuple)):
        raise InvalidTokenError(f"input_ids must be a list of ints, got {type(input_ids).__name__}")
    if len(input_ids) == 0:
        raise InvalidTokenError("input_ids is empty; a prompt needs at least one token")
    for i, t in enumerate(input_ids):
        if isinstance(t, bool) or not isinstance(t, int):
            raise InvalidTokenError(f"input_ids[{i}] = {t!r} is not an int token id")
        if not 0 <= t < vocab_size:
            raise InvalidTokenError(
                f"input_ids[{i}] = {t} is outside {whose} vocabulary [0, {vocab_size}); "
                "was the prompt tokenized with a different tokenizer?"
            )
    total = len(input_ids) + sampling.max_new_tokens
    if total > max_context:
        raise ContextLengthError(
            f"prompt of {len(input_ids)} tokens + max_new_tokens={sampling.max_new_tokens} = {total} "
            f"exceeds {whose} context of {max_context} tokens; shorten the prompt or lower max_new_tokens"
        )
    return list(input_ids)
