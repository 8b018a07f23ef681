"""Inference engines: token ids in, sampled token ids with logprobs and weight versions out.

``HFEngine`` is the embedded continuous-batching engine over a transformers model;
``SGLangEngine`` is the HTTP client of SGLang's native API (also spoken by
``agentrl serve-engine``). Both implement :class:`Engine`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentrl.engines.checker import check_engine
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
from agentrl.engines.hf import HFEngine
from agentrl.engines.launcher import launch_sglang_server
from agentrl.engines.protocol import (
    Engine,
    EngineCapabilities,
    FinishReason,
    Generation,
    require_capability,
    run_sync,
)
from agentrl.engines.sglang import SGLangEngine

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
    "WeightUpdateError",
    "check_engine",
    "launch_sglang_server",
    "require_capability",
    "run_sync",
]


if TYPE_CHECKING:  # mypy proves both engines satisfy the protocol's signatures

    def _conforms(hf: HFEngine, sglang: SGLangEngine) -> tuple[Engine, Engine]:
        return hf, sglang
