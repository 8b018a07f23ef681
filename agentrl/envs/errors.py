"""Errors raised by agentrl.envs: registry, env contract, checker, env server and client.

::

    AgentRLError
    └── EnvError
        ├── UnknownEnvError (KeyError)       no env registered under that id (message has a did-you-mean)
        ├── RegistrationError (ValueError)   a bad id or entry point passed to ``register``
        ├── EnvReferenceError (ImportError)  ``module:Class`` / ``file.py:Class`` / ``--import MODULE`` cannot
        │                                    be loaded: file missing, import failed, no such Env class
        ├── EnvDefinitionError (ValueError)  an env is built from unusable parts (an empty ``Rubric``, a
        │                                    Gymnasium env without a Discrete action space)
        ├── EnvContractError                 an env broke the contract at run time (bad return type, NaN reward)
        ├── ResetNeededError (RuntimeError)  ``step`` before ``reset``
        ├── EpisodeDoneError (RuntimeError)  ``step`` after the episode terminated or was truncated
        ├── InvalidActionError (ValueError)  the action is not an assistant ``Message``
        ├── ToolError                        raised inside a ``@tool`` to send an error message to the model
        ├── EnvInfraError (InfraError)       the env's own infrastructure failed (a sandbox died, a backing
        │                                    service is down): aborts the episode, never shown to the model
        ├── DatasetSourceError (ConfigError) a dataset source cannot be read: no such file, a bad line, no
        │                                    rows, a missing column (``--dataset``; fails before work starts)
        ├── RewardFunctionError (ConfigError) a reward function cannot be loaded, raised, or returned the
        │                                    wrong length, NaN or a non-number (names the function and row)
        ├── EnvCheckError (AssertionError)   ``check_env`` found a violation (message names check, cause, fix)
        └── RemoteEnvError                   the env server client failed
            ├── EnvConnectionError           could not connect / connection dropped (safe to retry a create)
            ├── EnvTimeoutError              connect or read deadline passed (client side)
            └── EnvServerError               the server answered 4xx/5xx; ``status``, ``detail``, ``infra_error``
                ├── EpisodeTimeoutError      504: the server's per-step deadline passed (infra_error "timeout")
                └── ServerBusyError          429/503: the live-episode cap is reached

Model mistakes (a malformed tool call, an unparsable answer) are *not* exceptions:
they become messages to the model and are counted in ``info``. Exceptions here are
for callers and env authors.
"""

from __future__ import annotations

from agentrl.errors import AgentRLError, ConfigError, InfraError

__all__ = [
    "DatasetSourceError",
    "EnvCheckError",
    "EnvConnectionError",
    "EnvContractError",
    "EnvDefinitionError",
    "EnvError",
    "EnvInfraError",
    "EnvReferenceError",
    "EnvServerError",
    "EnvTimeoutError",
    "EpisodeDoneError",
    "EpisodeTimeoutError",
    "InvalidActionError",
    "RegistrationError",
    "RemoteEnvError",
    "ResetNeededError",
    "RewardFunctionError",
    "ServerBusyError",
    "ToolError",
    "UnknownEnvError",
]


class EnvError(AgentRLError):
    """Base class of every error raised by agentrl.envs."""


class UnknownEnvError(EnvError, KeyError):
    """No environment is registered under the requested id."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class RegistrationError(EnvError, ValueError):
    """``register`` got a malformed id, a clashing id or an unusable entry point."""


class EnvReferenceError(EnvError, ImportError):
    """An env reference (``module:Class``, ``path/to/file.py:Class``) or an ``--import MODULE`` could not
    be loaded: the file is missing, the import raised (the message names the exception), the class is
    not there (the message lists the module's Env subclasses) or is not an Env subclass."""


class EnvDefinitionError(EnvError, ValueError):
    """An environment is built from unusable parts: a ``Rubric`` without reward functions,
    a Gymnasium env whose action space has no text form, action names that do not match it."""


class EnvContractError(EnvError):
    """An environment returned something the contract forbids (wrong type, non-finite reward)."""


class ResetNeededError(EnvError, RuntimeError):
    """``step`` was called before the first ``reset``."""


class EpisodeDoneError(EnvError, RuntimeError):
    """``step`` was called after the episode terminated or was truncated."""


class InvalidActionError(EnvError, ValueError):
    """The action passed to ``step`` is not an assistant message."""


class EnvInfraError(EnvError, InfraError):
    """The environment's own infrastructure failed, not the model: a sandbox died, a service it calls is down.

    Raised from a ``@tool`` (or ``reset``/``step``), it propagates out of ``step`` instead of
    becoming a tool message, so the episode is aborted, never scored, and a trainer retries it on
    a fresh env with the same seed. It is an :class:`agentrl.errors.InfraError`, the marker the
    sandbox's failures (``SandboxLost``, ``LeaseExpired``) carry too: a tool that runs code in a
    sandbox gets the same treatment for free, and ``except InfraError`` catches both.
    """


class DatasetSourceError(EnvError, ConfigError):
    """A dataset source cannot be used: no such file or id, a malformed line, no rows, a missing column.

    A :class:`~agentrl.errors.ConfigError`: the run stops before (or at) its first episode, naming
    the source, the row or column and the fix, instead of retrying it as infrastructure."""


class RewardFunctionError(EnvError, ConfigError):
    """A reward function cannot be loaded, raised, or returned something other than one finite number per
    completion. The message names the function, the row and what it returned. A
    :class:`~agentrl.errors.ConfigError`: the run stops (a bug in a reward is not infrastructure and
    retrying it would only hide it), unless the user chose ``--reward-errors zero``."""


class ToolError(EnvError):
    """Raise inside a ``@tool`` method: the message goes back to the model as a tool error."""


class EnvCheckError(EnvError, AssertionError):
    """``check_env`` found a contract violation."""


class RemoteEnvError(EnvError):
    """A call to an env server failed."""


class EnvConnectionError(RemoteEnvError):
    """The env server could not be reached, or the connection dropped."""


class EnvTimeoutError(RemoteEnvError):
    """A deadline passed: the client's connect/read deadline or the server's per-step deadline."""


class EnvServerError(RemoteEnvError):
    """The env server answered with an error status.

    ``infra_error`` is set when the server classified the failure as an
    infrastructure error of the episode (``"timeout"``, ``"env_error"``): the
    trainer retries such an episode on a fresh env instead of scoring it.
    """

    def __init__(self, message: str, *, status: int, detail: str, infra_error: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail
        self.infra_error = infra_error


class EpisodeTimeoutError(EnvServerError, EnvTimeoutError):
    """The server's per-step deadline passed; the episode is marked ``infra_error: timeout``."""


class ServerBusyError(EnvServerError):
    """The env server refused a new episode because its live-episode cap is reached (429/503)."""
