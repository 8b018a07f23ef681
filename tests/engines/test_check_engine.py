"""check_engine over every engine implementation: the embedded HFEngine, the SGLang client
against `agentrl serve-engine` on 127.0.0.1 (a real SGLang server needs a GPU; see test_engine_server),
and the SimulatedEngine of the benchmarks (checked against its own simulated model)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    scheduler,
)
from agentrl.engines.checker import check_sampling
from agentrl.engines.launcher import launch_server
from agentrl.engines.sampling import SamplingBatch, filtered_logprobs, sample
from agentrl.engines.sampling_check import chi_square_sf, goodness_of_fit
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
    # over HTTP (~40 requests/s on two busy cores) fewer draws: enough to see a setting lost on the wire
    draws = 400 if isinstance(engine, SGLangEngine) else 2000
    report = check_engine(
        engine,
        vocab_size=VOCAB,
        max_context=MAX_POS,
        reference=reference,
        checkpoint=weights,
        sampling_draws=draws,
    )
    assert not report.skipped, report.skipped
    assert {"generation", "seed", "stop", "bad-input", "logprobs", "abort", "deadline"} <= set(report.passed)
    assert {"sampling[T=1.0]", "sampling[T=0.7]", "sampling[T=0.7,top_k=20,top_p=0.9]"} <= set(report.passed)
    assert len(report.sampling) == 6 and all(r.p_value >= 1e-3 for r in report.sampling.values())
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


# ------------------------------------------------------------------ the sampling-frequency check
# Broken samplers inside the real HFEngine: each reports the logprob of the token it drew under the
# distribution it was asked for, so the logprobs check cannot see the flaw; only the counts can.


def _at_temperature_one(logits: torch.Tensor, params: SamplingBatch, uniforms: torch.Tensor) -> Any:
    """Draws at temperature 1 whatever was asked; reports the logprob under the asked temperature."""
    hot = SamplingBatch(torch.where(params.temperature > 0, 1.0, 0.0), params.top_p, params.top_k)
    toks, _ = sample(logits, hot, uniforms)
    return toks, filtered_logprobs(logits, params).gather(-1, toks[:, None]).squeeze(-1)


def _ignoring_filters(logits: torch.Tensor, params: SamplingBatch, uniforms: torch.Tensor) -> Any:
    """Applies the temperature but not top-k / top-p; reports the logprob under the filtered distribution."""
    plain = SamplingBatch(params.temperature, torch.ones_like(params.top_p), torch.zeros_like(params.top_k))
    toks, _ = sample(logits, plain, uniforms)
    return toks, filtered_logprobs(logits, params).gather(-1, toks[:, None]).squeeze(-1)


def _hf_engine() -> HFEngine:
    return HFEngine(tiny_qwen2(seed=0), device="cpu", stop_on_eos=False, num_threads=1)


def test_check_engine_catches_a_sampler_at_the_wrong_temperature(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler, "sample", _at_temperature_one)
    with (
        _hf_engine() as eng,
        pytest.raises(EngineCheckError, match=r"sampling\[T=0.7\] first: chi2=.* p=") as e,
    ):
        check_engine(eng, vocab_size=VOCAB, max_context=MAX_POS, reference=tiny_qwen2(seed=0))
    assert "logprobs" not in str(e.value)  # every earlier check, logprobs included, passed


def test_check_engine_catches_random_numbers_reused_across_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each request draws the same uniform at every step: right marginals, dependent successive tokens."""
    first_state: dict[str, torch.Tensor] = {}
    original = scheduler.Scheduler._sample_and_advance

    def reusing(self: scheduler.Scheduler, logits: torch.Tensor, reqs: list[scheduler.Request]) -> None:
        for r in reqs:
            r.generator.set_state(first_state.setdefault(r.rid, r.generator.get_state()))
        original(self, logits, reqs)

    monkeypatch.setattr(scheduler.Scheduler, "_sample_and_advance", reusing)
    with (
        _hf_engine() as eng,
        pytest.raises(EngineCheckError, match=r"sampling\[T=1.0\] second\|first: chi2="),
    ):
        check_engine(eng, vocab_size=VOCAB, max_context=MAX_POS, reference=tiny_qwen2(seed=0))


def test_check_sampling_catches_a_sampler_that_ignores_top_k(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler, "sample", _ignoring_filters)
    with _hf_engine() as eng:
        report = check_sampling(eng, tiny_qwen2(seed=0), vocab_size=VOCAB, settings=[{"temperature": 0.7}])
        assert report.passed == ["sampling[T=0.7]"]  # no filter asked, nothing wrong
        with pytest.raises(
            EngineCheckError, match=r"sampling\[T=0.7,top_k=20\]: first tokens \{.*probability 0"
        ):
            check_sampling(
                eng, tiny_qwen2(seed=0), vocab_size=VOCAB, settings=[{"temperature": 0.7, "top_k": 20}]
            )


def test_check_engine_logprobs_rejects_an_excluded_token_reported_at_minus_infinity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """-inf reported for a token the filters exclude, against the reference's -inf, is a NaN difference: a failure."""
    monkeypatch.setattr(scheduler, "sample", _ignoring_filters)
    with (
        _hf_engine() as eng,
        pytest.raises(EngineCheckError, match=r"logprobs: sampling \{'temperature': 0.7, 'top_k': 20\}"),
    ):
        check_engine(
            eng, vocab_size=VOCAB, max_context=MAX_POS, reference=tiny_qwen2(seed=0), sampling_draws=0
        )


def test_chi_square_survival_function_matches_tabulated_quantiles() -> None:
    # the 0.05 / 0.001 upper quantiles of chi-square(dof), from standard tables
    for stat, dof, p in ((3.841, 1, 0.05), (18.307, 10, 0.05), (124.342, 100, 0.05), (29.588, 10, 0.001)):
        assert chi_square_sf(stat, dof) == pytest.approx(p, rel=1e-3)
    with pytest.raises(ValueError, match="dof >= 1"):
        chi_square_sf(1.0, 0)


def test_goodness_of_fit_pools_rare_tokens_into_bins_expected_five_times() -> None:
    probs = torch.tensor([0.5, 0.3, 0.1, 0.04, 0.03, 0.02, 0.01, 0.0])
    counts = torch.tensor([50, 30, 10, 4, 3, 2, 1, 0])  # exactly as expected, n = 100
    stat, dof = goodness_of_fit(counts, probs)
    # categories: 50, 30, 10, then 4+3 = 7; the rest, 2+1 = 3 (< 5), joins the bin before: 4 categories
    assert (stat, dof) == (pytest.approx(0.0), 3)
    stat, dof = goodness_of_fit(torch.tensor([60, 20, 10, 4, 3, 2, 1, 0]), probs)
    assert stat == pytest.approx(10**2 / 50 + 10**2 / 30) and dof == 3
    assert goodness_of_fit(torch.tensor([3, 0, 0, 0, 0, 0, 0, 0]), probs) == (0.0, 0)  # too few draws
