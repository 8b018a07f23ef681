"""The fast sampler draws from exactly the distribution it reports, at small and at Qwen-size vocabularies."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.engines import sampling
from agentrl.engines.sampling import SamplingBatch, filtered_logprobs, sample


def _batch(n: int, temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1) -> SamplingBatch:
    return SamplingBatch.build([temperature] * n, [top_p] * n, [top_k] * n)


def _check_frequencies(tokens: torch.Tensor, probs: torch.Tensor) -> None:
    """Every token's frequency lies within 5 standard errors of its probability, and chi-square is sane."""
    n = tokens.numel()
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    freq = counts / n
    p = probs.double()
    se = torch.sqrt(p * (1 - p) / n)
    assert bool(((freq - p).abs() <= 5 * se + 1e-12).all()), (freq, p)
    support = p > 0
    assert bool((counts[~support] == 0).all()), "a token of probability 0 was sampled"
    dof = int(support.sum()) - 1
    chi2 = float((((counts - n * p) ** 2)[support] / (n * p[support])).sum())
    assert chi2 <= dof + 5 * math.sqrt(2 * dof), (chi2, dof)


def _draws(logits: torch.Tensor, params: SamplingBatch, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return sample(logits, params, torch.rand(logits.shape[0], generator=g))


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"),
    [(1.0, 1.0, -1), (0.5, 1.0, -1), (1.3, 1.0, 4), (1.0, 0.7, -1), (0.8, 0.9, 5)],
)
def test_small_vocab_distribution_matches_reported_probabilities(
    temperature: float, top_p: float, top_k: int
) -> None:
    base = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, 0.2, 1.2])
    n = 200_000
    params = _batch(n, temperature, top_p, top_k)
    tokens, logprobs = _draws(base.expand(n, -1), params, seed=1)
    probs = filtered_logprobs(base.unsqueeze(0), _batch(1, temperature, top_p, top_k)).exp()[0]
    # The expected distribution, computed independently of the sampler's code.
    ref = torch.softmax(base / temperature, -1)
    if top_k > 0:
        ref = torch.where(ref >= ref.topk(top_k).values[-1], ref, torch.zeros_like(ref))
        ref = ref / ref.sum()
    if top_p < 1:
        order = ref.argsort(descending=True)
        before = ref[order].cumsum(0) - ref[order]
        keep = torch.zeros_like(ref, dtype=torch.bool)
        keep[order[before < top_p]] = True
        ref = torch.where(keep, ref, torch.zeros_like(ref))
        ref = ref / ref.sum()
    assert torch.allclose(probs, ref, atol=1e-6)
    _check_frequencies(tokens, ref)
    # Each reported logprob is the log-probability of the token that was drawn.
    assert torch.allclose(logprobs, ref.log()[tokens], atol=1e-5)


@pytest.mark.slow
def test_qwen_size_vocab_samples_the_right_tokens() -> None:
    vocab = 151_936
    logits = torch.full((vocab,), -4.0)
    heavy = torch.tensor([7, 1000, 90_000, 151_935])
    logits[heavy] = torch.tensor([3.0, 2.5, 2.0, 1.0])
    probs = torch.softmax(logits, -1)
    rows, calls = 64, 40
    params = _batch(rows)
    got = torch.cat([_draws(logits.expand(rows, -1), params, seed=s)[0] for s in range(calls)])
    n = got.numel()
    for tok in heavy.tolist():
        p = float(probs[tok])
        freq = float((got == tok).sum()) / n
        assert abs(freq - p) <= 5 * math.sqrt(p * (1 - p) / n), (tok, freq, p)
    # the light tail (each token tiny, together ~45 % here) is sampled at its total mass
    tail = 1 - float(probs[heavy].sum())
    freq_tail = float((~torch.isin(got, heavy)).sum()) / n
    assert abs(freq_tail - tail) <= 5 * math.sqrt(tail * (1 - tail) / n)


def test_top_k_at_large_vocab_never_leaves_the_top_k() -> None:
    vocab = 151_936
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(8, vocab, generator=g) * 3
    params = _batch(8, temperature=1.0, top_k=20)
    allowed = logits.topk(20, dim=-1).indices
    for seed in range(5):
        tokens, logprobs = _draws(logits, params, seed)
        assert bool((allowed == tokens.unsqueeze(-1)).any(-1).all())
        assert bool((logprobs <= 0).all()) and bool(torch.isfinite(logprobs).all())


def test_top_p_fast_path_equals_full_sort(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(0)
    vocab = 20_000
    # peaked rows (nucleus inside the candidates) and one flat row (needs the full sort)
    logits = torch.randn(4, vocab, generator=g)
    logits[:3] *= 12
    params = SamplingBatch.build([1.0, 0.7, 1.0, 1.0], [0.9, 0.95, 0.5, 0.99], [-1, -1, 50, -1])
    fast = filtered_logprobs(logits, params)
    monkeypatch.setattr(sampling, "NUCLEUS_CANDIDATES", vocab)
    full = filtered_logprobs(logits, params)
    assert torch.equal(torch.isfinite(fast), torch.isfinite(full))
    assert torch.allclose(fast[torch.isfinite(fast)], full[torch.isfinite(full)], atol=1e-6)


def test_greedy_takes_argmax_with_unscaled_logprob() -> None:
    logits = torch.tensor([[0.1, 3.0, 2.9, -1.0], [5.0, 0.0, 0.0, 0.0]])
    params = SamplingBatch.build([0.0, 0.0], [0.5, 1.0], [1, -1])
    tokens, logprobs = sample(logits, params, torch.tensor([0.99, 0.99]))
    assert tokens.tolist() == [1, 0]
    assert torch.allclose(logprobs, torch.log_softmax(logits, -1)[[0, 1], [1, 0]])


def test_rows_are_independent_of_each_other() -> None:
    """A row's token depends only on its own logits and uniform, not on the rest of the batch."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 500, generator=g) * 4
    u = torch.rand(6, generator=g)
    params = SamplingBatch.build(
        [1.0, 0.5, 1.0, 0.9, 1.0, 0.0], [1.0, 0.9, 0.8, 1.0, 1.0, 1.0], [-1, 10, -1, 3, -1, -1]
    )
    together, lp_together = sample(logits, params, u)
    for i in range(6):
        one = SamplingBatch(params.temperature[i : i + 1], params.top_p[i : i + 1], params.top_k[i : i + 1])
        alone, lp_alone = sample(logits[i : i + 1], one, u[i : i + 1])
        assert int(alone) == int(together[i])
        assert float(lp_alone) == pytest.approx(float(lp_together[i]), abs=1e-6)
