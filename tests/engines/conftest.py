"""Tiny seeded causal LMs built in memory for the engine tests (no hub, no disk)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from agentrl.engines import HFEngine

VOCAB = 384
MAX_POS = 128


def tiny_qwen2(seed: int = 0, vocab: int = VOCAB, max_pos: int = MAX_POS) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_pos,
        tie_word_embeddings=False,
        eos_token_id=None,
        bos_token_id=None,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    # Random init at std 0.02 gives near-uniform next-token distributions (entropy ~ln V); sharpen
    # them (entropy ~3 nats) so that sampling, top-k and top-p have real structure to get right.
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return model


def tiny_qwen3(seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=MAX_POS,
        tie_word_embeddings=False,
        eos_token_id=None,
        bos_token_id=None,
    )
    return Qwen3ForCausalLM(cfg).eval()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def model() -> Qwen2ForCausalLM:
    """A fresh model per test: engines update their model's weights in place."""
    return tiny_qwen2()


@pytest.fixture
def engine(model: Qwen2ForCausalLM) -> Iterator[HFEngine]:
    eng = HFEngine(model, device="cpu", stop_on_eos=False)
    yield eng
    eng.close()


def lora_adapter(path: Path, seed: int, rank: int = 8, model: torch.nn.Module | None = None) -> Path:
    """A rank-``rank`` PEFT adapter directory on every projection of ``model`` (default: the ``tiny``
    catalogue model) that changes its outputs: ``lora_B`` random (PEFT starts it at zero), alpha 2 x rank."""
    from agentrl.models import load_model, resolve
    from agentrl.models.lora import LoraSpec, adapter_state_dict, apply_lora, save_adapter

    model = model if model is not None else load_model(resolve("tiny")).float().eval()
    spec = LoraSpec(rank=rank)
    apply_lora(model, spec)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return save_adapter(path, adapter_state_dict(model), spec, base=resolve("tiny"))
