"""The static KV layout of the running batch: fixed-shape buffers the decode step writes in place.

Why: in the dynamic layout (:class:`~agentrl.engines.batch.KVBatch`) every decode step has a
new KV length and often a new batch size, so on CUDA a small-batch decode step is bound by
kernel launches and cannot be replayed as a CUDA graph. :class:`StaticKV` keeps the running
batch's KV in preallocated buffers instead, so every decode step with the same padded batch
size sees the same tensor shapes and addresses. Prefill stays dynamic (its shapes vary by
nature): a prefilled :class:`KVBatch` joins by copying its rows in.

Invariants (kept by :class:`StaticKV`; rows align with the scheduler's running list):

- Per layer, ``keys`` and ``values`` are ``(R, H, C, D)`` in the model's dtype on the engine's
  device: ``R`` rows (a :func:`bucket`), ``C`` capacity columns. They are allocated with zeros,
  never ``empty``: attention reads masked columns with weight 0, and ``0 * NaN`` is ``NaN``.
- Running row ``i`` holds its ``n_i`` cached tokens left-aligned in columns ``[0, n_i)``;
  ``n_i`` is also the column its next token's key/value is written to. Rows join and leave
  without shifting anyone's columns: a joining row is copied into the next free slot; rows
  leaving compact the survivors towards row 0, in order.
- Rows ``[n, b)`` of a step padded to ``b`` rows are padding: length 0, token 0 at position 0.
  They write column 0 of their own slot, attend to it only (finite results, never read) and
  are overwritten when a row joins there.
- A decode step over ``n`` rows runs ``b = bucket(n)`` rows over all ``C`` columns with the mask
  ``column <= n_i``: one shape per ``(b, C)``.
- ``C`` doubles (at least :data:`MIN_CAPACITY`, at most the context) when a row needs column
  ``C``; ``R`` grows to the next bucket. Both reallocate (copying the live rows) and drop the
  captured graphs. Attention reads all ``C`` columns, so when the batch restarts from empty
  needing a quarter of ``C`` or less, the buffers shrink: one long request does not slow every
  later step.

The cache object handed to the model (:class:`RowCache`) writes each row's new key/value at
that row's own column (a scatter), where ``transformers.StaticCache`` writes every row at one
shared ``cache_position``; per-row columns are what let rows of different lengths share a step
without left padding. It is duck-typed (the model calls only ``update(keys, values, layer_idx)``
when it is handed a prepared 4-D mask and explicit positions, as ``HFEngine._forward`` does).

CUDA graphs (``graphs=True``): the step is captured with ``torch.cuda.CUDAGraph`` once per
bucket and replayed, rather than compiled with ``torch.compile(mode="reduce-overhead")``. The
step's shapes are already static per ``(b, C)``, which is all a CUDA graph needs, so capture
costs a few eager forwards (no Dynamo trace of transformers' modelling code, no recompiles or
guard failures on Python-side cache objects, no minutes of compilation per bucket) and fails
in one clear place: a capture that raises logs a warning and the step runs eager from then
on. Each bucket is warmed up eagerly on a side stream before its capture. A decode step is
idempotent in its inputs (it writes the same key/value to the same column), so warm-up runs
on the live batch are harmless. Captured graphs stay valid across weight updates because
``HFEngine._copy_weights`` copies into the same parameter tensors (same addresses); anything
that replaces modules or parameters (injecting LoRA layers) must call :meth:`invalidate`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from agentrl.engines.batch import Forward, KVBatch, LayerKV
from agentrl.errors import ConfigError

__all__ = ["MIN_CAPACITY", "RowCache", "StaticKV", "bucket", "static_layout"]

log = logging.getLogger(__name__)

MIN_CAPACITY = 256
"""Smallest column capacity; capacity grows by doubling from here (capped at the context)."""

_WARMUP_STEPS = 2  # eager runs on a side stream before a bucket's capture (cuBLAS/allocator setup)


def bucket(n: int, max_rows: int) -> int:
    """Padded batch size for ``n`` rows: the next power of two, capped at ``max_rows`` (never below ``n``)."""
    b = 1
    while b < n:
        b *= 2
    return max(n, min(b, max_rows))


def _capacity(need: int, max_context: int) -> int:
    """Columns to allocate for ``need``: a power of two >= :data:`MIN_CAPACITY`, capped at the context."""
    c = MIN_CAPACITY
    while c < need:
        c *= 2
    return max(need, min(c, max_context))


class RowCache:
    """The KV cache object a static decode step hands the model: per-row write columns.

    ``keys``/``values``: per layer ``(b, H, C, D)`` views of :class:`StaticKV`'s buffers;
    ``lengths`` ``(b,)``: the column each row's new key/value goes to. ``update`` scatters the
    step's ``(b, H, 1, D)`` states there and returns the whole buffers (the mask hides the rest).
    """

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], lengths: torch.Tensor) -> None:
        self.keys = keys
        self.values = values
        self.lengths = lengths

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        col = self.lengths.view(-1, 1, 1, 1)
        keys.scatter_(2, col.expand(key_states.shape), key_states)
        values.scatter_(2, col.expand(value_states.shape), value_states)
        return keys, values


class StaticKV:
    """KV of the running batch in fixed-shape buffers (see the module docstring for the invariants).

    Offers what the scheduler uses on :class:`KVBatch`: ``extend`` (prefilled rows join),
    ``select`` (rows leave), ``decode`` (one step), ``row``/``length`` (for the prefix cache).
    Unlike a ``KVBatch`` it is mutated in place and outlives an empty batch (``select([])``
    returns ``None`` but keeps the buffers and graphs for the next :meth:`start`).
    """

    def __init__(self, max_rows: int, max_context: int, *, graphs: bool = False) -> None:
        self.max_rows = max_rows
        self.max_context = max_context
        self.graphs = graphs
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._len: list[int] = []  # cached tokens per running row (host copy; no sync per step)
        self._graphs: dict[int, tuple[Any, torch.Tensor]] = {}  # bucket -> (CUDAGraph, its logits)
        self._pool: Any = None
        self.stats = {"reallocations": 0, "captures": 0}

    def __len__(self) -> int:
        return len(self._len)

    @property
    def rows(self) -> int:
        return self.keys[0].shape[0] if self.keys else 0

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def invalidate(self) -> None:
        """Drop the captured graphs (the model's modules or parameters were replaced, or the buffers moved)."""
        self._graphs.clear()

    def start(self, first: KVBatch) -> StaticKV:
        """Forget every running row, then hold ``first``'s rows (the batch restarts from empty)."""
        self._len = []
        return self.extend(first)

    def extend(self, other: KVBatch) -> StaticKV:
        """Append ``other``'s rows (left-padded, real columns a block ending at its last column)."""
        lens = [int(x) for x in other.mask.sum(1).tolist()]
        layers = other.cache.layers
        n, k, width = len(self._len), len(lens), int(other.mask.shape[1])
        if not self.keys:
            self._allocate(layers, bucket(k, self.max_rows), _capacity(width + 1, self.max_context))
        elif n == 0 and 4 * (width + 1) <= self.capacity and self.capacity > MIN_CAPACITY:
            self._reallocate(self.rows, _capacity(width + 1, self.max_context))  # shrink
        self._ensure(n + k, width + 1)
        device = self.keys[0].device
        pad = torch.tensor([width - x for x in lens], device=device)
        cols = (torch.arange(width, device=device) + pad[:, None]).clamp(max=width - 1)  # (k, width)
        for dst_k, dst_v, layer in zip(self.keys, self.values, layers, strict=True):
            for dst, src in ((dst_k, layer.keys), (dst_v, layer.values)):
                idx = cols[:, None, :, None].expand(k, src.shape[1], width, src.shape[3])
                dst[n : n + k, :, :width] = src.gather(2, idx)  # row j's real block moved to [0, len_j)
        self._len.extend(lens)
        return self

    def select(self, keep: Sequence[int]) -> StaticKV | None:
        """Keep rows ``keep`` (ascending), compacted to rows ``[0, len(keep))``; ``None`` when empty."""
        keep = list(keep)
        if keep != list(range(len(keep))):
            idx = torch.tensor(keep, device=self.keys[0].device)
            width = max((self._len[i] for i in keep), default=0)
            for buf in (*self.keys, *self.values):
                buf[: len(keep), :, :width] = buf[idx, :, :width]  # the right side is a copy: no overlap
        self._len = [self._len[i] for i in keep]
        return self if keep else None

    def length(self, i: int) -> int:
        """Cached tokens of row ``i``."""
        return self._len[i]

    def row(self, i: int) -> LayerKV:
        """Row ``i``'s KV without padding, copied (so it does not pin the buffers)."""
        n = self._len[i]
        return [
            (k[i : i + 1, :, :n].clone(), v[i : i + 1, :, :n].clone())
            for k, v in zip(self.keys, self.values, strict=True)
        ]

    def decode(self, forward: Forward, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (``tokens``, ``positions``: ``(n, 1)``); returns next-token logits ``(n, V)``."""
        n = len(self._len)
        self._ensure(n, max(self._len) + 1)
        b = bucket(n, self.max_rows)
        self._tokens[:n].copy_(tokens)
        self._tokens[n:b].zero_()
        self._positions[:n].copy_(positions)
        self._positions[n:b].zero_()
        lengths = torch.tensor(self._len + [0] * (b - n), dtype=torch.long)
        self._lengths[:b].copy_(lengths, non_blocking=False)
        logits = self._graph_step(forward, b) if self.graphs else self._step(forward, b)
        self._len = [x + 1 for x in self._len]
        return logits[:n]

    # -- internals

    def _step(self, forward: Forward, b: int) -> torch.Tensor:
        """The eager step over padded rows ``[0, b)``: fixed shapes for a given ``(b, C)``."""
        lengths = self._lengths[:b]
        allowed = self._cols <= lengths[:, None, None]  # (b, 1, C): cached columns and the new one
        cache = RowCache([k[:b] for k in self.keys], [v[:b] for v in self.values], lengths)
        return forward(self._tokens[:b], allowed, self._positions[:b], cache)

    def _graph_step(self, forward: Forward, b: int) -> torch.Tensor:
        """Replay bucket ``b``'s CUDA graph, capturing it first; eager (with a warning, once) if capture fails."""
        entry = self._graphs.get(b)
        if entry is None:
            try:
                entry = self._capture(forward, b)
            except Exception as e:  # any capture failure: serve eagerly rather than fail the batch
                log.warning("CUDA graph capture failed for batch bucket %d (%s: %s); decoding eagerly from now on "
                            "(HFEngine(cuda_graphs=False) silences this)", b, type(e).__name__, e)  # fmt: skip
                self.graphs = False
                self._graphs.clear()
                return self._step(forward, b)
            self._graphs[b] = entry
        graph, out = entry
        graph.replay()
        return out

    def _capture(self, forward: Forward, b: int) -> tuple[Any, torch.Tensor]:
        """Warm bucket ``b`` up eagerly on a side stream, then capture one step (all graphs share one pool)."""
        stream = torch.cuda.Stream(self.keys[0].device)
        stream.wait_stream(torch.cuda.current_stream(self.keys[0].device))
        with torch.cuda.stream(stream):
            for _ in range(_WARMUP_STEPS):
                self._step(forward, b)
        torch.cuda.current_stream(self.keys[0].device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA work that other threads of the process (a trainer) do meanwhile is not
        # part of this capture and is not refused by it
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            out = self._step(forward, b)
        self.stats["captures"] += 1
        return graph, out

    def _allocate(self, layers: Any, rows: int, capacity: int) -> None:
        """First allocation, shaped after a prefilled cache's layers (dtype, device, heads, head dim)."""
        self.keys = [self._zeros(layer.keys, rows, capacity) for layer in layers]
        self.values = [self._zeros(layer.values, rows, capacity) for layer in layers]
        self._inputs(rows)

    def _ensure(self, rows: int, columns: int) -> None:
        """Grow so that ``rows`` rows and ``columns`` columns fit (rows to a bucket, columns doubling)."""
        if rows > self.rows or columns > self.capacity:
            new_rows = max(self.rows, bucket(rows, self.max_rows))
            new_cap = self.capacity if columns <= self.capacity else _capacity(columns, self.max_context)
            self._reallocate(new_rows, new_cap)

    def _reallocate(self, rows: int, capacity: int) -> None:
        """New buffers of ``(rows, capacity)`` holding the live rows' KV; captured graphs are dropped."""
        n = len(self._len)
        width = min(max(self._len, default=0), capacity)

        def moved(old: torch.Tensor) -> torch.Tensor:
            new = self._zeros(old, rows, capacity)
            new[:n, :, :width] = old[:n, :, :width]
            return new

        self.keys = [moved(k) for k in self.keys]
        self.values = [moved(v) for v in self.values]
        self._inputs(rows)
        self._graphs.clear()
        self.stats["reallocations"] += 1

    def _inputs(self, rows: int) -> None:
        """The step's input buffers (graphs read them by address, so they are refilled, never replaced)."""
        device = self.keys[0].device
        self._tokens = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self._positions = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self._lengths = torch.zeros((rows,), dtype=torch.long, device=device)
        self._cols = torch.arange(self.capacity, device=device).view(1, 1, -1)

    @staticmethod
    def _zeros(like: torch.Tensor, rows: int, capacity: int) -> torch.Tensor:
        return torch.zeros(
            (rows, like.shape[1], capacity, like.shape[3]), dtype=like.dtype, device=like.device
        )


def static_layout(
    device: torch.device, cuda_graphs: bool | None, static_kv: bool | None, max_rows: int, max_context: int
) -> StaticKV | None:
    """The running batch's layout from ``HFEngine``'s switches: ``None`` keeps the dynamic one.

    ``cuda_graphs`` ``None`` means on iff ``device`` is CUDA; ``static_kv`` ``None`` follows
    ``cuda_graphs`` (graphs need the static layout; the static layout runs without graphs, on CPU too).
    """
    graphs = device.type == "cuda" if cuda_graphs is None else cuda_graphs
    static = graphs if static_kv is None else static_kv
    if graphs and device.type != "cuda":
        raise ConfigError(f"cuda_graphs=True needs a CUDA device, got device {str(device)!r}; "
                          "leave cuda_graphs=None (on iff CUDA) or pass cuda_graphs=False")  # fmt: skip
    if graphs and not static:
        raise ConfigError("cuda_graphs=True needs static_kv=True (or None): graphs replay the static "
                          "KV layout's fixed shapes; pass static_kv=None or cuda_graphs=False")  # fmt: skip
    return StaticKV(max_rows, max_context, graphs=graphs) if static else None
