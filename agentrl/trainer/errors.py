"""Trainer errors: what can go wrong in rollout, training, weight sync and checkpoints.

::

    AgentRLError
    ├── ConfigError                (agentrl.errors) bad option / flag / TOML key, raised before heavy work
    └── TrainerError               any trainer failure below
        ├── RolloutError           a group could not be completed (infra retries exhausted)
        ├── EpisodeDeadlineError   (TimeoutError) an episode's deadline passed while the env ran, not the model
        ├── AgentError             an --agent program failed to play its episode for a reason the model
        │                          cannot cause (cannot start, killed by a signal, cut off, hung in its own code)
        ├── BackendError           the training backend failed (bad batch, distributed setup, deadline)
        ├── LossInputError         (ValueError) a loss or advantage got inputs it cannot use (an RLOO group of 1)
        ├── EvalInputError         (ValueError) pass@k or an interval got inputs it cannot use (k > n samples)
        ├── WeightSyncError        pushing weights to the engine failed; the version was not bumped
        └── CheckpointError        a checkpoint is missing, incomplete or does not match the run

A failure inside one episode is not an exception: it is recorded on the
:class:`~agentrl.types.Trajectory` (``status``/``error``) and counted in metrics.
Only when a whole group cannot be completed after retries does :class:`RolloutError` surface.
"""

from __future__ import annotations

from agentrl.errors import AgentRLError

__all__ = [
    "AgentError",
    "BackendError",
    "CheckpointError",
    "EpisodeDeadlineError",
    "EvalInputError",
    "LossInputError",
    "RolloutError",
    "TrainerError",
    "WeightSyncError",
]


class TrainerError(AgentRLError):
    """Base class of every trainer failure."""


class RolloutError(TrainerError):
    """A group of episodes could not be completed (infrastructure retries exhausted)."""


class EpisodeDeadlineError(TrainerError, TimeoutError):
    """An episode's deadline (``rollout.episode_timeout_s``) passed while the env ran (reset or step),
    or before the model answered a turn. Infrastructure: retried. A deadline that interrupts the
    model's generation is the model's doing and is scored instead (:mod:`agentrl.trainer.rollout`)."""


class AgentError(TrainerError):
    """An ``--agent`` program failed its episode for a reason the model cannot cause: it could not
    start, was killed by a signal, lost the gateway, outlived its deadline in its own code or never
    called the model. Infrastructure: the rollout retries the episode, never scores it
    (:mod:`agentrl.trainer.agent` says what is the model's instead)."""


class BackendError(TrainerError):
    """The training backend failed: a malformed batch, distributed setup, or a collective deadline."""


class LossInputError(TrainerError, ValueError):
    """A loss or advantage function got inputs it cannot use (e.g. an RLOO group with one episode)."""


class EvalInputError(TrainerError, ValueError):
    """The pass@k estimator or a confidence interval got inputs it cannot use (k > n samples, no tasks)."""


class WeightSyncError(TrainerError):
    """Weights could not be pushed to the engine; the policy version was left unchanged."""


class CheckpointError(TrainerError):
    """A checkpoint is missing, incomplete, or was written by an incompatible run."""
