"""A Megatron-core ``GPTModel`` for an HF causal LM's config, and one pipeline stage's forward.

:func:`layout` reads what Megatron must know from the HF config (Qwen2, Qwen3 and Llama: RMSNorm,
SwiGLU, RoPE, grouped-query attention, Qwen2's QKV bias, Qwen3's per-head q/k norms, tied
embeddings) and refuses what it would silently get wrong (rope scaling, sliding windows, other
activations). :func:`build` makes this rank's stage of the model with Megatron's local layer spec
(no Transformer Engine, no Apex): stage ``pp`` of ``pp_size`` holds layers ``[pp * L / pp_size,
(pp + 1) * L / pp_size)``, each linear split over the tensor-parallel group, the vocabulary padded
to a multiple of the TP size (:attr:`Layout.padded_vocab`; padded columns score probability 0).
:func:`stage_forward` runs the stage: the first embeds ``input_ids``, the others continue the
previous stage's hidden states ``(S, B, H)``; the last returns this rank's vocabulary slice of the
logits ``(B, S, V / tp)`` and the final hidden states (the value head's input).

Rows are right-padded (:mod:`agentrl.trainer.batch`), so the causal mask alone keeps every real
token from seeing padding, and RoPE's positions ``0..S-1`` are each row's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from agentrl.trainer.errors import BackendError
from agentrl.trainer.megatron.compat import rope_table

__all__ = ["Layout", "build", "layout", "stage_forward"]

_FAMILIES = ("qwen2", "qwen3", "llama")


@dataclass(frozen=True)
class Layout:
    """The shape of an HF decoder as Megatron needs it, and how it is split."""

    family: str
    layers: int
    hidden: int
    heads: int
    groups: int  # key/value heads (grouped-query attention)
    head_dim: int
    ffn: int
    vocab: int  # the real vocabulary
    padded_vocab: int  # a multiple of the TP size; columns >= vocab are padding
    eps: float
    rope_theta: float
    qkv_bias: bool
    qk_norm: bool
    tied: bool
    max_positions: int
    tp: int = 1
    pp: int = 1

    @property
    def layers_per_stage(self) -> int:
        return self.layers // self.pp


def layout(config: Any, tp: int = 1, pp: int = 1) -> Layout:
    """The :class:`Layout` of an HF config split ``tp`` x ``pp`` ways, with a clear error for what
    the conversion does not cover."""
    family = str(getattr(config, "model_type", ""))
    if family not in _FAMILIES:
        raise BackendError(
            f"model_type={family!r}: the Megatron backend converts {', '.join(_FAMILIES)} decoders; "
            "use --backend fsdp2 for this model"
        )
    rope = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    if rope.get("rope_type", "default") != "default" or theta is None:
        raise BackendError(
            f"rope {rope}: the Megatron backend implements plain RoPE only (no scaling); "
            "use --backend fsdp2 for this model"
        )
    if getattr(config, "use_sliding_window", False) or getattr(config, "hidden_act", "silu") != "silu":
        raise BackendError(
            f"hidden_act={config.hidden_act!r}, use_sliding_window={getattr(config, 'use_sliding_window', None)}: "
            "the Megatron backend implements SwiGLU decoders with full attention only; use --backend fsdp2"
        )
    heads, groups = int(config.num_attention_heads), int(config.num_key_value_heads)
    layers, vocab = int(config.num_hidden_layers), int(config.vocab_size)
    for name, n in (("--tp", tp), ("--pp", pp)):
        if n < 1:
            raise BackendError(f"{name} {n}: must be >= 1")
    if groups % tp or heads % tp:
        raise BackendError(
            f"--tp {tp}: must divide the model's {heads} attention heads and {groups} key/value heads"
        )
    if layers % pp:
        raise BackendError(f"--pp {pp}: must divide the model's {layers} layers (each stage holds as many)")
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return Layout(
        family=family,
        layers=layers,
        hidden=int(config.hidden_size),
        heads=heads,
        groups=groups,
        head_dim=head_dim,
        ffn=int(config.intermediate_size),
        vocab=vocab,
        padded_vocab=-(-vocab // tp) * tp,
        eps=float(config.rms_norm_eps),
        rope_theta=float(theta),
        qkv_bias=bool(getattr(config, "attention_bias", family == "qwen2")),
        qk_norm=family == "qwen3",
        tied=bool(getattr(config, "tie_word_embeddings", False)),
        max_positions=int(config.max_position_embeddings),
        tp=tp,
        pp=pp,
    )


def build(
    lay: Layout, *, pre_process: bool, post_process: bool, dtype: torch.dtype = torch.float32
) -> nn.Module:
    """This rank's stage of the model (Megatron's parallel state must be initialised for ``lay``)."""
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    cuda = torch.cuda.is_available()
    cfg = TransformerConfig(
        num_layers=lay.layers,
        hidden_size=lay.hidden,
        num_attention_heads=lay.heads,
        num_query_groups=lay.groups,
        kv_channels=lay.head_dim,
        ffn_hidden_size=lay.ffn,
        normalization="RMSNorm",
        layernorm_epsilon=lay.eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=lay.qkv_bias,
        qk_layernorm=lay.qk_norm,
        hidden_dropout=0.0,  # RL scores tokens the engine sampled without dropout
        attention_dropout=0.0,
        tensor_model_parallel_size=lay.tp,
        pipeline_model_parallel_size=lay.pp,
        use_cpu_initialization=not cuda,
        perform_initialization=False,  # every weight comes from the HF checkpoint
        # the fused kernels are CUDA extensions; unfused is the same maths
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        bias_dropout_fusion=False,
        persist_layer_norm=False,
        params_dtype=dtype,
        pipeline_dtype=dtype,
    )
    return GPTModel(
        cfg,
        get_gpt_layer_local_spec(qk_layernorm=lay.qk_norm, normalization="RMSNorm"),
        vocab_size=lay.padded_vocab,
        max_sequence_length=lay.max_positions,
        pre_process=pre_process,
        post_process=post_process,
        # tied across stages, Megatron's constructor sums the two copies over the embedding group
        # after moving them to CUDA (language_module.py, setup_embeddings_and_output_layer): on a CPU
        # the last stage keeps its own copy, loaded equal and kept equal by the backend
        share_embeddings_and_output_weights=lay.tied and (cuda or lay.pp == 1),
        position_embedding_type="rope",
        rotary_base=int(lay.rope_theta),
    )


def stage_forward(
    model: Any, input_ids: torch.Tensor, hidden_in: torch.Tensor | None
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(logits (B, S, V/tp) | None, hidden (S, B, H))`` of this stage for ``input_ids (B, S)``.

    The first stage embeds ``input_ids``; the others take ``hidden_in`` from the previous stage.
    The last stage's ``hidden`` is after the final norm and its logits are this rank's slice.
    """
    S = input_ids.shape[1]
    if model.pre_process:
        pos = torch.arange(S, device=input_ids.device).unsqueeze(0).expand_as(input_ids)
        x = model.embedding(input_ids=input_ids, position_ids=pos)  # (S, B, H)
    else:
        if hidden_in is None:
            raise BackendError("a pipeline stage after the first needs the previous stage's hidden states")
        model.decoder.set_input_tensor(hidden_in)
        x = None
    rope = rope_table(model, S)
    # the causal mask given, not left to Megatron: its default is built on CUDA (transformer/utils.py,
    # get_default_causal_mask); True marks the positions a query may not see
    causal = torch.ones(S, S, dtype=torch.bool, device=input_ids.device).triu(1)[None, None]
    hidden = model.decoder(hidden_states=x, attention_mask=causal, rotary_pos_emb=rope)
    if not model.post_process:
        return None, hidden
    weight = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else None
    logits, _ = model.output_layer(hidden, weight=weight)
    return logits.transpose(0, 1), hidden
