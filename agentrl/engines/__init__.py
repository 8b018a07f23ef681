"""Inference engines: token ids in, sampled token ids with logprobs and weight versions out.

``HFEngine`` is the embedded continuous-batching engine over a transformers model;
``SGLangEngine`` is the HTTP client of SGLang's native API (also spoken by
``agentrl serve-engine``); ``SimulatedEngine`` simulates a GPU engine's step costs for
benchmarks (it computes nothing). All three implement :class:`Engine`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentrl.engines.errors import (
    ContextLengthError,
    EngineCheckError,
    EngineError,
    EngineRequestError,
    EngineTimeoutError,
    EngineUnavailableError,
    InvalidSamplingError,
    InvalidTokenError,
    UnsupportedWeightUpdateError,
    WeightUpdateError,
)
from agentrl.engines.protocol import (
    Engine,
    EngineCapabilities,
    FinishReason,
    Generation,
    StreamingEngine,
    TokenDelta,
    require_capability,
    run_sync,
    stream_generate,
)

if TYPE_CHECKING:
    from agentrl.engines.checker import check_engine
    from agentrl.engines.hf import HFEngine
    from agentrl.engines.launcher import launch_sglang_server
    from agentrl.engines.sglang import SGLangEngine
    from agentrl.engines.simulated import SimulatedEngine

__all__ = [
    "ContextLengthError",
    "Engine",
    "EngineCapabilities",
    "EngineCheckError",
    "EngineError",
    "EngineRequestError",
    "EngineTimeoutError",
    "EngineUnavailableError",
    "FinishReason",
    "Generation",
    "HFEngine",
    "InvalidSamplingError",
    "InvalidTokenError",
    "UnsupportedWeightUpdateError",
    "SGLangEngine",
    "SimulatedEngine",
    "StreamingEngine",
    "TokenDelta",
    "WeightUpdateError",
    "check_engine",
    "launch_sglang_server",
    "require_capability",
    "run_sync",
    "stream_generate",
]


# Imported on first use: the engines pull in torch and transformers, which the CLI must not pay
# for at start-up (``agentrl --help``, ``agentrl envs``).
_LAZY = {
    "HFEngine": "agentrl.engines.hf",
    "SGLangEngine": "agentrl.engines.sglang",
    "SimulatedEngine": "agentrl.engines.simulated",
    "check_engine": "agentrl.engines.checker",
    "launch_sglang_server": "agentrl.engines.launcher",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'agentrl.engines' has no attribute {name!r}")


if TYPE_CHECKING:  # mypy proves every engine satisfies the protocol's signatures

    def _conforms(hf: HFEngine, sglang: SGLangEngine, sim: SimulatedEngine) -> tuple[Engine, Engine, Engine]:
        return hf, sglang, sim

    def _streams(hf: HFEngine, sglang: SGLangEngine) -> tuple[StreamingEngine, StreamingEngine]:
        return hf, sglang
