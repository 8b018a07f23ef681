"""agentrl.envs exports exactly its documented public API."""

from __future__ import annotations

import agentrl.envs as envs
from agentrl.errors import AgentRLError


def test_every_exported_name_resolves() -> None:
    for name in envs.__all__:
        assert getattr(envs, name) is not None, name
    assert envs.__all__ == sorted(envs.__all__)


def test_every_env_error_is_an_agentrl_error() -> None:
    errors = [getattr(envs, n) for n in envs.__all__ if n.endswith("Error")]
    assert len(errors) >= 14
    assert all(issubclass(e, envs.EnvError) and issubclass(e, AgentRLError) for e in errors)
