"""A tiny Qwen2 causal LM and a synthetic batch, built locally for trainer tests."""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from agentrl.trainer.batch import TrainBatch

VOCAB = 64


def tiny_model(seed: int = 0, layers: int = 2) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(cfg).float()


def fixed_batch(n: int = 8, seed: int = 1) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 20, (n,), generator=g)
    T = int(lengths.max())
    ids = torch.randint(1, VOCAB, (n, T), generator=g)
    att = (torch.arange(T)[None] < lengths[:, None]).long()
    ids = ids * att
    lm = torch.zeros(n, T)
    for i, L in enumerate(lengths.tolist()):
        lm[i, 4:L] = 1.0  # prompt of 4 tokens, the rest sampled
    adv = torch.randn(n, 1, generator=g).expand(n, T) * lm
    return TrainBatch(ids, att, lm, torch.zeros(n, T), adv.contiguous())


def grouped_batch(prompt_lengths: tuple[int, ...] = (5, 9, 7), group: int = 3, seed: int = 2) -> TrainBatch:
    """GRPO-shaped rows: ``group`` rows per prompt (identical prompt tokens), completions of random lengths."""
    g = torch.Generator().manual_seed(seed)
    rows, sampled = [], []
    for p in prompt_lengths:
        prompt = torch.randint(1, VOCAB, (p,), generator=g).tolist()
        for _ in range(group):
            n = int(torch.randint(2, 9, (1,), generator=g))
            rows.append(prompt + torch.randint(1, VOCAB, (n,), generator=g).tolist())
            sampled.append(p)
    T = max(len(r) for r in rows)
    B = len(rows)
    ids = torch.zeros(B, T, dtype=torch.long)
    att = torch.zeros(B, T, dtype=torch.long)
    lm = torch.zeros(B, T)
    for i, (r, p) in enumerate(zip(rows, sampled, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        att[i, : len(r)] = 1
        lm[i, p : len(r)] = 1.0
    lm[0, sampled[0] + 1] = 0.0  # a hole in the trained tokens (a tool result inside the completion)
    adv = torch.randn(B, 1, generator=g).expand(B, T) * lm
    return TrainBatch(ids, att, lm, torch.zeros(B, T), adv.contiguous())


def scramble_adapter(model: torch.nn.Module, seed: int = 0, scale: float = 0.1) -> torch.nn.Module:
    """Random LoRA ``A`` and ``B`` (PEFT starts ``B`` at zero): an adapter that changes the scores."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return model
