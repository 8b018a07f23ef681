"""Hugging Face weights to one Megatron rank's shard and back, for Qwen2, Qwen3 and Llama.

Pure functions over state dicts (no collectives: :mod:`agentrl.trainer.megatron.weights` moves the
shards between ranks). The layouts, per decoder layer (``Layout`` in :mod:`.model`):

* ``linear_qkv`` fuses q, k and v by key/value group: for each group its ``heads / groups`` query
  heads, then its key head, then its value head (``head_dim`` rows each); the QKV bias likewise.
  Tensor parallelism gives each rank a contiguous run of whole groups, so the rank's shard is a
  contiguous slice of the fused tensor.
* ``linear_fc1`` is SwiGLU's gate and up projections stacked: each rank holds ``[gate_r; up_r]``,
  its own slices of both (so the full tensor is *not* ``[gate; up]`` once split).
* ``linear_proj`` (o_proj) and ``linear_fc2`` (down_proj) are split along their input dimension.
* The vocabulary (embedding and output layer) is padded with zero rows to ``padded_vocab`` and
  split in contiguous slices. With tied embeddings and several stages, the last stage holds a copy
  of the embedding as its ``output_layer.weight`` (Megatron keeps the two equal by summing their
  gradients across the embedding group).
* Norms (``input_layernorm``, ``pre_mlp_layernorm``, Qwen3's per-head ``q_layernorm`` /
  ``k_layernorm``, ``final_layernorm``) are replicated.

``stage_to_hf(hf_to_stage(w, r) for every r) == w`` exactly (the round trip only moves bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from agentrl.trainer.errors import BackendError
from agentrl.trainer.megatron.model import Layout

__all__ = ["hf_to_stage", "stage_to_hf", "tp_split_dims"]

_D = "decoder.layers.{}."
_H = "model.layers.{}."
# Megatron suffix -> the dimension its tensor-parallel shards split (None: replicated)
_SPLIT = {
    "self_attention.linear_qkv.weight": 0,
    "self_attention.linear_qkv.bias": 0,
    "self_attention.linear_proj.weight": 1,
    "mlp.linear_fc1.weight": 0,
    "mlp.linear_fc2.weight": 1,
    "embedding.word_embeddings.weight": 0,
    "output_layer.weight": 0,
}
_NORMS = {
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
}


def tp_split_dims(name: str) -> int | None:
    """The dimension along which Megatron parameter ``name`` is split over tensor-parallel ranks."""
    for suffix, dim in _SPLIT.items():
        if name.endswith(suffix):
            return dim
    return None


def _need(w: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in w:
        raise BackendError(f"the HF state dict has no {name!r}; it is not a Qwen2/Qwen3/Llama decoder")
    return w[name]


def _qkv(lay: Layout, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    per = lay.heads // lay.groups
    rest = q.shape[1:]
    q = q.reshape(lay.groups, per * lay.head_dim, *rest)
    k = k.reshape(lay.groups, lay.head_dim, *rest)
    v = v.reshape(lay.groups, lay.head_dim, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def _unqkv(lay: Layout, fused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    per = lay.heads // lay.groups
    rest = fused.shape[1:]
    g = fused.reshape(lay.groups, (per + 2) * lay.head_dim, *rest)
    q, k, v = g.split([per * lay.head_dim, lay.head_dim, lay.head_dim], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def _vocab(lay: Layout, w: torch.Tensor) -> torch.Tensor:
    pad = lay.padded_vocab - w.shape[0]
    return torch.cat([w, w.new_zeros(pad, *w.shape[1:])]) if pad else w


def hf_to_stage(
    w: Mapping[str, torch.Tensor],
    lay: Layout,
    tp_rank: int,
    pp_rank: int,
    sink: Callable[[str, torch.Tensor], None] | None = None,
) -> dict[str, torch.Tensor]:
    """The Megatron state dict of stage ``pp_rank``, tensor-parallel rank ``tp_rank``, from HF ``w``.

    ``w`` is read one tensor at a time, only for what the stage holds, and each tensor is cut to this
    rank's shard as it is read: a lazy ``w`` (:class:`~agentrl.trainer.megatron.weights.SafetensorsWeights`)
    never puts more than the shard and one whole tensor in memory. With ``sink`` each shard tensor is
    handed to it as it is cut instead (and the dict returned is empty): not even the shard is kept.
    """
    out: _Shards = _Shards(lay.tp, tp_rank, sink)
    first, last = pp_rank == 0, pp_rank == lay.pp - 1
    if first:
        out["embedding.word_embeddings.weight"] = _vocab(lay, _need(w, "model.embed_tokens.weight"))
    if last:
        out["decoder.final_layernorm.weight"] = _need(w, "model.norm.weight")
        head = "model.embed_tokens.weight" if lay.tied else "lm_head.weight"
        if not (lay.tied and first):  # a single stage's tied head *is* the embedding
            out["output_layer.weight"] = _vocab(lay, _need(w, head))
    n = lay.layers_per_stage
    for local in range(n):
        h, d = _H.format(pp_rank * n + local), _D.format(local)
        for meg, hf in _NORMS.items():
            if meg.startswith(("self_attention.q", "self_attention.k")) and not lay.qk_norm:
                continue
            out[d + meg] = _need(w, h + hf)
        a = h + "self_attn."
        out[d + "self_attention.linear_qkv.weight"] = _qkv(
            lay, _need(w, a + "q_proj.weight"), _need(w, a + "k_proj.weight"), _need(w, a + "v_proj.weight")
        )
        if lay.qkv_bias:
            out[d + "self_attention.linear_qkv.bias"] = _qkv(
                lay, _need(w, a + "q_proj.bias"), _need(w, a + "k_proj.bias"), _need(w, a + "v_proj.bias")
            )
        out[d + "self_attention.linear_proj.weight"] = _need(w, a + "o_proj.weight")
        gate, up = _need(w, h + "mlp.gate_proj.weight"), _need(w, h + "mlp.up_proj.weight")
        out[d + "mlp.linear_fc1.weight"] = torch.stack([gate, up])  # split per rank below
        out[d + "mlp.linear_fc2.weight"] = _need(w, h + "mlp.down_proj.weight")
    return dict(out)


class _Shards(dict[str, torch.Tensor]):
    """A state dict that keeps only tensor-parallel rank ``rank``'s shard of each tensor set in it."""

    def __init__(self, tp: int, rank: int, sink: Callable[[str, torch.Tensor], None] | None) -> None:
        super().__init__()
        self.tp, self.rank, self.sink = tp, rank, sink

    def __setitem__(self, name: str, t: torch.Tensor) -> None:
        if self.sink is None:
            super().__setitem__(name, _shard(name, t, self.tp, self.rank))
        else:
            self.sink(name, _shard(name, t, self.tp, self.rank))


def _shard(name: str, t: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    if name.endswith("mlp.linear_fc1.weight"):  # [gate_r; up_r]
        return torch.cat([t[0].chunk(tp, 0)[rank], t[1].chunk(tp, 0)[rank]]).contiguous()
    dim = tp_split_dims(name)
    return t.clone() if dim is None else t.chunk(tp, dim)[rank].clone()


def _unshard(name: str, parts: list[torch.Tensor]) -> torch.Tensor:
    if name.endswith("mlp.linear_fc1.weight"):
        halves = [p.chunk(2, 0) for p in parts]
        return torch.stack([torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])])
    dim = tp_split_dims(name)
    return parts[0] if dim is None else torch.cat(parts, dim)


def stage_to_hf(parts: list[dict[str, torch.Tensor]], lay: Layout, pp_rank: int) -> dict[str, torch.Tensor]:
    """HF-named full tensors of stage ``pp_rank`` from its tensor-parallel shards (``parts[r]``: rank
    ``r``'s Megatron state dict). The tied output layer of the last stage is the embedding: not
    repeated (the first stage gives ``model.embed_tokens.weight``)."""
    if len(parts) != lay.tp:
        raise BackendError(f"{len(parts)} tensor-parallel shards for --tp {lay.tp}")
    out: dict[str, torch.Tensor] = {}
    n = lay.layers_per_stage
    for name in parts[0]:
        if name.endswith("_extra_state"):
            continue
        full = _unshard(name, [p[name] for p in parts])
        if name == "embedding.word_embeddings.weight":
            out["model.embed_tokens.weight"] = full[: lay.vocab]
        elif name == "output_layer.weight":
            if not lay.tied:
                out["lm_head.weight"] = full[: lay.vocab]
        elif name == "decoder.final_layernorm.weight":
            out["model.norm.weight"] = full
        else:
            idx, _, suffix = name.removeprefix("decoder.layers.").partition(".")
            h = _H.format(pp_rank * n + int(idx))
            if suffix in _NORMS:
                out[h + _NORMS[suffix]] = full
            elif suffix.startswith("self_attention.linear_qkv."):
                kind = suffix.rsplit(".", 1)[1]
                for proj, t in zip("qkv", _unqkv(lay, full), strict=True):
                    out[f"{h}self_attn.{proj}_proj.{kind}"] = t
            elif suffix == "self_attention.linear_proj.weight":
                out[h + "self_attn.o_proj.weight"] = full
            elif suffix == "mlp.linear_fc1.weight":
                out[h + "mlp.gate_proj.weight"], out[h + "mlp.up_proj.weight"] = full[0], full[1]
            elif suffix == "mlp.linear_fc2.weight":
                out[h + "mlp.down_proj.weight"] = full
            else:
                raise BackendError(f"no HF name for Megatron parameter {name!r}")
    return out
