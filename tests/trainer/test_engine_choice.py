"""``--engine auto``: the embedded engine on a CPU, a colocated vLLM on a GPU with vLLM set up, and
the embedded engine (saying why) whenever the run's settings rule colocation out."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.errors import ConfigError
from agentrl.trainer import engine_choice
from agentrl.trainer.config import TrainConfig, resolve
from agentrl.trainer.engine_choice import gpu_visible


def _dev(tmp_path: Path, *names: str) -> Path:
    for n in names:
        (tmp_path / n).touch()
    return tmp_path


def test_gpu_visible_reads_the_driver_nodes_and_cuda_visible_devices(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (empty := tmp_path / "empty").mkdir()
    assert not gpu_visible(empty)
    # the control nodes come with the driver; only a numbered node is a GPU
    assert not gpu_visible(_dev(tmp_path, "nvidiactl", "nvidia-uvm", "nvidia-modeset"))
    assert gpu_visible(_dev(tmp_path, "nvidia0"))
    for hidden in ("", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        assert not gpu_visible(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert gpu_visible(tmp_path)


def _on_a_gpu(monkeypatch, vllm: str | None) -> list[str]:
    """Pretend a GPU is visible and vLLM is set up (``vllm`` None) or missing (its reason); returns the
    lines the choice prints."""
    said: list[str] = []
    monkeypatch.setattr(engine_choice, "gpu_visible", lambda: True)
    monkeypatch.setattr(engine_choice, "_vllm_missing", lambda python: vllm)
    monkeypatch.setattr(engine_choice, "_say", said.append)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    return said


def test_cpu_machine_gets_the_embedded_engine_silently(monkeypatch, capsys):
    monkeypatch.setattr(engine_choice, "gpu_visible", lambda: False)
    cfg = TrainConfig()
    assert (cfg.model.engine, cfg.model.colocate, cfg.run.weight_sync) == ("hf", False, "inprocess")
    assert capsys.readouterr().out == ""


def test_gpu_with_vllm_gets_a_colocated_vllm_and_says_so(monkeypatch):
    said = _on_a_gpu(monkeypatch, vllm=None)
    cfg = TrainConfig()
    assert (cfg.model.engine, cfg.model.colocate) == ("vllm", True)
    assert cfg.run.weight_sync == "disk"  # a server in another process: the tested transport
    assert said and "vllm, colocated" in said[0] and "--engine hf" in said[0]
    # the saved configuration says what ran, and reads back to the same run
    again = resolve(**{"model.engine": "vllm", "model.colocate": True})
    assert again.model == cfg.model


@pytest.mark.parametrize(
    ("overrides", "env", "why"),
    [
        ({"model.device": "cpu"}, {}, "--device cpu"),
        ({"rollout.max_staleness": 2}, {}, "--max-staleness 2"),
        ({"run.weight_sync": "inprocess"}, {}, "--weight-sync inprocess"),
        ({"model.engine_max_batch": 1}, {}, "--engine-max-batch 1"),
        ({}, {"WORLD_SIZE": "2"}, "torchrun"),
    ],
)
def test_gpu_settings_that_rule_out_colocation_keep_the_embedded_engine(monkeypatch, overrides, env, why):
    said = _on_a_gpu(monkeypatch, vllm=None)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cfg = resolve(**overrides)
    assert (cfg.model.engine, cfg.model.colocate) == ("hf", False)
    assert len(said) == 1 and "hf, the embedded engine" in said[0] and why in said[0]


def test_gpu_without_vllm_keeps_the_embedded_engine_and_names_the_setup(monkeypatch):
    said = _on_a_gpu(monkeypatch, vllm="vLLM is not set up (looked for x); run scripts/setup.sh --vllm")
    cfg = TrainConfig()
    assert cfg.model.engine == "hf"
    assert "scripts/setup.sh --vllm" in said[0]


def test_explicit_engines_are_not_second_guessed(monkeypatch):
    said = _on_a_gpu(monkeypatch, vllm=None)
    assert resolve(**{"model.engine": "hf"}).model.engine == "hf"
    assert not said


def test_a_url_without_its_kind_is_refused(monkeypatch):
    with pytest.raises(ConfigError, match="--engine vllm or --engine sglang"):
        resolve(**{"model.engine_url": "http://127.0.0.1:1"})


def test_ipc_weight_sync_needs_a_colocated_vllm_and_full_weights(monkeypatch):
    _on_a_gpu(monkeypatch, vllm=None)
    cfg = resolve(**{"run.weight_sync": "ipc"})  # --engine auto on a GPU: a colocated vLLM
    assert (cfg.model.engine, cfg.model.colocate, cfg.run.weight_sync) == ("vllm", True, "ipc")
    with pytest.raises(ConfigError, match="needs --engine vllm --colocate, and full fine-tuning"):
        resolve(**{"run.weight_sync": "ipc", "model.engine": "hf"})
    with pytest.raises(ConfigError, match="needs --engine vllm --colocate, and full fine-tuning"):
        resolve(**{"run.weight_sync": "ipc", "lora.rank": 8})
