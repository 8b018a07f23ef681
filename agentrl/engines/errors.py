"""Errors raised by inference engines (the ``agentrl.engines`` branch of the tree).

::

    AgentRLError
    └── EngineError                  an engine could not do what was asked
        ├── EngineRequestError       the request itself is invalid (HTTP 400); fix the request
        │   ├── InvalidTokenError        a token id outside [0, vocab_size) or an empty prompt
        │   ├── ContextLengthError       prompt (+ max_new_tokens) longer than the model's context
        │   └── InvalidSamplingError     unknown or out-of-range sampling field
        ├── WeightUpdateError        new weights were rejected (names, shapes, transport); old weights stay
        │   └── UnsupportedWeightUpdateError  the engine does not serve that update path (raised at setup)
        ├── EngineUnavailableError   the engine is stopped, unreachable or answered 5xx
        ├── EngineTimeoutError       a deadline passed (names the operation and the peer)
        └── EngineCheckError         check_engine found a broken contract (names the check and the fix)

A request error never affects other requests: the engine keeps serving.
"""

from __future__ import annotations

from agentrl.errors import AgentRLError, ConfigError

__all__ = [
    "ContextLengthError",
    "EngineCheckError",
    "EngineError",
    "EngineRequestError",
    "EngineTimeoutError",
    "EngineUnavailableError",
    "InvalidSamplingError",
    "InvalidTokenError",
    "UnsupportedWeightUpdateError",
    "WeightUpdateError",
]


class EngineError(AgentRLError):
    """Base class of inference-engine errors."""


class EngineRequestError(EngineError, ValueError):
    """The request is invalid; nothing was generated and retrying it unchanged fails again."""


class InvalidTokenError(EngineRequestError):
    """A prompt token id is outside ``[0, vocab_size)``, or the prompt is empty."""


class ContextLengthError(EngineRequestError):
    """The prompt plus ``max_new_tokens`` does not fit the model's context window."""


class InvalidSamplingError(EngineRequestError):
    """A sampling field is unknown or out of range."""


class WeightUpdateError(EngineError):
    """A weight update was rejected; the engine keeps its previous weights and version."""


class UnsupportedWeightUpdateError(WeightUpdateError, ConfigError):
    """The engine does not serve this weight-update path (see ``Engine.capabilities``).

    Raised when the trainer is configured, so it is also a ``ConfigError``.
    """


class EngineUnavailableError(EngineError):
    """The engine is stopped, cannot be reached, or failed internally."""


class EngineTimeoutError(EngineError, TimeoutError):
    """A deadline passed while waiting for the engine."""


class EngineCheckError(EngineError):
    """``check_engine`` found an engine that breaks the ``Engine`` contract."""
