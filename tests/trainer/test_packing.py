"""Padding-free packing: the packed forward scores, trains and values exactly as the padded one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _tiny import VOCAB, tiny_model  # noqa: E402

from agentrl.trainer.algorithm import make_backend  # noqa: E402
from agentrl.trainer.batch import TrainBatch, token_budget_microbatches  # noqa: E402
from agentrl.trainer.config import AlgoConfig, OptimConfig  # noqa: E402
from agentrl.trainer.errors import BackendError  # noqa: E402
from agentrl.trainer.forward import plain_logits, token_scores  # noqa: E402
from agentrl.trainer.packing import packed_logits, packing_attention  # noqa: E402

LENGTHS = (2, 97, 5, 31, 12, 64, 3, 120)
"""very different row lengths (the tiny model has 128 positions), one row with a single trained token"""


def ragged_batch(lengths: tuple[int, ...] = LENGTHS, vocab: int = VOCAB, seed: int = 3) -> TrainBatch:
    """Right-padded rows with a prompt of up to 6 tokens, a hole in the trained tokens, random advantages."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths)
    ids = torch.zeros(B, T, dtype=torch.long)
    att = torch.zeros(B, T, dtype=torch.long)
    lm = torch.zeros(B, T)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1, vocab, (n,), generator=g)
        att[i, :n] = 1
        lm[i, min(6, n - 1) : n] = 1.0
        if n > 10:
            lm[i, 8:10] = 0.0  # a tool result inside the completion: context, not trained
    adv = torch.randn(B, 1, generator=g).expand(B, T) * lm
    old = -torch.rand(B, T, generator=g) * lm
    return TrainBatch(ids, att, lm, old, adv.contiguous(), token_rewards=adv.contiguous() * 0.5)


def _backend(packing: str, model=None, **kw):
    algo = kw.pop("algo", AlgoConfig())
    optim = OptimConfig(
        packing=packing, micro_batch_tokens=kw.pop("budget", 8192), score_chunk_tokens=kw.pop("chunk", 1024)
    )
    return make_backend(
        model if model is not None else tiny_model(), algo, optim,
        optimizer_factory=lambda ps: torch.optim.SGD(ps, lr=0.5), **kw,
    )  # fmt: skip


def _sgd_step_pair(make_model, algo: AlgoConfig, budget: int = 8192, batch_fn=ragged_batch, **kw):
    """The same update padded and packed: (stats, gradients, weights) of each."""
    out = []
    for packing in ("off", "on"):
        be = _backend(packing, make_model(), algo=algo, budget=budget, **kw)
        b = batch_fn()
        if be.value_head is not None:
            b.old_values = be.values(b)
            b.returns = b.advantages + 0.3
        stats = be.train_step(b)
        grads = {n: p.grad.clone() for n, p in _named_params(be) if p.grad is not None}
        out.append((stats, grads, {n: p.detach().clone() for n, p in _named_params(be)}))
    return out


def _named_params(be):
    yield from be.model.named_parameters()
    if be.value_head is not None:
        yield from (("value_head." + n, p) for n, p in be.value_head.named_parameters())


def _assert_same_update(pair, keys=("loss", "grad_norm")):
    (s0, g0, w0), (s1, g1, w1) = pair
    for key in keys:
        assert s1[key] == pytest.approx(s0[key], rel=1e-4, abs=1e-6), key
    assert g0.keys() == g1.keys() and g0
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], atol=1e-7, rtol=1e-4, msg=n)  # fp32 rounding
    for n in w0:
        torch.testing.assert_close(w1[n], w0[n], atol=1e-7, rtol=1e-5, msg=n)


# ---------------------------------------------------------------- the forward


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("trained_only", [False, True])
def test_packed_scores_and_hidden_states_equal_the_padded_forward(attn, trained_only):
    model = tiny_model()
    model.config._attn_implementation = attn
    b = ragged_batch()
    kind = packing_attention("on", model)
    assert kind == attn
    padded = plain_logits(model, b, hidden=True)
    ref_lp, ref_ent = token_scores(padded, 0.7, entropy=True)
    packed = packed_logits(model, b, kind, trained_only=trained_only, keep=True, hidden=True)
    lp, ent = token_scores(packed, 0.7, entropy=True)
    assert ent is not None and ref_ent is not None
    scored = (b.loss_mask[:, 1:] if trained_only else b.attention_mask[:, 1:]).float()
    assert packed.logits.shape[1] == int(scored.sum())  # the LM head ran on the scored positions only
    torch.testing.assert_close(lp, ref_lp * scored, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent * scored, atol=2e-6, rtol=1e-5)
    real = b.attention_mask[..., None].float()
    assert packed.hidden is not None and padded.hidden is not None
    torch.testing.assert_close(packed.hidden, padded.hidden * real, atol=2e-6, rtol=1e-5)


def test_a_packed_row_sees_nothing_of_the_rows_beside_it():
    model = tiny_model()
    kind = packing_attention("on", model)
    assert kind is not None
    b = ragged_batch()
    before, _ = token_scores(packed_logits(model, b, kind, trained_only=False, keep=True))
    n = int(b.lengths[1])
    b.input_ids[1, :n] = torch.randint(1, VOCAB, (n,), generator=torch.Generator().manual_seed(9))
    after, _ = token_scores(packed_logits(model, b, kind, trained_only=False, keep=True))
    others = [i for i in range(len(b)) if i != 1]
    assert torch.equal(after[others], before[others])
    assert not torch.equal(after[1], before[1])


def test_unpacked_forwards_are_untouched_by_the_packed_attention():
    model = tiny_model()
    ids = torch.randint(1, VOCAB, (2, 16))
    plain = model(input_ids=ids).logits
    packing_attention("on", model)  # installs the per-row SDPA in front of transformers' sdpa
    torch.testing.assert_close(model(input_ids=ids).logits, plain, atol=0, rtol=0)


# ---------------------------------------------------------------- the update


@pytest.mark.parametrize(
    ("entropy_coef", "agg", "budget", "chunk"),
    [(0.0, "token-mean", 8192, 1024), (0.01, "seq-mean-token-sum", 150, 0), (0.01, "token-mean", 40, 7)],
)
def test_packed_update_gives_the_padded_gradients(entropy_coef, agg, budget, chunk):
    """Losses, gradients and weights after an SGD step equal the padded path's (several micro-batches too;
    ``chunk``: the LM head in chunks of that many positions, 0 all at once)."""
    algo = AlgoConfig(entropy_coef=entropy_coef, loss_agg=agg, kl_coef=0.0)
    pair = _sgd_step_pair(tiny_model, algo, budget, temperature=0.7, chunk=chunk)
    _assert_same_update(pair, ("loss", "entropy", "grad_norm"))


def test_packed_update_under_activation_checkpointing_gives_the_padded_gradients():
    _assert_same_update(_sgd_step_pair(tiny_model, AlgoConfig(), 200, activation_checkpointing=True))


def test_packed_ppo_values_and_update_equal_the_padded_ones():
    algo = AlgoConfig(algo="ppo", entropy_coef=0.01, value_clip=10.0)
    pair = _sgd_step_pair(tiny_model, algo, 200, value_head=True, temperature=1.3)
    _assert_same_update(pair, ("loss", "vf_loss", "grad_norm"))
    assert any(n.startswith("value_head.") for n in pair[0][1])
    b = ragged_batch()
    v = [_backend(p, value_head=True).values(b) for p in ("off", "on")]
    real = b.attention_mask.float()
    real[:, 0] = 0  # column 0 has no value (token 0 is never scored); padding's values are never read
    torch.testing.assert_close(v[1] * real, v[0] * real, atol=1e-6, rtol=1e-5)


def test_packed_update_of_a_lora_catalogue_model_gives_the_padded_gradients():
    from agentrl.models import load_model, resolve
    from agentrl.models.lora import LoraSpec, apply_lora

    def lora_model():
        model = load_model(resolve("tiny-qwen3"))
        apply_lora(model, LoraSpec(rank=4))
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if ".lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        return model

    vocab = int(lora_model().config.vocab_size)
    pair = _sgd_step_pair(
        lora_model,
        AlgoConfig(entropy_coef=0.01),
        200,
        batch_fn=lambda: ragged_batch(vocab=vocab),
        temperature=0.7,
    )
    _assert_same_update(pair, ("loss", "entropy", "grad_norm"))
    assert all(".lora_" in n for n in pair[0][1])  # only the adapter has gradients


def test_logprobs_and_reference_scores_equal_the_padded_ones():
    b = ragged_batch()
    off, on = _backend("off", temperature=0.7), _backend("on", temperature=0.7)
    real = b.attention_mask.float()
    real[:, 0] = 0
    torch.testing.assert_close(on.logprobs(b), off.logprobs(b) * real, atol=2e-6, rtol=1e-5)


# ---------------------------------------------------------------- micro-batches and choices


def test_a_packed_micro_batch_budget_counts_real_tokens():
    lengths = [500, 20, 480, 10, 30, 15]
    packed = token_budget_microbatches(lengths, 600, packed=True)
    padded = token_budget_microbatches(lengths, 600)
    assert all(sum(lengths[i] for i in mb) <= 600 for mb in packed)
    assert sorted(i for mb in packed for i in mb) == list(range(6))
    assert packed == [[0], [2, 4, 1, 5, 3]] and len(padded) == 3  # the short rows ride with a long one
    assert token_budget_microbatches([900, 5], 600, packed=True) == [[0], [1]]  # a long row alone


def test_the_shared_prompt_forward_is_kept_where_it_computes_fewer_positions(monkeypatch):
    import agentrl.trainer.backend as backend

    calls = {"shared": 0, "packed": 0}

    def counting(key, forward):
        def counted(*args, **kwargs):
            calls[key] += 1
            return forward(*args, **kwargs)

        return counted

    monkeypatch.setattr(backend, "shared_logits", counting("shared", backend.shared_logits))
    monkeypatch.setattr(backend, "packed_logits", counting("packed", backend.packed_logits))
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(1, VOCAB, (40,), generator=g).tolist()
    rows = [prompt + torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (2, 3, 4, 3, 2, 4, 3, 2)]
    B, T = len(rows), max(map(len, rows))
    ids, att, lm = torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T)
    for i, r in enumerate(rows):
        ids[i, : len(r)], att[i, : len(r)], lm[i, 40 : len(r)] = torch.tensor(r), 1, 1.0
    group = TrainBatch(ids, att, lm, torch.zeros(B, T), lm * 0.5)
    be = _backend("on")
    be._forward(be.model, group, window=True)  # 8 rows share a 40-token prompt: 39 + 8 * 5 < 8 * 43 positions
    assert calls == {"shared": 1, "packed": 0}
    be._forward(be.model, ragged_batch(), window=True)  # nothing shared: packed
    assert calls == {"shared": 1, "packed": 1}


def test_packing_modes_name_what_cannot_pack():
    model = tiny_model()
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(BackendError, match=r"--packing on: .*'flex_attention' cannot keep packed rows apart"):
        packing_attention("on", model)
    assert packing_attention("auto", model) is None  # auto: the padded forward
    assert packing_attention("off", tiny_model()) is None
    assert packing_attention("auto", tiny_model()) == "sdpa"
    with pytest.raises(BackendError, match="--packing 'yes'"):
        packing_attention("yes", tiny_model())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flash_attention_2 runs on CUDA only")
def test_flash_attention_packs_by_positions_on_gpu():
    pytest.importorskip("flash_attn", reason="flash-attn is not installed")
    model = tiny_model().to("cuda", torch.bfloat16)
    b = ragged_batch().to("cuda")
    ref, _ = token_scores(plain_logits(model, b))
    model.config._attn_implementation = "flash_attention_2"
    lp, _ = token_scores(packed_logits(model, b, "flash", trained_only=False, keep=True))
    real = b.attention_mask[:, 1:].float()
    torch.testing.assert_close(lp, ref * real, atol=3e-2, rtol=3e-2)
