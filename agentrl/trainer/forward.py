"""Teacher-forced scoring of a micro-batch: per-token logprobs, entropy and values in ``(B, T - 1)`` columns.

Column ``t - 1`` scores token ``t`` of the ``(B, T)`` micro-batch: the logits at position
``t - 1`` predict it (:mod:`agentrl.trainer.batch` keeps token coordinates; the shift happens
here). Two forwards produce those logits, each as :class:`Scored` (the logits of the positions
it ran the LM head on, or their last hidden states and the LM head still to run, their target
tokens, and how to put a value per position back into its column):

* :func:`plain_logits`: one forward over the whole rows, the LM head from column ``start`` on
  (``logits_to_keep``); the columns before ``start`` are zero;
* :func:`shared_logits`: one forward per distinct prompt and one over every row's suffix
  (:mod:`agentrl.trainer.prefix`); the prompt's columns are zero.

:func:`token_scores` turns either into logprobs (and entropy) in float32, of ``softmax(logits / T)``
with ``T`` the temperature the tokens were sampled at: the engine reports each token's logprob under
that distribution (docs/engines.md, "Logprob semantics"), and the policy being trained is the one that
samples, so PPO's ratio, the off-policy weights, the KL and the entropy all compare like with like.
:class:`ValueHead` is PPO's critic on the last hidden state.

**Chunked scoring** (``chunk_tokens > 0``, ``--score-chunk-tokens``): the forward stops at the
trunk's last hidden states (:func:`lm_parts`; sharded, the model's own ``output_hidden_states``) and :func:`chunked_scores` runs LM head, ``/ T``,
``log_softmax`` and the gather on ``chunk_tokens`` positions at a time, each chunk under
``torch.utils.checkpoint``: backward recomputes one chunk's logits at a time, so the peak is
``O(chunk x vocab)`` instead of the micro-batch's full-vocabulary logits (at a 151,936-token
vocabulary and 8k positions, ~5 GB of float32 before the backward). The values are today's up to
float32 rounding (the LM head's matmul runs in other blocks); the price is the LM head's matmul
once more in backward. The entropy carries a gradient only when a loss term asks for it; for the
metric alone it is computed in the same chunk pass under ``no_grad`` (all positions: no subsample).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from agentrl.trainer import losses as L
from agentrl.trainer.batch import TrainBatch
from agentrl.trainer.prefix import PromptPlan, scatter_columns, shared_prompt_logits

__all__ = [
    "Scored",
    "ValueHead",
    "chunked_scores",
    "first_trained_column",
    "lm_parts",
    "plain_logits",
    "shared_logits",
    "token_scores",
]


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

    logits: torch.Tensor | None
    """(B, S, V): the positions the LM head ran on; None when ``states`` and ``head`` stand for them"""
    targets: torch.Tensor
    """(B, S) long: the token each position's logits score"""
    place: Callable[[torch.Tensor], torch.Tensor]
    """(B, S) per-position values -> (B, T - 1) columns, zero where nothing was scored"""
    hidden: torch.Tensor | None = None
    """(B, T, H) the last hidden state, when the forward was asked for it (the critic's input)"""
    states: torch.Tensor | None = None
    """(B, S, H): the last hidden states of the scored positions, the LM head not yet run (chunked scoring)"""
    head: nn.Module | None = None
    """the LM head that turns ``states`` into logits"""
    chunk_tokens: int = 0
    """positions per chunk of :func:`chunked_scores`"""


def lm_parts(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """``(trunk, lm_head)`` of an HF causal LM whose logits are ``lm_head(trunk(...).last_hidden_state)``.

    None for a model without ``get_decoder``/``get_output_embeddings``, or one that rescales its
    logits after the head (Gemma's soft-capping, Cohere's ``logit_scale``): chunked scoring needs the
    head to be the last step.
    """
    cfg = getattr(model, "config", None)
    if getattr(cfg, "final_logit_softcapping", None) is not None or getattr(cfg, "logit_scale", None):
        return None
    get_trunk, get_head = getattr(model, "get_decoder", None), getattr(model, "get_output_embeddings", None)
    if not (callable(get_trunk) and callable(get_head)):
        return None
    trunk, head = get_trunk(), get_head()
    return (trunk, head) if isinstance(trunk, nn.Module) and isinstance(head, nn.Module) else None


def first_trained_column(loss_mask: torch.Tensor) -> int:
    """The first logits column any row of the micro-batch trains (``T - 2`` at most; 0 for ``T < 2``).

    The prompt before it is context only: the LM head need not run there.
    """
    T = loss_mask.shape[1]
    trained = loss_mask[:, 1:].any(0).nonzero()
    return int(trained[0]) if len(trained) else max(0, T - 2)


def plain_logits(
    model: nn.Module,
    mb: TrainBatch,
    start: int = 0,
    hidden: bool = False,
    chunk_tokens: int = 0,
    whole: bool = False,
) -> Scored:
    """One forward over the whole rows; the LM head runs on positions ``start .. T - 2`` only.

    ``start > 0`` needs a model that takes ``logits_to_keep``. ``hidden`` also returns the last
    hidden state (for a value head). ``chunk_tokens > 0`` (and a model :func:`lm_parts` splits)
    stops at the trunk: the head runs later, in chunks (:func:`token_scores`). ``whole`` (FSDP2,
    whose hooks gather the root's weights on the model's own forward and keep them for backward)
    gets the last hidden states from the model's forward with the head on one position instead.
    """
    T = mb.input_ids.shape[1]

    def place(x: torch.Tensor) -> torch.Tensor:
        return nn.functional.pad(x, (start, 0)) if start else x

    parts = lm_parts(model) if chunk_tokens > 0 else None
    if parts is not None:
        trunk, head = parts
        if whole:
            h = model(
                input_ids=mb.input_ids, attention_mask=mb.attention_mask, output_hidden_states=True,
                use_cache=False, logits_to_keep=1,
            ).hidden_states[-1]  # fmt: skip
        else:
            h = trunk(
                input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False
            ).last_hidden_state
        return Scored(
            logits=None, targets=mb.input_ids[:, start + 1 :], place=place, hidden=h if hidden else None,
            states=h[:, start:-1], head=head, chunk_tokens=chunk_tokens,
        )  # fmt: skip
    kw = {"logits_to_keep": T - start} if start else {}
    out = model(
        input_ids=mb.input_ids,
        attention_mask=mb.attention_mask,
        output_hidden_states=hidden,
        use_cache=False,
        **kw,
    )
    return Scored(
        logits=out.logits[:, -(T - start) : -1],  # the positions start .. T-2 predict tokens start+1 .. T-1
        targets=mb.input_ids[:, start + 1 :],
        place=place,
        hidden=out.hidden_states[-1] if hidden else None,
    )


def shared_logits(
    model: nn.Module, mb: TrainBatch, plan: PromptPlan, cache_kw: str, chunk_tokens: int = 0
) -> Scored:
    """The prompt's forward once per distinct prompt, then every row's suffix (:mod:`agentrl.trainer.prefix`).

    ``chunk_tokens > 0``: the suffix's forward stops at the trunk, as in :func:`plain_logits`.
    """
    T = mb.input_ids.shape[1]
    parts = lm_parts(model) if chunk_tokens > 0 else None
    trunk = parts[0] if parts is not None else None
    out, targets, cols = shared_prompt_logits(model, mb.input_ids, plan, cache_kw, trunk=trunk)

    def place(x: torch.Tensor) -> torch.Tensor:
        return scatter_columns(x, cols, T - 1)

    if parts is not None:
        return Scored(None, targets, place, states=out, head=parts[1], chunk_tokens=chunk_tokens)
    return Scored(logits=out, targets=targets, place=place)


def token_scores(
    scored: Scored, temperature: float = 1.0, entropy: bool = False, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logp, entropy | None)`` of ``softmax(logits / temperature)``, each ``(B, T - 1)`` float32,
    zero in the columns not scored.

    ``temperature == 0`` scores the plain logits: greedy decoding reports the argmax's logprob
    under ``log_softmax(logits)`` (a point mass would carry no information; docs/engines.md).
    The entropy is differentiable only with ``entropy_grad`` (and grad mode on): the bonus is
    the only loss term that needs its gradient, and without it the softmax is not kept for backward.
    A :class:`Scored` that carries ``states`` is scored by :func:`chunked_scores`.
    """
    if scored.logits is None:
        assert scored.states is not None and scored.head is not None
        B, S, H = scored.states.shape
        lp, en = chunked_scores(
            scored.states.reshape(B * S, H), scored.head, scored.targets.reshape(B * S), temperature,
            entropy, entropy_grad, scored.chunk_tokens,
        )  # fmt: skip
        return scored.place(lp.view(B, S)), None if en is None else scored.place(en.view(B, S))
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


def _chunk(
    states: torch.Tensor,
    targets: torch.Tensor,
    head: nn.Module,
    temperature: float,
    entropy: bool,
    grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's ``(logp, entropy)`` (``(n,)`` float32; the entropy empty unless asked for)."""
    logits = head(states).float()  # float32 logprobs also from bf16 (autocast) logits
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not entropy:
        return logp, logits.new_zeros(0)
    # last: a checkpoint's recompute stops once backward has what it needs (no gradient: never)
    with torch.set_grad_enabled(torch.is_grad_enabled() and grad):
        return logp, -(logp_all.exp() * logp_all).sum(-1)  # L.entropy_from_logits, its log_softmax reused


def chunked_scores(
    states: torch.Tensor,
    head: nn.Module,
    targets: torch.Tensor,
    temperature: float = 1.0,
    entropy: bool = False,
    entropy_grad: bool = False,
    chunk_tokens: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logp, entropy | None)``, each ``(N,)`` float32, of ``softmax(head(states) / temperature)`` at ``targets``.

    ``states`` ``(N, H)`` runs through ``head`` ``chunk_tokens`` positions at a time; with grad
    mode on and more than one chunk, each chunk is a ``torch.utils.checkpoint`` so that backward
    keeps no chunk's logits (it recomputes them, one chunk at a time). The semantics are
    :func:`token_scores`'s, ``entropy_grad`` included.
    """
    N = states.shape[0]
    if N == 0:
        empty = states.new_zeros(0, dtype=torch.float32)
        return empty, empty if entropy else None
    step = chunk_tokens if chunk_tokens > 0 else N
    ckpt = torch.is_grad_enabled() and step < N
    lps, ents = [], []
    for i in range(0, N, step):
        args: tuple[Any, ...] = (states[i : i + step], targets[i : i + step], head, temperature)
        args += (entropy, entropy_grad)
        lp, en = checkpoint(_chunk, *args, use_reentrant=False) if ckpt else _chunk(*args)
        lps.append(lp)
        ents.append(en)
    return torch.cat(lps), torch.cat(ents) if entropy else None
