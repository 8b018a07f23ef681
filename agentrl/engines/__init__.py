"""Inference engines: token ids in, sampled token ids with logprobs and weight versions out.

``HFEngine`` is the embedded continuous-batching engine over a transformers model;
``SGLangEngine`` is the HTTP client of SGLang's native API (also spoken by
``agentrl serve-engine``). Both implement :class:`Engine`.
"""

from __future__ import annotations

from agentrl.engines.errors import (
    ContextLengthError,
    EngineError,
    EngineRequestError,
    EngineTimeoutError,
    EngineUnavailableError,
    InvalidSamplingError,
    InvalidTokenError,
    WeightUpdateError,
)
from agentrl.engines.hf import HFEngine
from agentrl.engines.launcher import launch_sglang_server
from agentrl.engines.protocol import Engine, FinishReason, Generation
from agentrl.engines.sglang import SGLangEngine

__all__ = [
    "ContextLengthError",
    "Engine",
    "EngineError",
    "EngineRequestError",
    "EngineTimeoutError",
    "EngineUnavailableError",
    "FinishReason",
    "Generation",
    "HFEngine",
    "InvalidSamplingError",
    "InvalidTokenError",
    "SGLangEngine",
    "WeightUpdateError",
    "launch_sglang_server",
]
