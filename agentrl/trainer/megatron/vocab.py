"""Vocab-parallel token scores: logprob and entropy of ``softmax(logits / T)`` from a vocabulary slice.

Under tensor parallelism the LM head is column-parallel: rank ``r`` of a TP group of ``tp`` ranks
holds the logits of global columns ``[r * Vp / tp, (r + 1) * Vp / tp)`` of a padded vocabulary
``Vp >= V`` (Megatron pads the embedding to a multiple of its ``tp``-aligned divisor). The columns
``>= V`` are padding: probability 0, as if their logits were ``-inf``. Gathering the full
``(..., Vp)`` logits on one rank would cost ``tp`` times the slice (at a 151,936-token vocabulary
and 8k positions, ~5 GB of float32), so the softmax is assembled from per-rank partial sums
(Megatron's ``vocab_parallel_cross_entropy`` does the same for the loss alone):

* forward, two all-reduces over the TP group: the max (for stability), then one fused sum of
  ``sum exp(z - max)``, the target's logit (held by exactly one rank) and, for the entropy,
  ``sum exp(z - max) (z - max)``;
* backward, none: every rank holds the same replicated ``logp`` and entropy, so the gradient of
  a loss on them w.r.t. this rank's slice is this slice of the one-process gradient, computed
  locally from the softmax: ``d logp_t / dz_j = (1[j = t] - p_j) / T`` and
  ``d H / dz_j = -p_j (log p_j + H) / T`` (``= -p_j (z_j / T - E_p[z / T]) / T``). Summing
  gradients across ranks (``torch.distributed.nn.functional.all_reduce``'s backward) would
  multiply them by ``tp``.

Backward keeps one float32 copy of the slice (the softmax, real columns only), not the logits.
The semantics are :func:`agentrl.trainer.forward.token_scores`'s: ``temperature == 0`` (greedy
sampling) scores the plain logits, and the entropy carries a gradient only with ``entropy_grad``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from agentrl.trainer.errors import BackendError

__all__ = ["vocab_parallel_scores"]


def _tp(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """``(rank, size)`` in the TP group; ``(0, 1)`` for None (the whole vocabulary is local)."""
    if group is None:
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


class _VocabParallelScores(torch.autograd.Function):
    """``(logp, entropy)`` of one vocabulary slice; analytic backward, no collective in it."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        targets: torch.Tensor,
        start: int,
        real: int,
        group: dist.ProcessGroup | None,
        t: float,
        want_entropy: bool,
        entropy_grad: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = torch.promote_types(logits.dtype, torch.float32)  # float64 stays (gradcheck)
        z = logits[..., :real].to(dtype)  # the real columns of the slice; the padding never enters
        owned = z.data_ptr() != logits.data_ptr()
        if t != 1.0:
            z, owned = z / t, True
        reduce = group is not None and dist.get_world_size(group) > 1
        lead = z.shape[:-1]
        m = z.amax(-1) if real else z.new_full(lead, float("-inf"))
        if reduce:
            dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        zc = z.sub_(m.unsqueeze(-1)) if owned else z - m.unsqueeze(-1)  # z - max, owned from here
        local = targets - start
        held = (local >= 0) & (local < real)
        idx = local.clamp(0, max(real - 1, 0)).unsqueeze(-1)
        tgt = zc.gather(-1, idx).squeeze(-1) if real else zc.new_zeros(lead)
        p = zc.exp() if want_entropy else zc.exp_()
        sums = [p.sum(-1), torch.where(held, tgt, 0.0)]
        if want_entropy:
            sums.append(zc.mul_(p).sum(-1))  # sum exp(z - max) (z - max)
        del zc
        red = torch.stack(sums, -1)
        if reduce:
            dist.all_reduce(red, group=group)
        s = red[..., 0]
        logp = red[..., 1] - s.log()
        ent = s.log() - red[..., 2] / s if want_entropy else logp.new_zeros(0)
        p.div_(s.unsqueeze(-1))  # the softmax over the real vocabulary, this slice's columns
        ctx.save_for_backward(p, local, held, ent if entropy_grad else None)
        ctx.width, ctx.t, ctx.logits_dtype = logits.shape[-1], t, logits.dtype
        if not entropy_grad:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(
        ctx: Any, g_logp: torch.Tensor | None, g_ent: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        p, local, held, ent = ctx.saved_tensors
        real = p.shape[-1]
        g_logp = torch.zeros_like(p[..., 0]) if g_logp is None else g_logp
        grad = p * -g_logp.unsqueeze(-1)
        if ent is not None and g_ent is not None:  # -p (log p + H) g_H; xlogy: 0 where p underflowed
            grad.sub_(torch.xlogy(p, p).add_(p * ent.unsqueeze(-1)).mul_(g_ent.unsqueeze(-1)))
        if real:
            idx = local.clamp(0, real - 1).unsqueeze(-1)
            grad.scatter_add_(-1, idx, torch.where(held, g_logp, 0.0).unsqueeze(-1))
        if ctx.t != 1.0:
            grad.div_(ctx.t)
        width: int = ctx.width
        if real == width:
            return grad.to(ctx.logits_dtype), None, None, None, None, None, None, None
        out = grad.new_zeros((*grad.shape[:-1], width), dtype=ctx.logits_dtype)
        out[..., :real] = grad  # the padding columns get zero
        return out, None, None, None, None, None, None, None


def vocab_parallel_scores(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    vocab_start: int,
    vocab_size: int,
    group: dist.ProcessGroup | None,
    temperature: float = 1.0,
    entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logp, entropy | None)``, each ``(...)`` float32, of ``softmax(logits / temperature)`` over
    the real vocabulary ``[0, vocab_size)``, the full logits split across the ranks of ``group``.

    ``logits`` ``(..., Vp / tp)`` is this rank's slice, global columns ``vocab_start ..``; its
    columns ``>= vocab_size`` are padding (probability 0, zero gradient). ``targets`` ``(...)``
    are global token ids. Every rank of ``group`` must call this with the same ``targets``
    (collective); each gets the same result. ``temperature == 0`` scores the plain logits (as
    :func:`agentrl.trainer.forward.token_scores`). The entropy is differentiable only with
    ``entropy_grad``. Float64 logits are scored in float64 (for ``gradcheck``).
    """
    if not logits.is_floating_point() or logits.dim() < 1:
        raise BackendError(
            f"logits must be a float tensor (..., Vp / tp); got {logits.dtype} {tuple(logits.shape)}"
        )
    rank, tp = _tp(group)
    width = logits.shape[-1]
    if targets.dtype != torch.long or targets.shape != logits.shape[:-1]:
        raise BackendError(
            f"targets must be long with the logits' leading shape {tuple(logits.shape[:-1])}; "
            f"got {targets.dtype} {tuple(targets.shape)}"
        )
    if vocab_size < 1 or vocab_start != rank * width or tp * width < vocab_size:
        raise BackendError(
            f"vocabulary slice inconsistent: rank {rank} of {tp} holds {width} columns from {vocab_start} "
            f"of a real vocabulary of {vocab_size}; rank r must hold [r * Vp / tp, (r + 1) * Vp / tp) "
            f"of a padded vocabulary Vp = tp * {width} >= vocab_size (vocab_start = {rank * width})"
        )
    if temperature < 0:
        raise BackendError(f"temperature must be >= 0 (0 scores greedy sampling at 1); got {temperature}")
    bad = (targets < 0) | (targets >= vocab_size)
    if bad.any():
        seen = targets[bad][:5].tolist()
        raise BackendError(
            f"{int(bad.sum())} target token ids outside the vocabulary [0, {vocab_size}), e.g. {seen}; "
            "the tokenizer and the model's vocabulary disagree"
        )
    t = 1.0 if temperature == 0.0 else float(temperature)
    real = max(0, min(width, vocab_size - vocab_start))
    logp, ent = _VocabParallelScores.apply(
        logits, targets, vocab_start, real, group, t, entropy, entropy and entropy_grad
    )
    return logp, ent if entropy else None
