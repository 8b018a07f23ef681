"""Teacher-forced scoring of a micro-batch: per-token logprobs, entropy and values in ``(B, T - 1)`` columns.

Column ``t - 1`` scores token ``t`` of the ``(B, T)`` micro-batch: the logits at position
``t - 1`` predict it (:mod:`agentrl.trainer.batch` keeps token coordinates; the shift happens
here). Two forwards produce those logits, each as :class:`Scored` (the logits of the positions
it ran the LM head on, their target tokens, and how to put a value per position back into its
column):

* :func:`plain_logits`: one forward over the whole rows, the LM head from column ``start`` on
  (``logits_to_keep``); the columns before ``start`` are zero;
* :func:`shared_logits`: one forward per distinct prompt and one over every row's suffix
  (:mod:`agentrl.trainer.prefix`); the prompt's columns are zero.

:func:`token_scores` turns either into logprobs (and entropy) in float32, of ``softmax(logits / T)``
with ``T`` the temperature the tokens were sampled at: the engine reports each token's logprob under
that distribution (docs/engines.md, "Logprob semantics"), and the policy being trained is the one that
samples, so PPO's ratio, the off-policy weights, the KL and the entropy all compare like with like.
:class:`ValueHead` is PPO's critic on the last hidden state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from agentrl.trainer import losses as L
from agentrl.trainer.batch import TrainBatch
from agentrl.trainer.prefix import PromptPlan, scatter_columns, shared_prompt_logits

__all__ = ["Scored", "ValueHead", "first_trained_column", "plain_logits", "shared_logits", "token_scores"]


class ValueHead(nn.Module):
    """A scalar critic on the policy's last hidden state (shared trunk, as in PPO for LMs)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden).squeeze(-1)


@dataclass
class Scored:
    """The logits one forward computed, and where they go in the ``(B, T - 1)`` columns."""

    logits: torch.Tensor
    """(B, S, V): the positions the LM head ran on"""
    targets: torch.Tensor
    """(B, S) long: the token each position's logits score"""
    place: Callable[[torch.Tensor], torch.Tensor]
    """(B, S) per-position values -> (B, T - 1) columns, zero where nothing was scored"""
    hidden: torch.Tensor | None = None
    """(B, T, H) the last hidden state, when the forward was asked for it (the critic's input)"""


def first_trained_column(loss_mask: torch.Tensor) -> int:
    """The first logits column any row of the micro-batch trains (``T - 2`` at most; 0 for ``T < 2``).

    The prompt before it is context only: the LM head need not run there.
    """
    T = loss_mask.shape[1]
    trained = loss_mask[:, 1:].any(0).nonzero()
    return int(trained[0]) if len(trained) else max(0, T - 2)


def plain_logits(model: nn.Module, mb: TrainBatch, start: int = 0, hidden: bool = False) -> Scored:
    """One forward over the whole rows; the LM head runs on positions ``start .. T - 2`` only.

    ``start > 0`` needs a model that takes ``logits_to_keep``. ``hidden`` also returns the last
    hidden state (for a value head).
    """
    T = mb.input_ids.shape[1]
    kw = {"logits_to_keep": T - start} if start else {}
    out = model(
        input_ids=mb.input_ids,
        attention_mask=mb.attention_mask,
        output_hidden_states=hidden,
        use_cache=False,
        **kw,
    )

    def place(x: torch.Tensor) -> torch.Tensor:
        return nn.functional.pad(x, (start, 0)) if start else x

    return Scored(
        logits=out.logits[:, -(T - start) : -1],  # the positions start .. T-2 predict tokens start+1 .. T-1
        targets=mb.input_ids[:, start + 1 :],
        place=place,
        hidden=out.hidden_states[-1] if hidden else None,
    )


def shared_logits(model: nn.Module, mb: TrainBatch, plan: PromptPlan, cache_kw: str) -> Scored:
    """The prompt's forward once per distinct prompt, then every row's suffix (:mod:`agentrl.trainer.prefix`)."""
    T = mb.input_ids.shape[1]
    logits, targets, cols = shared_prompt_logits(model, mb.input_ids, plan, cache_kw)

    def place(x: torch.Tensor) -> torch.Tensor:
        return scatter_columns(x, cols, T - 1)

    return Scored(logits=logits, targets=targets, place=place)


def token_scores(
    scored: Scored, temperature: float = 1.0, entropy: bool = False, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logp, entropy | None)`` of ``softmax(logits / temperature)``, each ``(B, T - 1)`` float32,
    zero in the columns not scored.

    ``temperature == 0`` scores the plain logits: greedy decoding reports the argmax's logprob
    under ``log_softmax(logits)`` (a point mass would carry no information; docs/engines.md).
    The entropy is differentiable only with ``entropy_grad`` (and grad mode on): the bonus is
    the only loss term that needs its gradient, and without it the softmax is not kept for backward.
    """
    logits = scored.logits.float()
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    logp = scored.place(
        torch.log_softmax(logits, dim=-1).gather(-1, scored.targets.unsqueeze(-1)).squeeze(-1)
    )
    ent = None
    if entropy:
        with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
            ent = scored.place(L.entropy_from_logits(logits))
    return logp, ent
