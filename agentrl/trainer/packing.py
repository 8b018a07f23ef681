"""Padding-free packing: a micro-batch's rows as one ``(1, N)`` sequence that attention cannot cross.

A right-padded ``(B, T)`` micro-batch computes ``B * T`` positions, of which only
``N = sum(lengths)`` are real. Packed, the rows are concatenated into one ``(1, N)`` row; each
keeps its own positions ``0 .. len - 1`` (so RoPE sees what it saw padded) and attends only to
itself. How attention is kept inside a row depends on the model's attention implementation:

==================  ===========================================================================
``sdpa``            per-row causal SDPA: the rows' slices of the packed queries, keys and values
                    go through transformers' own SDPA one row at a time (:func:`_sdpa_rows`),
                    so attention costs ``sum(len**2)``, not ``N**2``, and no ``N x N`` mask is built
``eager``           a block-diagonal causal ``(1, 1, N, N)`` mask (``N**2`` memory: eager is for
                    debugging)
``flash_attention`` ``position_ids`` that restart at 0 at every row plus ``cu_seq_lens_*``: what
                    transformers' varlen flash path reads (GPU only; not run by the CPU tests)
==================  ===========================================================================

Any other implementation (flex, paged) cannot pack: ``--packing on`` is refused naming it.

The LM head runs only on the packed positions whose logits are scored (``logits_to_keep`` with
the positions as a tensor): in the update the trained tokens, in scoring every real token but
each row's last. The scores go back into the ``(B, T - 1)`` columns the losses read (column
``t - 1`` scores token ``t``), zero everywhere else; the last hidden state goes back into
``(B, T, H)`` for a value head. Logprobs, entropy, losses and gradients equal the padded
forward's to float rounding (tests/trainer/test_packing.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import nn

from agentrl.trainer.batch import TrainBatch, token_budget_microbatches
from agentrl.trainer.config import OptimConfig
from agentrl.trainer.errors import BackendError
from agentrl.trainer.forward import Scored, lm_parts

__all__ = ["micro_batches", "packed_logits", "packing_attention"]

Attention = Literal["sdpa", "eager", "flash"]

_ROWS_KW = "agentrl_packed_rows"
"""the keyword that carries a packed forward's row boundaries down to :func:`_sdpa_rows`"""


def packing_attention(mode: str, model: nn.Module) -> Attention | None:
    """How a packed forward keeps ``model``'s rows apart, or ``None`` when it does not pack.

    ``mode`` is ``--packing``: ``off`` never packs, ``on`` packs or fails naming the attention
    that cannot, ``auto`` packs wherever the attention can (the backend still takes the
    shared-prompt forward for a micro-batch where it computes fewer positions; docs/benchmarks.md,
    "Packing", for what was measured).
    """
    if mode not in ("auto", "on", "off"):
        raise BackendError(f"--packing {mode!r}: choose one of auto, on, off")
    if mode == "off":
        return None
    impl = str(getattr(getattr(model, "config", None), "_attn_implementation", None))
    kind: Attention | None = None
    if impl.startswith("flash_attention"):
        kind = "flash"
    elif impl == "sdpa":
        kind = "sdpa"
    elif impl == "eager":
        kind = "eager"
    if kind is None and mode == "on":
        raise BackendError(
            f"--packing on: the model's attention implementation {impl!r} cannot keep packed rows apart; "
            "load it with sdpa, eager or flash_attention_2, or use --packing auto|off"
        )
    if kind == "sdpa":
        _install_sdpa_rows()
    return kind


def micro_batches(
    batch: TrainBatch, optim: OptimConfig, model: nn.Module, keys: list[tuple[int, ...]] | None = None
) -> list[list[int]]:
    """``batch``'s rows per micro-batch within ``optim.micro_batch_tokens``: real tokens when ``model``'s
    forward packs (``optim.packing``), else rows x longest row (:func:`~agentrl.trainer.batch.token_budget_microbatches`)."""
    packed = packing_attention(optim.packing, model) is not None
    return token_budget_microbatches(batch.lengths.tolist(), optim.micro_batch_tokens, keys, packed)


def packed_logits(
    model: nn.Module,
    mb: TrainBatch,
    attention: Attention,
    *,
    trained_only: bool,
    keep: bool,
    hidden: bool = False,
    chunk_tokens: int = 0,
    whole: bool = False,
) -> Scored:
    """One forward over the micro-batch's rows packed into ``(1, N)``; see the module docstring.

    ``trained_only``: score only the trained tokens (the update; the LM head runs there only when
    ``keep``, i.e. the model takes ``logits_to_keep``), else every real token after a row's first.
    ``hidden`` returns the last hidden state unpacked to ``(B, T, H)`` (zero on padding).
    ``chunk_tokens`` and ``whole`` are :func:`~agentrl.trainer.forward.plain_logits`'s: the forward
    stops at the trunk and the head runs in chunks later (the trunk through the model's own forward
    under FSDP2).
    """
    B, T = mb.input_ids.shape
    real = mb.attention_mask > 0
    lengths = real.sum(-1)
    if not bool((real == (torch.arange(T, device=real.device)[None] < lengths[:, None])).all()):
        raise BackendError("packing needs right-padded rows (attention_mask 1 on a prefix of each row)")
    ids = mb.input_ids[real][None]
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    scored = real[:, 1:] & (mb.loss_mask[:, 1:] > 0) if trained_only else real[:, 1:]
    row, col = scored.nonzero(as_tuple=True)
    src = offsets[row] + col  # the packed position whose logits score token col + 1 of row
    bounds = offsets.tolist()
    kw: dict[str, Any] = _attention_kwargs(attention, bounds, ids, next(model.parameters()).dtype)
    kw.update(input_ids=ids, position_ids=(real.long().cumsum(-1) - 1)[real][None], use_cache=False)
    rows = _Rows(bounds)
    if attention == "sdpa":
        kw[_ROWS_KW] = rows
    parts = lm_parts(model) if chunk_tokens > 0 else None
    if parts is None:
        out = model(output_hidden_states=hidden, **kw, **({"logits_to_keep": src} if keep else {}))
        last = out.hidden_states[-1] if hidden else None
    elif whole:
        last = model(output_hidden_states=True, logits_to_keep=1, **kw).hidden_states[-1]
    else:
        last = parts[0](**kw).last_hidden_state
    if attention == "sdpa" and rows.calls == 0:
        raise BackendError(
            f"{type(model).__name__}'s attention does not dispatch through transformers' attention "
            "functions, so a packed forward cannot keep its rows apart; use --packing off"
        )
    flat = row * (T - 1) + col

    def place(x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(B * (T - 1)).index_copy(0, flat, x.reshape(-1)).view(B, T - 1)

    h = None
    if hidden and last is not None:
        h = last.new_zeros(B * T, last.shape[-1]).index_copy(0, real.view(-1).nonzero()[:, 0], last[0])
        h = h.view(B, T, -1)
    targets = mb.input_ids[row, col + 1][None]
    if parts is not None:
        assert last is not None
        return Scored(
            None, targets, place, hidden=h, states=last[:, src], head=parts[1], chunk_tokens=chunk_tokens
        )
    return Scored(logits=out.logits if keep else out.logits[:, src], targets=targets, place=place, hidden=h)


class _Rows:
    """A packed forward's row boundaries, and how many attention calls read them (0: not ours)."""

    def __init__(self, bounds: list[int]) -> None:
        self.sizes = [e - s for s, e in zip(bounds[:-1], bounds[1:], strict=True) if e > s]
        self.calls = 0


def _attention_kwargs(
    attention: Attention, bounds: list[int], ids: torch.Tensor, dtype: torch.dtype
) -> dict[str, Any]:
    N = ids.shape[1]
    if attention == "sdpa":
        # an all-ones 2-D mask: transformers builds no N x N mask (nor reads packing from the positions)
        return {"attention_mask": torch.ones_like(ids)}
    if attention == "flash":
        cu = torch.tensor(bounds, dtype=torch.int32, device=ids.device)
        longest = max(e - s for s, e in zip(bounds[:-1], bounds[1:], strict=True))
        return {"attention_mask": None, "cu_seq_lens_q": cu, "cu_seq_lens_k": cu,
                "max_length_q": longest, "max_length_k": longest}  # fmt: skip
    seg = torch.repeat_interleave(
        torch.arange(len(bounds) - 1, device=ids.device), torch.tensor(bounds, device=ids.device).diff()
    )
    causal = torch.ones((N, N), dtype=torch.bool, device=ids.device).tril()
    allowed = causal & (seg[:, None] == seg[None, :])
    neg = torch.finfo(dtype).min
    return {
        "attention_mask": torch.zeros((N, N), dtype=dtype, device=ids.device).masked_fill_(~allowed, neg)[
            None, None
        ]
    }


def _install_sdpa_rows() -> None:
    """Put :func:`_sdpa_rows` in front of transformers' ``sdpa`` (once per process; a pass-through
    for every forward that is not packed, so the engine and unpacked forwards are unchanged)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    base = ALL_ATTENTION_FUNCTIONS["sdpa"]
    if getattr(base, "_agentrl_packed_rows", False):
        return
    ALL_ATTENTION_FUNCTIONS["sdpa"] = _sdpa_rows(base)


def _sdpa_rows(base: Callable[..., Any]) -> Callable[..., Any]:
    def attention(
        module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
        attention_mask: torch.Tensor | None, *args: Any, **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:  # fmt: skip
        rows: _Rows | None = kwargs.pop(_ROWS_KW, None)
        if rows is None:
            return base(module, query, key, value, attention_mask, *args, **kwargs)
        if attention_mask is not None or kwargs.get("sliding_window"):
            raise BackendError(
                "a packed forward met an attention mask or a sliding window it cannot apply per row; use --packing off"
            )
        rows.calls += 1
        # (1, heads, N, d) -> each row causal on its own part; the outputs are (1, len, heads, d). split,
        # not slicing: a slice's backward writes its gradient into a zero tensor of the whole sequence
        parts = [t.split(rows.sizes, dim=2) for t in (query, key, value)]
        outs = [base(module, q, k, v, None, *args, **kwargs)[0] for q, k, v in zip(*parts, strict=True)]
        return torch.cat(outs, dim=1), None

    attention._agentrl_packed_rows = True  # type: ignore[attr-defined]
    return attention
