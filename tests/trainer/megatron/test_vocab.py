"""Vocab-parallel token scores equal the full-vocabulary ones: values and gradients, one process and two."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agentrl.trainer.errors import BackendError
from agentrl.trainer.megatron.vocab import vocab_parallel_scores

V, VP = 13, 16  # the real vocabulary, padded: the last 3 columns are padding


def _reference(
    full: torch.Tensor, targets: torch.Tensor, vocab: int, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp, entropy)`` of the full real-vocabulary softmax, by ``torch.log_softmax``."""
    z = full[..., :vocab].float() / (temperature or 1.0)
    logp_all = torch.log_softmax(z, -1)
    return logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)


def _inputs(seed: int, vocab: int = V, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)
    full = (torch.randn(3, 5, VP, generator=g) * 3).to(dtype)
    targets = torch.randint(0, vocab, (3, 5), generator=g)
    targets[0, 0] = vocab - 1  # the last real column, next to the padding
    weights = torch.randn(2, 3, 5, generator=g)  # the loss mixes logp and entropy
    return full, targets, weights


def _mine(z, targets, vocab, temperature, start=0, group=None):
    """:func:`vocab_parallel_scores` with a differentiable entropy."""
    kw = {"vocab_start": start, "vocab_size": vocab, "group": group, "temperature": temperature}
    return vocab_parallel_scores(z, targets, entropy=True, entropy_grad=True, **kw)


def _loss_grad(fn, full: torch.Tensor, weights: torch.Tensor, *args) -> tuple[torch.Tensor, ...]:
    """``(logp, entropy, d loss / d full)`` of ``fn(full, *args)``, the loss mixing logp and entropy."""
    z = full.detach().clone().requires_grad_()
    logp, ent = fn(z, *args)
    (weights[0] * logp + weights[1] * ent).sum().backward()
    assert z.grad is not None
    return logp.detach(), ent.detach(), z.grad


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_one_process_equals_log_softmax_and_padding_gets_no_gradient(temperature):
    full, targets, weights = _inputs(0)
    full[..., V:] = 50.0  # padding: would dominate the softmax if it counted

    lp, ent, grad = _loss_grad(_mine, full, weights, targets, V, temperature)
    lp_ref, ent_ref, grad_ref = _loss_grad(_reference, full, weights, targets, V, temperature)
    assert lp.dtype == ent.dtype == torch.float32
    torch.testing.assert_close(lp, lp_ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent, ent_ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grad, grad_ref, atol=1e-6, rtol=1e-6)
    assert torch.equal(grad[..., V:], torch.zeros_like(grad[..., V:]))
    assert grad[..., :V].abs().min() > 0


def test_gradcheck_float64_logp_and_entropy():
    full, targets, _ = _inputs(1, dtype=torch.float64)
    z = full[:2, :3].clone().requires_grad_()
    tg = targets[:2, :3]

    def fn(z):
        kw = {"vocab_start": 0, "vocab_size": V, "group": None, "temperature": 0.7}
        return vocab_parallel_scores(z, tg, entropy=True, entropy_grad=True, **kw)

    assert torch.autograd.gradcheck(fn, (z,))


def test_entropy_detached_unless_asked_and_low_precision_logits_score_in_float32():
    full, targets, _ = _inputs(2, dtype=torch.bfloat16)
    z = full.requires_grad_()
    kw = {"vocab_start": 0, "vocab_size": V, "group": None}
    logp, ent = vocab_parallel_scores(z, targets, entropy=True, **kw)
    assert ent is not None and not ent.requires_grad and logp.requires_grad
    assert logp.dtype == ent.dtype == torch.float32
    lp_ref, ent_ref = _reference(full.detach(), targets, V, 1.0)  # float32 of the same bf16 values
    torch.testing.assert_close(logp, lp_ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent, ent_ref, atol=1e-6, rtol=1e-6)
    logp.sum().backward()
    assert z.grad is not None and z.grad.dtype == torch.bfloat16
    assert vocab_parallel_scores(z, targets, **kw)[1] is None


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"vocab_start": 0, "vocab_size": V, "bad_target": V}, "outside the vocabulary"),
        ({"vocab_start": 0, "vocab_size": V, "bad_target": -1}, "outside the vocabulary"),
        ({"vocab_start": 8, "vocab_size": V}, "slice inconsistent"),  # one process holds all from 0
        ({"vocab_start": 0, "vocab_size": VP + 1}, "slice inconsistent"),  # narrower than the vocabulary
        ({"vocab_start": 0, "vocab_size": V, "temperature": -1.0}, "temperature"),
        ({"vocab_start": 0, "vocab_size": V, "int32_targets": True}, "targets must be long"),
    ],
)
def test_bad_inputs_raise_backend_error(kw, match):
    full, targets, _ = _inputs(3)
    if "bad_target" in kw:
        targets[1, 2] = kw.pop("bad_target")
    if kw.pop("int32_targets", False):
        targets = targets.int()
    with pytest.raises(BackendError, match=match):
        vocab_parallel_scores(full, targets, group=None, **kw)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


HALF = VP // 2  # each of two TP ranks holds half the padded vocabulary; rank 1 holds the padding
CASES = [(V, 1.0), (V, 0.7), (7, 1.0)]  # (vocabulary, temperature); at 7, rank 1's slice is all padding


def _rank(rank: int, port: int, out: str) -> None:
    """One of two TP ranks: score its half of each case's logits; save logp, entropy and gradient."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        got = []
        for i, (vocab, temperature) in enumerate(CASES):
            full, targets, weights = _inputs(10 + i, vocab)
            mine = full[..., rank * HALF : (rank + 1) * HALF]
            got.append(
                _loss_grad(_mine, mine, weights, targets, vocab, temperature, rank * HALF, dist.group.WORLD)
            )
        torch.save(got, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_ranks_equal_one_process_and_each_gradient_is_its_slice(tmp_path):
    """Two gloo TP ranks, each with half the padded vocabulary: the same logp and entropy as the full
    softmax, and each rank's gradient of the (replicated) loss is its slice of the full gradient."""
    mp.spawn(_rank, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for i, (vocab, temperature) in enumerate(CASES):
        full, targets, weights = _inputs(10 + i, vocab)
        lp_ref, ent_ref, grad_ref = _loss_grad(_reference, full, weights, targets, vocab, temperature)
        for r, got in enumerate(ranks):
            lp, ent, grad = got[i]
            torch.testing.assert_close(lp, lp_ref, atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(ent, ent_ref, atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(grad, grad_ref[..., r * HALF : (r + 1) * HALF], atol=1e-6, rtol=1e-6)
