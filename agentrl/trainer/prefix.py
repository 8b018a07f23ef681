"""Shared-prompt forward: the episodes of a group start with the same prompt, so its forward runs once.

The ``G`` rows of a GRPO group share every token before the first sampled one (the
task's system prompt, tools and question). A plain forward computes that prompt ``G``
times. Here the micro-batch is split in two forwards::

    prefix forward : one row per distinct prompt   (U, P_max)  -> KV cache (with gradients)
    suffix forward : every row's remaining tokens  (B, S)      attending to its prompt's KV

The suffix forward reads the prompt's keys and values through ``index_select``, so in
backward the gradients of the ``G`` rows that share a prompt are summed into its single
forward: the same gradients as the plain forward, up to float rounding (tested), for
``U * P_max + B * S`` token positions instead of ``B * T``.

A row's shared prefix ends one token before its first trained token, whose logit
comes from the position just before it; rows whose prefixes are not identical token
for token are simply separate prompts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["PromptPlan", "plan_shared_prompts", "prompt_keys", "scatter_columns", "shared_prompt_logits"]


@dataclass
class PromptPlan:
    """How a right-padded ``(B, T)`` micro-batch splits into distinct prompts and per-row suffixes."""

    owner: torch.Tensor
    """(B,) long: the distinct prompt of each row"""
    prefix_len: torch.Tensor
    """(B,) long: tokens of the row that its prompt covers"""
    prompts: list[list[int]]
    """the distinct prompts' tokens"""
    suffix_len: torch.Tensor
    """(B,) long: the row's tokens after its prompt"""

    @property
    def cost(self) -> int:
        """Token positions of both forwards (with padding)."""
        return len(self.prompts) * max(len(p) for p in self.prompts) + len(self.owner) * int(
            self.suffix_len.max()
        )


def prompt_keys(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor
) -> list[tuple[int, ...]]:
    """Each row's prompt: its tokens before ``first trained - 1`` (rows with equal prompts can share one forward)."""
    lengths = attention_mask.sum(-1)
    trained = loss_mask > 0
    first = torch.where(trained.any(-1), trained.float().argmax(-1), lengths)
    cuts = (torch.minimum(first, lengths) - 1).clamp(min=0).tolist()
    return [tuple(row[:cut]) for row, cut in zip(input_ids.tolist(), cuts, strict=True)]


def plan_shared_prompts(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    min_saving: float = 0.2,
    keys: list[tuple[int, ...]] | None = None,
) -> PromptPlan | None:
    """The split of a micro-batch into shared prompts, or ``None`` when it would not save ``min_saving`` of the work.

    Every row's prompt is its tokens before ``first trained - 1`` (:func:`prompt_keys`, or
    ``keys`` when the caller computed them); rows with identical prompts share one.
    """
    B, T = input_ids.shape
    lengths = attention_mask.sum(-1).tolist()
    index: dict[tuple[int, ...], int] = {}
    owner, prefix_len = [], []
    for key in keys if keys is not None else prompt_keys(input_ids, attention_mask, loss_mask):
        owner.append(index.setdefault(key, len(index)))
        prefix_len.append(len(key))
    prompts = [list(k) for k in index]
    if len(prompts) == B or max(len(p) for p in prompts) == 0:  # nothing shared, or nothing to share
        return None
    suffix = torch.tensor(lengths) - torch.tensor(prefix_len)
    plan = PromptPlan(torch.tensor(owner), torch.tensor(prefix_len), prompts, suffix)
    if plan.cost > (1.0 - min_saving) * B * T:
        return None
    return plan


def _cache(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=layers) if layers else DynamicCache()


def shared_prompt_logits(
    model: nn.Module,
    input_ids: torch.Tensor,
    plan: PromptPlan,
    cache_kw: str = "cache",
    trunk: nn.Module | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both forwards; returns the suffix logits ``(B, S, V)``, their targets ``(B, S)`` and columns ``(B, S)``.

    ``cache_kw`` is the name of the model's KV-cache argument (``cache`` in recent
    transformers, ``past_key_values`` before). With ``trunk`` (the model's decoder without its LM
    head) the suffix runs through it and its last hidden states ``(B, S, H)`` stand for the logits.

    Suffix position ``q`` of row ``r`` is absolute position ``c = prefix_len[r] + q``; its
    logits score token ``c + 1``, i.e. column ``c`` of the backend's ``(B, T - 1)`` logprobs.
    The row's last token and its padding score nothing: their columns are ``T - 1 + q``,
    which :func:`scatter_columns` drops.
    """
    kv, seen_prompt = _prompt_forward(model, plan, input_ids.device, cache_kw)
    return _suffix_forward(trunk or model, input_ids, plan, kv, seen_prompt, cache_kw)


def _additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean ``(N, Q, K)`` attention pattern as the ``(N, 1, Q, K)`` additive mask the model takes."""
    neg = torch.finfo(dtype).min
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, neg)[:, None]


def _prompt_forward(
    model: nn.Module, plan: PromptPlan, device: torch.device, cache_kw: str
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """The distinct prompts' forward: every row's keys and values ``(B, ...)`` per layer, and ``(B, P)`` real columns.

    The prompts are left-padded so that they all end at column ``P - 1``; a row reads its
    prompt's cache through ``index_select``, so in backward the rows' gradients sum into it.
    """
    U, P = len(plan.prompts), max(len(p) for p in plan.prompts)
    ids = torch.zeros((U, P), dtype=torch.long)
    real = torch.zeros((U, P), dtype=torch.bool)
    for u, p in enumerate(plan.prompts):
        if p:
            ids[u, P - len(p) :] = torch.tensor(p)
            real[u, P - len(p) :] = True
    ids, real = ids.to(device), real.to(device)
    causal = torch.ones((P, P), dtype=torch.bool, device=device).tril()
    allowed = causal[None] & real[:, None, :]
    allowed |= torch.eye(P, dtype=torch.bool, device=device)[None]  # padding queries see themselves (no NaN)
    positions = (real.long().cumsum(-1) - 1).clamp(min=0)
    cache = _cache([])
    model(
        input_ids=ids,
        attention_mask=_additive_mask(allowed, next(model.parameters()).dtype),
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,
        **{cache_kw: cache},
    )
    owner = plan.owner.to(device)
    kv = [(layer.keys.index_select(0, owner), layer.values.index_select(0, owner)) for layer in cache.layers]
    return kv, real.index_select(0, owner)  # each row sees its own prompt's columns


def _suffix_forward(
    model: nn.Module,
    input_ids: torch.Tensor,
    plan: PromptPlan,
    kv: list[tuple[torch.Tensor, torch.Tensor]],
    seen_prompt: torch.Tensor,
    cache_kw: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every row's tokens after its prompt, right-padded to ``S``, attending to its prompt's cache
    (``model``'s logits, or the last hidden states when ``model`` is the trunk)."""
    device = input_ids.device
    B, T = input_ids.shape
    P = seen_prompt.shape[1]
    S = int(plan.suffix_len.max())
    q = torch.arange(S, device=device)
    start = plan.prefix_len.to(device)
    cols = start[:, None] + q[None]  # absolute positions of the suffix
    ids_s = input_ids.gather(1, cols.clamp(max=T - 1))
    targets = input_ids.gather(1, (cols + 1).clamp(max=T - 1))
    scored = q[None] < (plan.suffix_len.to(device) - 1)[:, None]  # the position has a next token in the row
    allowed_s = torch.cat(
        [seen_prompt[:, None, :].expand(B, S, P), (q[None, :] <= q[:, None])[None].expand(B, S, S)], -1
    )
    # padding positions past the row's end get position T - 1 (their outputs are dropped)
    out = model(
        input_ids=ids_s,
        attention_mask=_additive_mask(allowed_s, next(model.parameters()).dtype),
        position_ids=cols.clamp(max=T - 1),
        use_cache=True,
        **{cache_kw: _cache(kv)},
    )
    # unscored positions go to distinct columns past T - 2, which the caller drops
    last = out.logits if hasattr(out, "logits") else out.last_hidden_state
    return last, targets, torch.where(scored, cols, T - 1 + q[None])


def scatter_columns(values: torch.Tensor, cols: torch.Tensor, width: int) -> torch.Tensor:
    """``(B, S)`` values at the distinct columns ``cols`` (< ``width + S``) of a zero ``(B, width)`` tensor.

    Columns ``>= width`` are dropped; differentiable in ``values``.
    """
    B, S = values.shape
    return values.new_zeros((B, width + S)).scatter(1, cols, values)[:, :width]
