"""check_engine over every engine implementation: the embedded HFEngine, the SGLang client
against `agentrl serve-engine` on 127.0.0.1 (a real SGLang server needs a GPU; see test_engine_server),
and the SimulatedEngine of the benchmarks (checked against its own simulated model)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, tiny_qwen2
from test_engine_server import free_port

from agentrl.engines import (
    Engine,
    EngineCheckError,
    HFEngine,
    UnsupportedWeightUpdateError,
    check_engine,
    require_capability,
)
from agentrl.engines.launcher import launch_server
from agentrl.engines.sglang import SGLangEngine
from agentrl.engines.simulated import SimulatedEngine

MAX_POS = int(tiny_qwen2().config.max_position_embeddings)


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("check-engine-tiny")
    tiny_qwen2(seed=0).save_pretrained(d)
    return d


@pytest.fixture(params=["hf", "sglang-client", "simulated"])
def engine(request: pytest.FixtureRequest, weights: Path) -> Iterator[Engine]:
    if request.param == "simulated":
        eng = SimulatedEngine(VOCAB, step_s=0.005, per_request_s=0.0001, max_context=MAX_POS)
        yield eng
        eng.close()
        return
    if request.param == "hf":
        eng: Engine = HFEngine(tiny_qwen2(seed=0), device="cpu", stop_on_eos=False, num_threads=1)
        yield eng
        eng.close()
        return
    port = free_port()
    cmd = [sys.executable, "-m", "agentrl.cli", "serve-engine", "--model", str(weights), "--port", str(port)]
    srv = launch_server(cmd, f"http://127.0.0.1:{port}", startup_timeout_s=120)
    try:
        eng = SGLangEngine(srv.base_url, timeout_s=60)
        yield eng
        eng.close()
    finally:
        srv.stop()


def test_every_engine_passes_check_engine(engine: Engine, weights: Path, tmp_path: Path) -> None:
    reference: torch.nn.Module = tiny_qwen2(seed=0)
    if isinstance(engine, SimulatedEngine):  # its model is one logits vector, saved as its checkpoint
        from safetensors.torch import save_file

        reference = engine.reference_model()
        weights = tmp_path / "simulated"
        weights.mkdir()
        save_file(reference.state_dict(), str(weights / "model.safetensors"))
    report = check_engine(
        engine, vocab_size=VOCAB, max_context=MAX_POS, reference=reference, checkpoint=weights
    )
    assert not report.skipped, report.skipped
    assert {"generation", "seed", "stop", "bad-input", "logprobs", "abort", "deadline"} <= set(report.passed)
    versions = {c for c in report.passed if c.startswith("versions[")}
    caps = engine.capabilities
    expected = {f"versions[{p}]" for p in ("state_dict", "checkpoint", "distributed") if caps.supports(p)}
    assert versions == expected


def test_unsupported_update_path_fails_at_configuration() -> None:
    remote = SGLangEngine("http://127.0.0.1:9")  # never contacted: the check is local
    with pytest.raises(UnsupportedWeightUpdateError, match="inprocess.*state_dict.*checkpoint, distributed"):
        require_capability(remote, "state_dict", "run.weight_sync='inprocess'")
    from agentrl.trainer.weight_sync import make_sync

    with pytest.raises(UnsupportedWeightUpdateError):
        make_sync("inprocess", remote, "/unused")


def test_check_engine_catches_wrong_logprobs() -> None:
    """A checker that cannot fail is a defect: an engine off by a temperature is caught."""
    with HFEngine(tiny_qwen2(seed=0), device="cpu", stop_on_eos=False, num_threads=1) as eng:
        other = tiny_qwen2(seed=0)
        with torch.no_grad():
            other.lm_head.weight.mul_(1.5)  # the reference no longer matches what the engine samples
        with pytest.raises(EngineCheckError, match="logprobs: sampling"):
            check_engine(eng, vocab_size=VOCAB, max_context=MAX_POS, reference=other)
