"""Under bf16 compute what never trains is stored in bf16: a LoRA run's frozen base and the KL
reference take half their memory and score, and train, exactly as their float32 copies did."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from _tiny import fixed_batch, scramble_adapter, tiny_model  # noqa: E402
from test_scoring import _lora, _untied  # noqa: E402

import agentrl.trainer.backend as backend_module  # noqa: E402
from agentrl.models.lora import adapter_state_dict  # noqa: E402
from agentrl.trainer.algorithm import make_backend  # noqa: E402
from agentrl.trainer.backend import FSDP2Backend  # noqa: E402
from agentrl.trainer.config import AlgoConfig, OptimConfig  # noqa: E402
from agentrl.trainer.precision import store_frozen  # noqa: E402

BF16 = OptimConfig(precision="bf16", lr=1e-2)


def _nbytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _backend(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch, store: bool) -> FSDP2Backend:
    if not store:  # today's float32 copy under autocast, to compare against
        monkeypatch.setattr(backend_module, "store_frozen", lambda *a, **k: 0)
    be = make_backend(model, AlgoConfig(kl_coef=0.1), BF16)
    monkeypatch.undo()
    be.set_reference_adapter(None)  # the KL reference: the base, adapter off
    return be


def _with_logp(be: FSDP2Backend, batch):
    batch.old_logp = be.logprobs(batch)
    batch.ref_logp = be.ref_logprobs(batch)  # LoRA: the base, adapter off
    return batch


@pytest.mark.parametrize("make", [_lora, lambda: _lora_untied()], ids=["tied", "untied"])
def test_a_lora_base_in_bf16_scores_and_trains_exactly_as_the_float32_base(make, monkeypatch):
    fp32, bf16 = make(), make()
    before = _nbytes(bf16)
    a = _backend(fp32, monkeypatch, store=False)
    b = _backend(bf16, monkeypatch, store=True)
    for name, p in bf16.named_parameters():
        frozen_linear = ".base_layer." in name or name.startswith("lm_head.")
        want = (
            torch.bfloat16 if frozen_linear and p is not bf16.get_input_embeddings().weight else torch.float32
        )
        assert p.dtype == want, name  # the adapter, embedding and norms stay float32
    assert _nbytes(bf16) < before
    batch = fixed_batch()
    assert torch.equal(a.logprobs(batch), b.logprobs(batch))
    for be in (a, b):
        be.train_step(_with_logp(be, fixed_batch()))
    for (name, x), y in zip(adapter_state_dict(fp32).items(), adapter_state_dict(bf16).values(), strict=True):
        assert torch.equal(x, y), name
        assert y.dtype == torch.float32  # the trained tensors, their optimizer state: float32
    start = adapter_state_dict(make())
    moved = [n for n, t in adapter_state_dict(bf16).items() if not torch.equal(t, start[n])]
    assert len(moved) > len(start) // 2  # the step trained the adapter


def _lora_untied() -> torch.nn.Module:
    from agentrl.models.lora import LoraSpec, apply_lora

    return scramble_adapter(apply_lora(_untied(), LoraSpec(rank=4, target_modules="all-linear")))


def test_the_base_of_a_real_sized_layer_takes_half_the_bytes():
    """What the memory arithmetic in docs/gpu.md counts: every frozen linear at 2 bytes a weight."""
    model = _lora_untied()
    linears = sum(
        p.numel() for n, p in model.named_parameters() if ".base_layer." in n or n.startswith("lm_head.")
    )
    assert store_frozen(model, torch.bfloat16) == 2 * linears
    assert store_frozen(model, torch.bfloat16) == 0  # once stored, nothing more to save
    assert store_frozen(tiny_model(), torch.float32) == 0  # float32 compute keeps float32


@pytest.mark.parametrize("make", [tiny_model, _untied], ids=["tied", "untied"])
def test_the_kl_reference_in_bf16_scores_exactly_as_the_float32_reference(make, monkeypatch):
    a = make_backend(make(), AlgoConfig(kl_coef=0.1), BF16)
    b = make_backend(make(), AlgoConfig(kl_coef=0.1), BF16)
    monkeypatch.setattr(backend_module, "store_frozen", lambda *a, **k: 0)
    a.set_reference(make())
    monkeypatch.undo()
    ref = make()
    before = _nbytes(ref)
    b.set_reference(ref)
    assert _nbytes(ref) < before and ref.get_input_embeddings().weight.dtype == torch.float32
    batch = fixed_batch()
    assert torch.equal(a.ref_logprobs(batch), b.ref_logprobs(batch))
    fp32 = make_backend(make(), AlgoConfig(kl_coef=0.1), OptimConfig(precision="fp32"))
    ref32 = make()
    fp32.set_reference(ref32)
    assert all(p.dtype == torch.float32 for p in ref32.parameters())  # fp32 compute: nothing changes


def test_store_frozen_leaves_trainable_parameters_and_buffers_alone():
    model = copy.deepcopy(tiny_model())
    buffers = {n: b.dtype for n, b in model.named_buffers()}
    model.model.layers[0].mlp.up_proj.weight.requires_grad_(True)
    for p in model.parameters():
        p.requires_grad_(False)
    model.model.layers[0].mlp.up_proj.weight.requires_grad_(True)
    store_frozen(model, torch.bfloat16, whole=True)
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.float32
    assert model.model.layers[1].mlp.up_proj.weight.dtype == torch.bfloat16
    assert model.model.norm.weight.dtype == torch.bfloat16  # whole: every frozen parameter
    assert {n: b.dtype for n, b in model.named_buffers()} == buffers  # RoPE's frequencies as they were


@pytest.mark.slow
def test_beside_a_sharded_bf16_policy_the_reference_is_bf16_and_scores_as_the_policy(tmp_path):
    """Two gloo ranks, FSDP2 computing in bf16: the reference (kept whole on each rank) is stored in
    bf16 and, holding the policy's weights, scores exactly what the policy scores, so the KL starts
    at 0 (its float32 copy did not: the policy's compute is bf16 throughout)."""
    out = _torchrun(tmp_path, "reference")
    got = torch.load(out)
    assert got["ref_dtypes"] == ["torch.bfloat16"]
    assert torch.equal(got["policy"], got["ref"])
    assert got["policy"].abs().sum() > 0


@pytest.mark.slow
def test_a_sharded_lora_base_in_bf16_scores_and_trains_exactly_as_the_float32_base(tmp_path):
    """Two gloo ranks, FSDP2 computing in bf16: a frozen base stored in bf16 beside an fp32 adapter
    (one FSDP2 group, two dtypes) scores and updates the adapter as the fp32 base does."""
    out = _torchrun(tmp_path, "lora")
    got = torch.load(out)
    assert got[True]["base_dtypes"] == [
        "torch.bfloat16",
        "torch.float32",
    ]  # linears bf16; embedding, norms fp32
    assert got[False]["base_dtypes"] == ["torch.float32"]
    assert torch.equal(got[True]["logp"], got[False]["logp"])
    for name, t in got[False]["adapter"].items():
        assert torch.equal(got[True]["adapter"][name], t), name


def _torchrun(tmp_path: Path, case: str) -> Path:
    """``_frozen_worker.py CASE`` on two gloo ranks; the path rank 0 saved to."""
    out = tmp_path / f"{case}.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parents[1])}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
         str(_free_port()), str(HERE / "_frozen_worker.py"), str(out), case],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-3000:]
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
