"""PrefixCache: longest shared prefix, LRU eviction by bytes, and KV sliced to the shared length."""

from __future__ import annotations

import torch

from agentrl.engines.batch import PREFIX_BLOCK, PrefixCache


def kv_for(tokens: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fake one-layer KV whose value at position t is the token id (so slicing is checkable)."""
    t = torch.tensor(tokens, dtype=torch.float32).view(1, 1, -1, 1)
    return [(t.clone(), -t.clone())]


def test_lookup_finds_the_longest_shared_prefix_among_many() -> None:
    cache = PrefixCache(max_bytes=1 << 20)
    system = list(range(100, 100 + 3 * PREFIX_BLOCK))  # a shared system prompt
    for i in range(50):
        seq = system + [1000 + i] * (PREFIX_BLOCK + 5)
        cache.put(seq, kv_for(seq))
    prompt = system + [1000 + 7] * (PREFIX_BLOCK + 2) + [5, 6]
    hit = cache.lookup(prompt)
    assert hit is not None
    n, kv = hit
    assert n == len(system) + PREFIX_BLOCK + 2
    assert kv[0][0].shape[-2] == n and kv[0][0].flatten().tolist() == [float(t) for t in prompt[:n]]
    # a prompt that leaves the shared system prompt mid-block reuses the whole blocks and the rest
    other = system[:-3] + [7, 7, 7, 7] + [1] * 40
    hit = cache.lookup(other)
    assert hit is not None and hit[0] == len(system) - 3
    assert cache.lookup([9] * 40) is None
    assert cache.lookup(system[:5] + [1]) is None  # shorter than one block: not indexed


def test_the_last_prompt_token_is_never_served_from_cache() -> None:
    cache = PrefixCache(max_bytes=1 << 20)
    seq = list(range(2 * PREFIX_BLOCK))
    cache.put(seq, kv_for(seq))
    hit = cache.lookup(seq)
    assert hit is not None and hit[0] == len(seq) - 1


def test_eviction_is_lru_and_bounded_by_bytes() -> None:
    seq_bytes = 2 * (2 * PREFIX_BLOCK) * 4  # keys + values, float32, one layer
    cache = PrefixCache(max_bytes=2 * seq_bytes)
    seqs = [[i] * (2 * PREFIX_BLOCK) for i in range(3)]
    for s in seqs[:2]:
        cache.put(s, kv_for(s))
    assert cache.lookup(seqs[0] + [1]) is not None  # touch 0: 1 is now least recently used
    cache.put(seqs[2], kv_for(seqs[2]))
    assert len(cache) == 2
    assert cache.lookup(seqs[1] + [1]) is None
    assert cache.lookup(seqs[0] + [1]) is not None and cache.lookup(seqs[2] + [1]) is not None
    cache.clear()
    assert len(cache) == 0 and cache.lookup(seqs[0] + [1]) is None
