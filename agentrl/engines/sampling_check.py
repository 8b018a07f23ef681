"""The sampling-frequency check of ``check_engine``: an engine draws tokens from the distribution it reports.

The ``logprobs`` check compares the logprob an engine reports for the tokens it drew with a
teacher-forced forward; it cannot see a sampler that draws from another distribution and
reports the right number (a wrong temperature, an ignored top-k, a random number reused across
steps). This check counts draws instead:

``sampling[<setting>] first``  ``draws`` two-token requests from one prompt, each with its own
    seed (``seed + i``), sent ``concurrency`` at a time. The first tokens' frequencies are tested
    against the reference's next-token probabilities under the same temperature / top-k / top-p
    (:func:`~agentrl.engines.sampling.filtered_logprobs`) with Pearson's chi-square
    goodness-of-fit test. Tokens in order of decreasing probability are grouped into consecutive
    categories, each expected at least ``MIN_EXPECTED`` times (a token expected that often is
    a category of its own; the tail is pooled into bins of a few rare tokens, the last bin's
    remainder joining the bin before it); degrees of freedom = categories - 1.
    A draw of a token the filters exclude (probability 0) fails at once.
``sampling[<setting>] second|first``  independence of successive draws within a request: for
    the ``max_groups`` most frequent first tokens ``a``, the second tokens of the requests that
    drew ``a`` are tested against the reference's ``p(. | prompt + a)``. Given the first tokens,
    these groups are independent multinomials, so their chi-square statistics and degrees of
    freedom add up to one test. It detects a second token that depends on the first token's
    random number (a uniform or exponential reused across steps makes the second draw a
    function of where the first one landed), a decode step that samples from a different
    context than the one it reports, and a decode path with other sampling settings than the
    prefill's.

A test fails when its p-value is below ``alpha`` (default 1e-3): a correct sampler under random
seeds fails one test in 1 / alpha. The seeds are fixed, so for a given engine, model and
``seed`` the outcome is deterministic: a passing engine keeps passing. The test's power grows
with ``draws`` and with how peaked the model's next-token distribution is: against a nearly
uniform distribution (a random model over a large vocabulary) temperature errors barely change
the frequencies; check a model whose next-token entropy is a few nats.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from agentrl.engines.protocol import Engine, Generation
from agentrl.engines.sampling import SamplingBatch, filtered_logprobs
from agentrl.errors import ConfigError
from agentrl.types import SamplingParams

__all__ = [
    "DEFAULT_SETTINGS",
    "MIN_EXPECTED",
    "ChiSquare",
    "chi_square_sf",
    "draw_pairs",
    "goodness_of_fit",
    "sampling_tests",
]

_EXCLUDED = "the sampler draws tokens that its temperature / top-k / top-p filters exclude"

MIN_EXPECTED = 5.0
"""Pearson's rule: every category of a chi-square test is expected at least this many times."""

DEFAULT_SETTINGS: tuple[Mapping[str, Any], ...] = (
    {"temperature": 1.0},
    {"temperature": 0.7},
    {"temperature": 0.7, "top_k": 20, "top_p": 0.9},
)
"""The sampling settings ``check_engine`` draws at: plain T=1, a typical training temperature, filters."""


@dataclass(frozen=True)
class ChiSquare:
    """One chi-square goodness-of-fit test: the statistic, its degrees of freedom, the p-value."""

    statistic: float
    dof: int
    p_value: float
    draws: int

    def __str__(self) -> str:
        return f"chi2={self.statistic:.1f} dof={self.dof} p={self.p_value:.3g} ({self.draws} draws)"


def chi_square_sf(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square(dof): the regularized upper incomplete gamma Q(dof/2, x/2)."""
    if dof < 1:
        raise ConfigError(f"a chi-square test needs dof >= 1, got {dof}")
    a = torch.tensor(dof / 2.0, dtype=torch.float64)
    x = torch.tensor(max(statistic, 0.0) / 2.0, dtype=torch.float64)
    return float(torch.special.gammaincc(a, x))


def goodness_of_fit(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom of ``counts`` ``(V,)`` against ``probs`` ``(V,)``.

    Pools the tokens expected fewer than :data:`MIN_EXPECTED` times (see the module docstring).
    Returns ``dof == 0`` when fewer than two categories remain (too few draws to test). Draws of
    zero-probability tokens are the caller's to reject first.
    """
    n = float(counts.sum())
    expected = n * probs.double()
    order = torch.argsort(expected, descending=True, stable=True)
    obs: list[float] = []
    exp: list[float] = []
    o_acc = e_acc = 0.0
    for o, e in zip(counts[order].double().tolist(), expected[order].tolist(), strict=True):
        if e <= 0:
            break
        o_acc, e_acc = o_acc + o, e_acc + e
        if e_acc >= MIN_EXPECTED:
            obs.append(o_acc)
            exp.append(e_acc)
            o_acc = e_acc = 0.0
    if e_acc > 0:  # the least likely tokens, expected fewer than MIN_EXPECTED times together
        if exp:
            obs[-1], exp[-1] = obs[-1] + o_acc, exp[-1] + e_acc
        else:
            obs, exp = [o_acc], [e_acc]
    if len(exp) < 2:
        return 0.0, 0
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp, strict=True))
    return stat, len(exp) - 1


async def draw_pairs(
    engine: Engine, prompt: list[int], params: SamplingParams, seeds: range
) -> list[Generation]:
    """One two-token completion of ``prompt`` per seed, all requests in flight at once."""

    async def one(seed: int) -> Generation:
        p = params.model_copy(update={"seed": seed, "max_new_tokens": 2, "ignore_eos": True})
        return await engine.generate(prompt, p, request_id=f"check-engine-sampling-{seed}")

    return list(await asyncio.gather(*(one(s) for s in seeds)))


def _probs(reference: torch.nn.Module, contexts: list[list[int]], params: SamplingParams) -> torch.Tensor:
    """The reference's sampling distribution ``(len(contexts), V)`` after each context (equal lengths)."""
    with torch.no_grad():
        logits = reference(torch.tensor(contexts)).logits[:, -1].float()
    n = len(contexts)
    batch = SamplingBatch.build([params.temperature] * n, [params.top_p] * n, [params.top_k] * n)
    return filtered_logprobs(logits, batch).exp().double()


def _counts(tokens: list[int], vocab: int) -> torch.Tensor:
    return torch.bincount(torch.tensor(tokens, dtype=torch.long), minlength=vocab)


def _impossible(counts: torch.Tensor, probs: torch.Tensor) -> dict[int, int]:
    """Tokens drawn although their probability is 0 (excluded by top-k / top-p), with their counts."""
    bad = (counts > 0) & (probs <= 0)
    return {int(t): int(counts[t]) for t in bad.nonzero().flatten()}


def sampling_tests(
    engine: Engine,
    reference: torch.nn.Module,
    prompt: list[int],
    params: SamplingParams,
    *,
    vocab_size: int,
    draws: int,
    seed: int,
    concurrency: int,
    max_groups: int,
    run: Callable[[Callable[[], Awaitable[list[Generation]]]], list[Generation]],
) -> tuple[dict[str, ChiSquare | None], str | None]:
    """Draw and test one sampling setting: ``({"first": ..., "second|first": ...}, problem or None)``.

    Requests are seeded ``seed``, ``seed + 1``, ... and sent ``concurrency`` at a time, each batch
    through ``run`` (which runs a coroutine factory to completion under the caller's deadline).
    A test with too few draws to form two categories is ``None``. ``problem`` describes what no
    p-value is needed to reject: a token of probability 0 drawn, a wrong number of tokens.
    """
    gens: list[Generation] = []
    for start in range(seed, seed + draws, concurrency):
        seeds = range(start, min(start + concurrency, seed + draws))
        gens += run(lambda s=seeds: draw_pairs(engine, prompt, params, s))  # type: ignore[misc]
    short = [g.output_ids for g in gens if len(g.output_ids) != 2]
    if short:
        return {}, (
            f"{len(short)} of {draws} requests for max_new_tokens=2 with ignore_eos gave another number "
            f"of tokens, e.g. {short[0]}; honour max_new_tokens and ignore_eos"
        )
    first = [g.output_ids[0] for g in gens]
    p1 = _probs(reference, [prompt], params)[0]
    c1 = _counts(first, vocab_size)
    out: dict[str, ChiSquare | None] = {"first": _test(c1, p1)}
    if bad := _impossible(c1, p1):
        return out, f"first tokens {bad} (token: draws) have probability 0 under these filters; {_EXCLUDED}"
    common = [a for a, _ in Counter(first).most_common(max_groups)]
    p2 = _probs(reference, [prompt + [a] for a in common], params)
    stat, dof, n = 0.0, 0, 0
    for a, probs in zip(common, p2, strict=True):
        c2 = _counts([g.output_ids[1] for g in gens if g.output_ids[0] == a], vocab_size)
        if bad := _impossible(c2, probs):
            return (
                out,
                f"after first token {a}, second tokens {bad} (token: draws) have probability 0; {_EXCLUDED}",
            )
        s, d = goodness_of_fit(c2, probs)
        stat, dof, n = stat + s, dof + d, n + (int(c2.sum()) if d else 0)
    out["second|first"] = ChiSquare(stat, dof, chi_square_sf(stat, dof), n) if dof else None
    return out, None


def _test(counts: torch.Tensor, probs: torch.Tensor) -> ChiSquare | None:
    stat, dof = goodness_of_fit(counts, probs)
    return ChiSquare(stat, dof, chi_square_sf(stat, dof), int(counts.sum())) if dof else None
