"""Tiny seeded causal LMs built in memory for the engine tests (no hub, no disk)."""

from __future__ import annotations

from collections.abc import Iterator

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
