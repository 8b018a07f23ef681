"""Policy and value losses: tensors in, a scalar loss and detached statistics out.

Shapes: per-token tensors are ``(B, T)``; ``mask`` is 1 on sampled tokens only.
``logp`` carries gradients; ``old_logp`` (the behaviour policy, from the engine
or a recompute), ``ref_logp`` and ``advantages`` do not.

- PPO clip (Schulman et al. 2017, eq. 7) with asymmetric "clip-higher" bounds
  ``[1 - clip_low, 1 + clip_high]`` (DAPO, Yu et al. 2025) and dual clip
  (Ye et al. 2020, eq. 5): for ``A < 0`` the loss is bounded by ``-c A``.
- GSPO (Zheng et al. 2025): the importance ratio is the geometric mean over the
  sequence, ``s_i = exp(mean_t(logp - old_logp))``, clipped per sequence; the
  gradient flows per token through ``sg(s_i) * exp(logp - sg(logp))``.
- CISPO (MiniMax-M1, 2025): ``-sg(clip(r, 1 - low, 1 + high)) * A * logp``; every
  token keeps a gradient, only its weight is clipped.
- KL to the reference model (Schulman's estimators): k1 ``log r``, k2 ``(log r)^2 / 2``,
  k3 ``r' - log r' - 1`` with ``r' = p_ref / p``, and k3+ (k3's value, k2's gradient). Used as a
  loss only k2 and k3+ have the gradient of KL(pi || ref) in expectation (:func:`kl_penalty`).
- Aggregation: ``token-mean`` (sum over all tokens / token count), ``seq-mean-token-mean``
  (per-sequence mean, then mean), ``seq-mean-token-sum`` (per-sequence sum, then mean),
  ``seq-mean-token-sum-norm`` (Dr.GRPO, Liu et al. 2025: per-sequence sum over a constant
  ``norm_tokens``, the generation budget, then mean: the sum over all tokens / (sequences x
  ``norm_tokens``), so a token's gradient depends on no length; verl's name for it).
  ``num_tokens``/``num_seqs`` override the denominators so that micro-batches and
  ranks add up to exactly the full-batch loss. A "sequence" is an episode: with
  ``seq_tokens`` (each row's episode's sampled tokens, over all its segments) a row's
  tokens are averaged over its whole episode, and ``num_seqs`` counts episodes.
- DAPO dynamic sampling (drop constant-reward groups) and overlong reward shaping.
- PPO value loss with clipping (as in OpenAI baselines' ppo2).

Decoupled PPO and the off-policy corrections of its behaviour weight (TIS, MIS, IcePop) are
:mod:`agentrl.trainer.offpolicy`; they reuse :func:`policy_loss` with ``weights``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrl.errors import ConfigError

__all__ = [
    "LossOut",
    "aggregate",
    "dynamic_sampling_keep",
    "entropy_from_logits",
    "kl_penalty",
    "overlong_penalty",
    "policy_loss",
    "value_loss",
]


@dataclass
class LossOut:
    loss: torch.Tensor
    stats: dict[str, float]


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    seq_tokens: torch.Tensor | None = None,
    norm_tokens: float | None = None,
) -> torch.Tensor:
    """Reduce a ``(B, T)`` per-token loss to a scalar (see the module docstring for modes).

    ``seq_tokens`` ``(B,)``: the sampled tokens of each row's episode, which ``seq-mean-token-mean``
    divides by (None: each row is its own episode); ``num_seqs`` is then the number of episodes.
    ``norm_tokens``: ``seq-mean-token-sum-norm``'s constant (required by that mode only).
    """
    m = mask.to(per_token.dtype)
    if mode == "token-mean":
        denom = num_tokens if num_tokens is not None else m.sum().clamp(min=1.0)
        return (per_token * m).sum() / denom
    seq_tok = m.sum(-1) if seq_tokens is None else seq_tokens.to(per_token.dtype)
    n_seq = num_seqs if num_seqs is not None else max(per_token.shape[0], 1)
    if mode == "seq-mean-token-mean":
        return ((per_token * m).sum(-1) / seq_tok.clamp(min=1.0)).sum() / n_seq
    if mode == "seq-mean-token-sum":
        return (per_token * m).sum(-1).sum() / n_seq
    if mode == "seq-mean-token-sum-norm":
        if norm_tokens is None or norm_tokens <= 0:
            raise ConfigError(
                f"loss aggregation {mode!r} needs norm_tokens > 0 (the generation budget, max_new_tokens), "
                f"got {norm_tokens!r}"
            )
        return (per_token * m).sum() / (n_seq * norm_tokens)
    raise ConfigError(
        f"unknown loss aggregation {mode!r}; use token-mean, seq-mean-token-mean, seq-mean-token-sum "
        "or seq-mean-token-sum-norm"
    )


def _masked_mean(x: torch.Tensor, m: torch.Tensor) -> float:
    return float((x * m).sum() / m.sum().clamp(min=1.0))


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    kind: str = "ppo",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float = 0.0,
    agg: str = "token-mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    seq_tokens: torch.Tensor | None = None,
    norm_tokens: float | None = None,
    weights: torch.Tensor | None = None,
) -> LossOut:
    """The clipped surrogate of ``kind`` (ppo | gspo | cispo); ``advantages`` is ``(B, T)``.

    ``weights`` (``(B, T)``, detached) multiply each token's loss before aggregation: the
    behaviour correction of decoupled PPO (:mod:`agentrl.trainer.offpolicy`); None leaves the
    loss untouched.
    """
    m = mask.to(logp.dtype)
    old_logp = old_logp.detach()
    advantages = advantages.detach()
    log_ratio = (logp - old_logp) * m
    if kind == "ppo":
        ratio = torch.exp(log_ratio)
        pg1 = -advantages * ratio
        pg2 = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
        per_tok = torch.maximum(pg1, pg2)
        clipped = (pg2 > pg1).to(logp.dtype)
        if dual_clip:
            bound = -advantages * dual_clip
            per_tok = torch.where(advantages < 0, torch.minimum(per_tok, bound), per_tok)
    elif kind == "gspo":
        seq_log_ratio = log_ratio.sum(-1) / m.sum(-1).clamp(min=1.0)
        token_log_ratio = seq_log_ratio.detach()[:, None] + logp - logp.detach()
        ratio = torch.exp(token_log_ratio)
        pg1 = -advantages * ratio
        pg2 = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
        per_tok = torch.maximum(pg1, pg2)
        clipped = (pg2 > pg1).to(logp.dtype)
    elif kind == "cispo":
        ratio = torch.exp(log_ratio)
        weight = ratio.clamp(1 - clip_low, 1 + clip_high).detach()
        per_tok = -weight * advantages * logp
        clipped = (weight != ratio.detach()).to(logp.dtype)
    else:
        raise ConfigError(f"unknown policy loss {kind!r}; use ppo, gspo or cispo")
    if weights is not None:
        per_tok = per_tok * weights.detach()
    loss = aggregate(
        per_tok,
        m,
        agg,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        seq_tokens=seq_tokens,
        norm_tokens=norm_tokens,
    )
    with torch.no_grad():
        stats = {
            "clip_frac": _masked_mean(clipped, m),
            "approx_kl": _masked_mean(0.5 * log_ratio**2, m),
            "ratio_mean": _masked_mean(torch.exp(log_ratio), m),
        }
    return LossOut(loss, stats)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate from tokens sampled from pi, to be minimised as a loss.

    With ``d = logp - ref_logp`` on a sampled token, every value is an estimate of KL(pi || ref)
    (Schulman 2020, "Approximating KL divergence"); what the loss minimises is its *gradient*.
    The loss averages over sampled tokens, so its expected gradient is
    ``E_pi[f'(d) grad log pi]``: the sampling probability itself is not differentiated
    (Tang & Munos 2025, "On a few pitfalls in KL divergence gradient estimation for RL"):

    - ``k1`` = ``d``: unbiased value, can be negative; expected gradient ``E_pi[grad log pi] = 0``,
      so as a loss it does nothing in expectation (only noise).
    - ``k2`` = ``d^2 / 2``: biased value (its mean agrees with the KL to second order while pi
      is near ref), non-negative; expected gradient ``E_pi[d grad log pi] = grad KL(pi || ref)``.
    - ``k3`` = ``exp(-d) + d - 1``: unbiased, non-negative, low-variance value (verl's
      ``low_var_kl``, the GRPO paper's KL term); expected gradient
      ``E_pi[(1 - ref / pi) grad log pi] = -E_ref[grad log pi] = grad KL(ref || pi)``: the
      forward, mass-covering KL, not the divergence it reports.
    - ``k3+``: k3's value with k2's gradient (straight through:
      ``sg(k3) + k2 - sg(k2)``, verl's ``k3+``): the value users log, the gradient of
      KL(pi || ref). The default.

    Per token, "gradient of KL(pi || ref)" is that of the next-token distributions' KL at the
    visited contexts; how a token changes the later contexts is not differentiated (a partial
    gradient of the sequence KL, Tang & Munos 2025), as in every token-level KL loss. k3's value
    clamps ``d`` to ``[-20, 20]`` so that the exponential cannot overflow.
    """
    log_r = logp - ref_logp.detach()
    if estimator == "k1":
        return log_r
    if estimator == "k2":
        return 0.5 * log_r**2
    if estimator in ("k3", "k3+"):
        neg = -log_r.clamp(-20, 20)
        k3 = torch.exp(neg) - neg - 1
        if estimator == "k3":
            return k3
        k2 = 0.5 * log_r**2
        return k3.detach() + k2 - k2.detach()
    raise ConfigError(f"unknown KL estimator {estimator!r}; use k1, k2, k3 or k3+")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of the softmax over the last dimension."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float = 0.2,
    agg: str = "token-mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    seq_tokens: torch.Tensor | None = None,
    norm_tokens: float | None = None,
) -> LossOut:
    """``0.5 * max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2)``, aggregated."""
    old_values, returns = old_values.detach(), returns.detach()
    v_clipped = old_values + (values - old_values).clamp(-clip, clip)
    l1 = (values - returns) ** 2
    l2 = (v_clipped - returns) ** 2
    per_tok = 0.5 * torch.maximum(l1, l2)
    m = mask.to(values.dtype)
    loss = aggregate(
        per_tok,
        m,
        agg,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        seq_tokens=seq_tokens,
        norm_tokens=norm_tokens,
    )
    return LossOut(loss, {"vf_clip_frac": _masked_mean((l2 > l1).to(values.dtype), m)})


def dynamic_sampling_keep(rewards: torch.Tensor, group_ids: torch.Tensor, tol: float = 1e-8) -> torch.Tensor:
    """DAPO dynamic sampling: a bool mask ``(N,)`` keeping episodes of groups with non-constant reward."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    n = int(inv.max()) + 1 if inv.numel() else 0
    big = torch.finfo(torch.float64).max
    r = rewards.double()
    lo = torch.full((n,), big, dtype=torch.float64).scatter_reduce(0, inv, r, "amin")
    hi = torch.full((n,), -big, dtype=torch.float64).scatter_reduce(0, inv, r, "amax")
    return (hi - lo > tol)[inv]


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, penalty: float = 1.0) -> torch.Tensor:
    """DAPO soft overlong punishment (eq. 13): 0 up to ``max_len - buffer``, then linear down to ``-penalty``."""
    if buffer <= 0:
        return torch.zeros_like(lengths, dtype=torch.float32)
    start = max_len - buffer
    over = (lengths.float() - start).clamp(min=0.0)
    return -(over / buffer).clamp(max=1.0) * penalty
