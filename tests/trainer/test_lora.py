"""--lora-rank: a LoRA adapter trains on the frozen base, syncs alone, and is saved in PEFT's format."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console

from agentrl.errors import ConfigError
from agentrl.models import load_model, resolve
from agentrl.models.lora import (
    LoraError,
    LoraSpec,
    adapter_state_dict,
    adapters_disabled,
    apply_lora,
    read_adapter,
    save_adapter,
)
from agentrl.trainer.config import resolve as resolve_cfg
from agentrl.trainer.loop import train
from agentrl.trainer.metrics import read_jsonl

FAST = {
    "model": "tiny-qwen3",
    "group_size": 4,
    "tasks_per_step": 4,
    "max_new_tokens": 16,
    "eval_episodes": 4,
    "sft_steps": 2,
    "sft_batch_size": 4,
    "eval_every": 0,
    "progress": False,
    "tensorboard": False,
    "rank": 8,
    "lr": 1e-3,
}
VOWELS = f"{Path(__file__).with_name('_dense_env.py')}:VowelEnv"  # a dense reward: every step has a gradient


def _quiet() -> Console:
    return Console(file=open("/dev/null", "w"))  # noqa: SIM115


def _tiny() -> torch.nn.Module:
    return load_model(resolve("tiny-qwen3"))


def _scramble(model: torch.nn.Module, seed: int = 0) -> None:
    """Give the adapter weights that change the model's outputs (PEFT starts B at zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def _logprobs(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


# ---------------------------------------------------------------- the adapter itself


def test_bad_settings_name_the_flag_and_the_value_before_anything_changes():
    model = _tiny()
    before = {n for n, _ in model.named_parameters()}
    with pytest.raises(
        LoraError, match=r"--lora-target-modules qproj: \['qproj'\] match no linear layer.*q_proj"
    ):
        apply_lora(model, LoraSpec(rank=4, target_modules=("qproj",)))
    with pytest.raises(LoraError, match=r"--lora-rank 4096: larger than layer .*use at most"):
        apply_lora(model, LoraSpec(rank=4096))
    with pytest.raises(LoraError, match="--lora-rank 0"):
        LoraSpec(rank=0)
    assert {n for n, _ in model.named_parameters()} == before  # nothing was injected
    with pytest.raises(ConfigError, match=r"lora.alpha=3.0: needs --lora-rank"):
        resolve_cfg(alpha=3.0)
    with pytest.raises(ConfigError, match="run.weight_sync='broadcast'.*--lora-rank"):
        resolve_cfg(rank=4, weight_sync="broadcast", engine="vllm")


def test_only_the_adapter_trains_and_disabling_it_gives_the_base():
    base, model = _tiny(), _tiny()
    apply_lora(model, LoraSpec(rank=4))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    ids = torch.randint(0, 200, (2, 10))
    assert torch.allclose(_logprobs(model, ids), _logprobs(base, ids), atol=1e-6)  # B = 0: the base
    _scramble(model)
    assert not torch.allclose(_logprobs(model, ids), _logprobs(base, ids), atol=1e-3)
    with adapters_disabled(model):
        assert torch.allclose(_logprobs(model, ids), _logprobs(base, ids), atol=1e-6)
    assert all(p.requires_grad for n, p in model.named_parameters() if n in trainable)


def test_a_saved_adapter_loads_with_peft_and_reproduces_the_logprobs(tmp_path):
    from peft import PeftModel

    model = _tiny()
    apply_lora(model, LoraSpec(rank=4, alpha=16, target_modules=("q_proj", "v_proj", "down_proj")))
    _scramble(model)
    save_adapter(tmp_path, adapter_state_dict(model), LoraSpec(rank=4, alpha=16), base=resolve("tiny-qwen3"))
    cfg = json.loads((tmp_path / "adapter_config.json").read_text())
    assert (cfg["r"], cfg["lora_alpha"], sorted(cfg["target_modules"])) == (
        4,
        16,
        ["down_proj", "q_proj", "v_proj"],
    )
    peft_model = PeftModel.from_pretrained(_tiny(), str(tmp_path))
    ids = torch.randint(0, 200, (2, 12))
    assert torch.allclose(_logprobs(peft_model, ids), _logprobs(model, ids), atol=1e-6)
    spec, tensors, base = read_adapter(tmp_path)
    assert spec.rank == 4 and spec.lora_alpha == 16 and base == resolve("tiny-qwen3")
    assert tensors.keys() == adapter_state_dict(model).keys()


def test_the_embedded_engine_takes_an_adapter_directory_in_place_and_refuses_one_that_does_not_fit(tmp_path):
    from agentrl.engines.hf import HFEngine
    from agentrl.models.lora import check_adapter_fits

    trained = _tiny()
    apply_lora(trained, LoraSpec(rank=4))
    _scramble(trained)
    save_adapter(tmp_path / "a", adapter_state_dict(trained), LoraSpec(rank=4), base="tiny-qwen3")
    other = _tiny()
    apply_lora(other, LoraSpec(rank=8))
    save_adapter(tmp_path / "b", adapter_state_dict(other), LoraSpec(rank=8), base="tiny-qwen3")
    prompt = list(range(5, 15))

    async def run() -> None:
        with HFEngine(_tiny(), device="cpu", seed=0) as eng:
            assert eng.capabilities.adapter
            base_out = await eng.generate(prompt, {"max_new_tokens": 8, "temperature": 1.0, "seed": 1})
            assert await eng.update_adapter_from_path(tmp_path / "a", version=3) == 3
            out = await eng.generate(prompt, {"max_new_tokens": 8, "temperature": 1.0, "seed": 1})
            assert out.output_ids != base_out.output_ids
            ids = torch.tensor([prompt + out.output_ids])
            want = _logprobs(trained, ids)[0, len(prompt) - 1 :]
            assert torch.allclose(torch.tensor(out.logprobs), want, atol=1e-4)
            with pytest.raises(LoraError, match="rank 8.*rank 4"):
                await eng.update_adapter_from_path(tmp_path / "b", version=4)
            with pytest.raises(LoraError, match="lacks"):
                await eng.update_adapter_from_path(tmp_path / "missing", version=4)
            assert eng.weight_version == 3  # the refused updates changed nothing
            assert (
                await eng.generate(prompt, {"max_new_tokens": 8, "temperature": 1.0, "seed": 1})
            ).output_ids == out.output_ids

    asyncio.run(run())
    with pytest.raises(LoraError, match="another|does not fit|rank"):
        check_adapter_fits(
            load_model(resolve("tiny")), read_adapter(tmp_path / "a")[1], "a", "tiny-qwen3", LoraSpec(4)
        )


# ---------------------------------------------------------------- a run


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["inprocess", "disk"])
def test_a_lora_run_pushes_only_the_adapter_and_its_checkpoint_is_a_peft_adapter(sync, tmp_path):
    """Only adapter tensors change and travel; the engine samples what the trainer scores; the saved
    adapter on the base reproduces the engine's sampled logprobs; export --merge gives the same model."""
    from peft import PeftModel

    from agentrl.cli import main

    run = tmp_path / "run"
    s = train(resolve_cfg(**FAST, env=VOWELS, steps=2, checkpoint_every=2, weight_sync=sync,
                          run_dir=str(run)), console=_quiet())  # fmt: skip
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    assert len(rows) == 2
    for r in rows:
        assert 0 < r["sync/bytes"] < r["sync/full_bytes"] / 5  # the adapter, not the model
        assert r["train/mismatch_abs_logp"] < 1e-4  # the engine runs the same adapter as the trainer
    ckpt = Path(s.final_model)
    assert (ckpt / "adapter_config.json").is_file() and not (ckpt / "model.safetensors").exists()
    assert not (run / "reference").exists()  # kl_coef = 0: no reference kept
    spec, tensors, base = read_adapter(ckpt)
    assert spec.rank == 8 and base == resolve("tiny-qwen3")
    assert any(float(t.abs().max()) > 0 for n, t in tensors.items() if ".lora_B." in n)  # it trained
    policy = _tiny()  # the trained policy: the base under the checkpoint's adapter, as the trainer held it
    apply_lora(policy, spec)
    policy.load_state_dict(tensors, strict=False)
    peft_model = PeftModel.from_pretrained(_tiny(), str(ckpt)).eval()
    probe = torch.randint(0, 200, (2, 12))
    assert torch.allclose(_logprobs(peft_model, probe), _logprobs(policy, probe), atol=1e-6)
    out = tmp_path / "merged"
    assert main(["export", str(run), "--out", str(out), "--merge"]) == 0
    merged = load_model(out)
    assert torch.allclose(_logprobs(merged, probe), _logprobs(peft_model, probe), atol=1e-5)
    assert not torch.allclose(_logprobs(merged, probe), _logprobs(_tiny(), probe), atol=1e-4)


@pytest.mark.slow
def test_a_resumed_lora_kl_run_replays_the_uninterrupted_one(tmp_path):
    """The KL reference is the base under the adapter RL started from (after the warm start), stored
    once as a PEFT adapter; a resumed run restores adapter, optimizer and reference and replays the
    uninterrupted run's metrics and final adapter exactly."""
    a, b = tmp_path / "a", tmp_path / "b"
    cfg = {**FAST, "env": VOWELS, "kl_coef": 0.5, "steps": 4, "checkpoint_every": 2, "engine_max_batch": 1}
    train(resolve_cfg(**cfg, run_dir=str(a)), console=_quiet())
    train(resolve_cfg(**cfg, resume=str(a / "checkpoints" / "step-2"), run_dir=str(b)), console=_quiet())
    untimed = [
        {k: v for k, v in r.items() if k not in ("time", "rollout/seconds") and not k.startswith("time/")}
        for r in read_jsonl(a / "metrics.jsonl")
    ]
    resumed = [
        {k: v for k, v in r.items() if k not in ("time", "rollout/seconds") and not k.startswith("time/")}
        for r in read_jsonl(b / "metrics.jsonl")
    ]
    after = [r for r in untimed if r["step"] > 2]
    assert all(r["train/kl"] > 0 for r in after if r["kind"] == "train")
    assert resumed == after
    ref_spec, ref, _ = read_adapter(a / "reference")
    assert any(
        float(t.abs().max()) > 0 for n, t in ref.items() if ".lora_B." in n
    )  # the warm start's adapter
    final = {run: read_adapter(run / "checkpoints" / "step-4")[1] for run in (a, b)}
    assert all(torch.equal(final[a][k], final[b][k]) for k in final[a])


def test_the_reference_adapter_is_swapped_in_for_the_reference_forward_only():
    from agentrl.trainer.adapter import AdapterReference

    model = _tiny()
    apply_lora(model, LoraSpec(rank=4))
    _scramble(model, seed=1)
    snapshot = {k: v.clone() for k, v in adapter_state_dict(model).items()}
    ids = torch.randint(0, 200, (2, 10))
    at_start = _logprobs(model, ids)
    ref = AdapterReference(model, snapshot)
    _scramble(model, seed=2)  # training moved the adapter
    moved = _logprobs(model, ids)
    with ref.active(model):
        assert torch.allclose(_logprobs(model, ids), at_start, atol=1e-6)
    assert torch.equal(_logprobs(model, ids), moved)
    zero = {k: (torch.zeros_like(v) if ".lora_B." in k else v) for k, v in snapshot.items()}
    assert AdapterReference(model, zero).is_base  # a run without warm start: the base, adapter off
    base = copy.deepcopy(model)
    with AdapterReference(model, zero).active(model), adapters_disabled(base):
        assert torch.allclose(_logprobs(model, ids), _logprobs(base, ids), atol=1e-6)


def test_qlora_is_refused_on_cpu_naming_why():
    from agentrl.models.lora import load_4bit

    with pytest.raises(ConfigError, match=r"lora.quantize='4bit'.*CUDA GPU only"):
        resolve_cfg(rank=8, quantize="4bit", device="cpu")
    with pytest.raises(ConfigError, match=r"--engine vllm serves its own full-precision base"):
        resolve_cfg(rank=8, quantize="4bit", engine="vllm")
    if not torch.cuda.is_available():
        with pytest.raises(LoraError, match="--lora-quantize 4bit: needs a CUDA GPU"):
            load_4bit("tiny-qwen3", "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or __import__("importlib").util.find_spec("bitsandbytes") is None,
    reason="QLoRA needs a CUDA GPU and bitsandbytes (its 4-bit kernels have no CPU path here)",
)
def test_qlora_trains_on_a_4bit_base_and_the_engine_samples_what_the_trainer_scores(tmp_path):
    run = tmp_path / "run"
    train(resolve_cfg(**FAST, env=VOWELS, steps=2, quantize="4bit", device="cuda", run_dir=str(run)),
          console=_quiet())  # fmt: skip
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    assert all(r["sync/bytes"] < r["sync/full_bytes"] for r in rows)
    assert all(r["train/mismatch_abs_logp"] < 1e-2 for r in rows)  # bf16 compute on both sides
    assert (run / "checkpoints" / "step-2" / "adapter_config.json").is_file()
