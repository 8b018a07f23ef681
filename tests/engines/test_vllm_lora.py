"""LoRA adapters pushed into a real vLLM server (CPU build, its own environment: scripts/setup.sh --vllm).

One server started for adapters (``lora_rank=8``) serves the whole module. Without vLLM set up
these tests skip with the reason, unless AGENTRL_REQUIRE_VLLM=1 (CI sets it).
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import lora_adapter, tiny_qwen3

from agentrl.engines.errors import UnsupportedWeightUpdateError
from agentrl.engines.launcher import EngineServer, launch_vllm_server
from agentrl.engines.protocol import Generation, run_sync
from agentrl.engines.vllm import VLLMEngine
from agentrl.models import load_model, resolve
from agentrl.models.lora import LoraError
from agentrl.types import SamplingParams

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

RANK = 8
SHARED = [10 + (7 * i) % 1400 for i in range(300)]  # more than two KV blocks (128 tokens each on CPU)


@pytest.fixture(scope="module")
def server(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    log = tmp_path_factory.mktemp("vllm-lora") / "server.log"
    srv = launch_vllm_server(resolve("tiny"), log_path=log, startup_timeout_s=600, lora_rank=RANK)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def engine(server: EngineServer) -> Iterator[VLLMEngine]:
    """One client for the module: the tests run in order, each from the adapter the one before left."""
    eng = VLLMEngine(server.base_url, resolve("tiny"), max_context=4096, lora_rank=RANK)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {f"a{seed}": lora_adapter(root / f"a{seed}", seed) for seed in (1, 2)}


def _peft(path: Path) -> torch.nn.Module:
    from peft import PeftModel

    return PeftModel.from_pretrained(load_model(resolve("tiny")).float().eval(), str(path)).eval()


def _teacher_forced(model: torch.nn.Module, prompt: list[int], g: Generation) -> list[float]:
    ids = torch.tensor([prompt + g.output_ids])
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[0].float(), -1)
    return [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(g.output_ids)]


def _max_diff(model: torch.nn.Module, prompt: list[int], g: Generation) -> float:
    return max(abs(a - b) for a, b in zip(_teacher_forced(model, prompt, g), g.logprobs, strict=True))


def _generate(engine: VLLMEngine, prompt: list[int], seed: int = 3) -> Generation:
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=seed)
    return run_sync(engine.generate(prompt, params), timeout_s=120, what="generate")


def _update(engine: VLLMEngine, path: Path, version: int | None = None) -> int:
    return run_sync(
        engine.update_adapter_from_path(path, version=version), timeout_s=120, what="adapter update"
    )


def test_tokens_after_an_adapter_update_score_under_base_plus_adapter(
    engine: VLLMEngine, adapters: dict[str, Path]
) -> None:
    assert engine.capabilities.adapter and not engine.capabilities.checkpoint
    prompt = [5, 6, 7, 8, 9]
    base = _generate(engine, prompt)
    assert _update(engine, adapters["a1"], version=7) == 7 == engine.weight_version
    after = _generate(engine, prompt)
    assert after.weight_versions == [7] * len(after.output_ids)
    diff = _max_diff(_peft(adapters["a1"]), prompt, after)
    assert diff < 1e-4, f"tokens after the update do not score under base + adapter (max |dlogp| {diff})"
    plain = load_model(resolve("tiny")).float().eval()
    assert _max_diff(plain, prompt, after) > 1e-2  # the check above can tell base + adapter from the base
    assert _max_diff(plain, prompt, base) < 1e-4  # before the first adapter: the base alone


def test_an_adapter_replaced_in_place_leaves_no_kv_of_the_old_one(
    engine: VLLMEngine, adapters: dict[str, Path], tmp_path: Path
) -> None:
    """The same long prompt before and after a second update, both adapters loaded from one
    directory: vLLM's prefix-cache hash (adapter name and path) is then the same for both, so
    only the checked reset and the new salt keep the first adapter's cached KV from serving."""
    same = tmp_path / "adapter"
    shutil.copytree(adapters["a1"], same)
    v = _update(engine, same)
    _generate(engine, SHARED + [1])
    hit = _generate(engine, SHARED + [1])
    assert hit.meta["cached_tokens"] >= 256  # the prefix is cached under the first adapter
    assert _max_diff(_peft(adapters["a1"]), SHARED + [1], hit) < 1e-4
    shutil.rmtree(same)
    shutil.copytree(adapters["a2"], same)
    assert _update(engine, same) == v + 1
    after = _generate(engine, SHARED + [1])
    assert after.weight_versions == [v + 1] * len(after.output_ids)
    diff = _max_diff(_peft(adapters["a2"]), SHARED + [1], after)
    assert diff < 1e-4, f"a request after the update used the old adapter or its KV (max |dlogp| {diff})"
    assert _max_diff(_peft(adapters["a1"]), SHARED + [1], after) > 1e-2
    again = _generate(engine, SHARED + [1])
    assert again.meta["cached_tokens"] >= 256 and again.output_ids == after.output_ids


@pytest.mark.timeout(600)
def test_a_request_running_across_an_adapter_update_continues_on_the_new_adapter(
    engine: VLLMEngine, adapters: dict[str, Path]
) -> None:
    """A 600-token request while the adapter is replaced: its versions go old then new, and every
    token labelled new scores under the new adapter (its KV recomputed, its slot holding the new
    tensors; vLLM's own in-place load put the old adapter back at its next step)."""
    old = _update(engine, adapters["a1"])
    prompt = [11, 12, 13, 14, 15, 16, 17, 18]
    long = SamplingParams(max_new_tokens=600, temperature=1.0, seed=4, ignore_eos=True)

    async def run() -> tuple[Generation, int]:
        task = asyncio.create_task(engine.generate(prompt, long))
        await asyncio.sleep(1.5)
        v = await engine.update_adapter_from_path(adapters["a2"])
        return await task, v

    g, v = run_sync(run(), timeout_s=300, what="a request across an adapter update")
    versions = g.weight_versions
    assert v == old + 1 and len(versions) == 600
    assert versions == sorted(versions) and versions[0] == old and versions[-1] == v
    k = versions.index(v)
    new_scores = _teacher_forced(_peft(adapters["a2"]), prompt, g)
    diff = max(abs(a - b) for a, b in zip(new_scores[k:], g.logprobs[k:], strict=True))
    assert diff < 1e-3, f"tokens labelled with the new adapter were not sampled by it (max |dlogp| {diff})"
    old_scores = _teacher_forced(_peft(adapters["a1"]), prompt, g)
    assert max(abs(a - b) for a, b in zip(old_scores[:k], g.logprobs[:k], strict=True)) < 1e-3


def test_a_refused_adapter_keeps_the_old_one_serving(
    engine: VLLMEngine, adapters: dict[str, Path], tmp_path: Path
) -> None:
    version = _update(engine, adapters["a2"])
    prompt = [4, 5, 6, 7]
    before = _generate(engine, prompt)
    missing = tmp_path / "missing"
    shutil.copytree(adapters["a1"], missing)
    (missing / "adapter_model.safetensors").unlink()
    too_big = lora_adapter(tmp_path / "rank16", seed=3, rank=16)
    other_base = lora_adapter(tmp_path / "other", seed=3, model=tiny_qwen3())
    refusals = [
        (missing, r"lacks \['adapter_model.safetensors'\]"),
        (too_big, r"rank 16, above the server's --max-lora-rank 8.*lora_rank >= 16"),
        (
            other_base,
            r"does not fit the served model.*lora_A \(8, \d+\), lora_B \(\d+, 8\) for a layer of shape",
        ),
    ]
    for path, why in refusals:
        with pytest.raises(LoraError, match=why):
            _update(engine, path)
    with pytest.raises(UnsupportedWeightUpdateError, match="serves LoRA adapters.*update_adapter_from_path"):
        run_sync(engine.update_weights_from_path(resolve("tiny")), timeout_s=60, what="full update")
    after = _generate(engine, prompt)
    assert engine.weight_version == version and after.weight_versions == [version] * len(after.output_ids)
    assert after.output_ids == before.output_ids and after.logprobs == pytest.approx(
        before.logprobs, abs=1e-6
    )
    assert _max_diff(_peft(adapters["a2"]), prompt, after) < 1e-4
    assert engine.stats["rejected_updates"] == 4 and engine.stats["rollbacks"] == 0


def test_an_adapter_is_refused_by_a_client_made_without_lora(server: EngineServer, tmp_path: Path) -> None:
    plain = VLLMEngine(server.base_url, resolve("tiny"), max_context=4096)
    try:
        assert not plain.capabilities.adapter
        with pytest.raises(UnsupportedWeightUpdateError, match="not started for LoRA.*lora_rank=R"):
            run_sync(plain.update_adapter_from_path(tmp_path), timeout_s=30, what="adapter update")
    finally:
        plain.close()


def test_a_lora_run_on_vllm_pushes_only_the_adapter_and_samples_what_the_trainer_scores(
    server: EngineServer, tmp_path: Path
) -> None:
    """`agentrl train --lora-rank 8 --engine vllm`: every step's sync is the adapter (a PEFT directory
    vLLM loads in place), and the trainer scores vLLM's sampled tokens as vLLM did."""
    from agentrl.cli import main
    from agentrl.trainer.metrics import read_jsonl

    run = tmp_path / "run"
    argv = ["train", "--env", "countdown", "--engine", "vllm", "--engine-url", server.base_url,
            "--lora-rank", str(RANK), "--steps", "2", "--tasks-per-step", "4", "--group-size", "4",
            "--eval-episodes", "4", "--eval-every", "0", "--sft-steps", "3", "--run-dir", str(run),
            "--no-progress", "--no-tensorboard"]  # fmt: skip
    assert main(argv) == 0
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["sync/version"] for r in rows] == [1.0, 2.0]
    for r in rows:
        assert 0 < r["sync/bytes"] < r["sync/full_bytes"] / 5
        assert r["train/mismatch_abs_logp"] < 1e-4
    assert (run / "checkpoints" / "step-2" / "adapter_config.json").is_file()
