"""The running batch's KV cache (left-padded rows) and the prompt-prefix cache that feeds it.

:class:`KVBatch` holds one ``DynamicCache`` for every running request. Rows are
left-padded to a common length ``L``; ``mask`` ``(B, L)`` marks real columns, which
for every row form one contiguous block ending at column ``L - 1``. Each forward
gets an explicit 4-D attention mask and per-row position ids, so a row computes
what it would compute alone (up to float rounding).

:class:`PrefixCache` keeps the KV of recently prefilled prompts and finished
sequences (prompt + output), so a request that extends one of them (the next turn
of the same episode) prefills only its new suffix. It is cleared on every weight
update: cached KV from older weights is never reused by a new request.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["PREFILL_CHUNK", "PREFIX_BLOCK", "Forward", "KVBatch", "LayerKV", "PrefixCache"]

PREFILL_CHUNK = 2048
"""Prompt tokens per prefill forward. Long prompts are prefilled in chunks that extend the KV cache,
so the attention mask of one forward is ``chunk x context`` instead of ``context x context``
(at 50k tokens: 0.4 GB instead of 12 GB of mask, before the attention scores)."""

LayerKV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per-layer ``(keys, values)``, each ``(1, H, T, D)``: one sequence's KV without padding."""

Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any], torch.Tensor]
"""``forward(input_ids (B, Q), allowed (B, Q, K) bool, positions (B, Q), cache) -> last logits (B, V)``."""


def _dynamic_cache(data: LayerKV | None = None) -> Any:
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=data) if data is not None else DynamicCache()


def _left_pad(t: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    pad = length - t.shape[dim]
    if pad == 0:
        return t
    shape = list(t.shape)
    shape[dim] = pad
    return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim)


@dataclass
class KVBatch:
    """KV cache + padding mask of a batch of sequences (see the module docstring)."""

    cache: Any
    mask: torch.Tensor

    def __len__(self) -> int:
        return int(self.mask.shape[0])

    @classmethod
    def prefill(
        cls, forward: Forward, prompts: Sequence[Sequence[int]], device: torch.device
    ) -> tuple[torch.Tensor, KVBatch]:
        """One left-padded forward over ``prompts``; returns each prompt's last-position logits and its KV."""
        n, p = len(prompts), max(len(x) for x in prompts)
        ids = torch.zeros((n, p), dtype=torch.long)
        real = torch.zeros((n, p), dtype=torch.bool)
        for i, x in enumerate(prompts):
            ids[i, p - len(x) :] = torch.tensor(list(x))
            real[i, p - len(x) :] = True
        ids, real = ids.to(device), real.to(device)
        positions = (real.long().cumsum(-1) - 1).clamp(min=0)
        cache = _dynamic_cache()
        logits = _chunked(forward, ids, positions, cache, 0, real)
        return logits, cls(cache, real)

    @classmethod
    def prefill_suffix(
        cls, forward: Forward, prefix: LayerKV, suffix: Sequence[int], device: torch.device
    ) -> tuple[torch.Tensor, KVBatch]:
        """Extend one cached prefix (``T`` tokens of KV) by ``suffix``; returns the last logits and the row's KV."""
        t, q = prefix[0][0].shape[-2], len(suffix)
        cache = _dynamic_cache(list(prefix))
        ids = torch.tensor([list(suffix)], dtype=torch.long, device=device)
        positions = torch.arange(t, t + q, device=device).unsqueeze(0)
        real = torch.ones((1, t + q), dtype=torch.bool, device=device)
        logits = _chunked(forward, ids, positions, cache, t, real)
        return logits, cls(cache, real)

    def extend(self, other: KVBatch) -> KVBatch:
        """This batch's rows followed by ``other``'s, left-padded to the longer length."""
        length = max(self.mask.shape[1], other.mask.shape[1])
        data = []
        for a, b in zip(self.cache.layers, other.cache.layers, strict=True):
            keys = torch.cat([_left_pad(a.keys, length, -2), _left_pad(b.keys, length, -2)], 0)
            values = torch.cat([_left_pad(a.values, length, -2), _left_pad(b.values, length, -2)], 0)
            data.append((keys, values))
        mask = torch.cat([_left_pad(self.mask, length, -1), _left_pad(other.mask, length, -1)], 0)
        return KVBatch(_dynamic_cache(data), mask)

    def select(self, keep: Sequence[int]) -> KVBatch | None:
        """Rows ``keep`` only, with the columns no remaining row uses dropped; ``None`` when empty."""
        if not keep:
            return None
        idx = torch.tensor(list(keep), device=self.mask.device)
        mask = self.mask.index_select(0, idx)
        used = mask.any(0)
        start = int(used.nonzero()[0]) if bool(used.any()) else 0
        data = [
            (layer.keys.index_select(0, idx)[:, :, start:], layer.values.index_select(0, idx)[:, :, start:])
            for layer in self.cache.layers
        ]
        return KVBatch(_dynamic_cache(data), mask[:, start:])

    def decode(self, forward: Forward, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (``tokens``, ``positions``: ``(B, 1)``); returns next-token logits ``(B, V)``."""
        ones = torch.ones((len(self), 1), dtype=torch.bool, device=self.mask.device)
        mask = torch.cat([self.mask, ones], 1)
        logits = forward(tokens, mask.unsqueeze(1), positions, self.cache)
        self.mask = mask
        return logits

    def length(self, i: int) -> int:
        """Cached tokens of row ``i`` (its real columns)."""
        return int(self.mask[i].sum())

    def row(self, i: int) -> LayerKV:
        """Row ``i``'s KV without padding, copied (so it does not pin the batch's tensors)."""
        n = int(self.mask[i].sum())
        return [
            (layer.keys[i : i + 1, :, -n:].clone(), layer.values[i : i + 1, :, -n:].clone())
            for layer in self.cache.layers
        ]


def _chunked(
    forward: Forward, ids: torch.Tensor, positions: torch.Tensor, cache: Any, offset: int, real: torch.Tensor
) -> torch.Tensor:
    """Feed ``ids`` (B, Q) after ``offset`` cached columns, :data:`PREFILL_CHUNK` columns per forward.

    Query column ``j`` (absolute ``offset + j``) may attend to every real key column up to itself;
    ``real`` (B, offset + Q) marks the real (non-padding) columns. Returns the last column's logits.
    """
    q = ids.shape[1]
    logits = None
    for start in range(0, q, PREFILL_CHUNK):
        end = min(q, start + PREFILL_CHUNK)
        width = offset + end
        causal = torch.ones((end - start, width), dtype=torch.bool, device=ids.device).tril(
            diagonal=offset + start
        )
        allowed = causal.unsqueeze(0) & real[:, None, :width]
        logits = forward(ids[:, start:end], allowed, positions[:, start:end], cache)
    assert logits is not None, "prefill of an empty prompt"
    return logits


PREFIX_BLOCK = 16
"""Granularity of the prefix index: matches are found per block of tokens, then extended token by token."""


def _block_hashes(tokens: tuple[int, ...]) -> list[int]:
    """Chained hashes of each full ``PREFIX_BLOCK``-token prefix: ``h[b]`` identifies ``tokens[:(b + 1) * BLOCK]``."""
    out, h = [], 0
    for start in range(0, len(tokens) - PREFIX_BLOCK + 1, PREFIX_BLOCK):
        h = hash((h, tokens[start : start + PREFIX_BLOCK]))
        out.append(h)
    return out


class PrefixCache:
    """LRU map from a token sequence to its KV, bounded by bytes; finds the longest cached prefix of a prompt.

    A hash index over block-aligned prefixes makes a lookup cost O(prompt length),
    independent of how many sequences are cached (every episode's system prompt and tool
    list is a shared prefix, so a scan over entries would compare it again for each one).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], tuple[LayerKV, int, list[int]]] = OrderedDict()
        self._index: dict[int, tuple[int, ...]] = {}  # block-prefix hash -> a cached key with that prefix
        self._bytes = 0
        self.hits = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._index.clear()
        self._bytes = 0

    def put(self, tokens: Sequence[int], kv: LayerKV) -> None:
        key = tuple(tokens)
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        if self.max_bytes <= 0 or len(key) < PREFIX_BLOCK:
            return
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if size > self.max_bytes:
            return
        hashes = _block_hashes(key)
        self._entries[key] = (kv, size, hashes)
        for h in hashes:
            self._index[h] = key
        self._bytes += size
        while self._bytes > self.max_bytes:
            old_key, (_, old_size, old_hashes) = self._entries.popitem(last=False)
            self._bytes -= old_size
            for h in old_hashes:
                if self._index.get(h) == old_key:
                    del self._index[
                        h
                    ]  # another entry with this prefix may now be missed: less reuse, never wrong

    def lookup(self, prompt: Sequence[int], min_tokens: int = 1) -> tuple[int, LayerKV] | None:
        """KV of the longest cached prefix of ``prompt[:-1]`` (at least ``min_tokens`` long), or ``None``.

        Any cached sequence that shares a prefix with the prompt serves, sliced to the shared part:
        KV at position ``t`` depends only on tokens ``<= t``. The prompt's last token is always
        recomputed, since its logits are needed. Shared prefixes shorter than one block are not found.
        """
        head = tuple(prompt[: len(prompt) - 1])
        best_key: tuple[int, ...] | None = None
        h = 0
        n = 0
        for start in range(0, len(head) - PREFIX_BLOCK + 1, PREFIX_BLOCK):
            h = hash((h, head[start : start + PREFIX_BLOCK]))
            key = self._index.get(h)
            if key is None:
                break
            best_key, n = key, start + PREFIX_BLOCK
        if best_key is None or best_key[:n] != head[:n]:  # nothing shared, or a hash collision
            return None
        end = min(len(best_key), len(head))
        while n < end and best_key[n] == head[n]:
            n += 1
        if n < max(1, min_tokens):
            return None
        self._entries.move_to_end(best_key)
        self.hits += 1
        self.hit_tokens += n
        kv = self._entries[best_key][0]
        return n, [(k[:, :, :n], v[:, :, :n]) for k, v in kv]
