"""Every registered environment passes check_env (the conformance checker)."""

from __future__ import annotations

import pytest

import agentrl.envs as envs
from agentrl.envs.checker import check_env

SHIPPED = {"countdown-v0", "calculator-v0", "guess-number-v0", "frozenlake-v0", "shop-v0"}


def test_shipped_envs_are_registered_and_load_cleanly() -> None:
    assert {s.id for s in envs.list_envs()} >= SHIPPED
    assert envs.load_errors() == {}


@pytest.mark.parametrize("env_id", [s.id for s in envs.list_envs()])
def test_check_env(env_id: str) -> None:
    report = check_env(env_id)
    assert {"oracle", "independence", "async", "step-after-end"} <= set(report.passed)
    assert report.oracle_return == envs.make(env_id).reward_range[1]


@pytest.mark.parametrize("env_id", sorted(SHIPPED))
def test_shipped_env_has_readme(env_id: str) -> None:
    import importlib
    from pathlib import Path

    module = importlib.import_module(str(envs.spec(env_id).entry_point).split(":")[0])
    readme = Path(module.__file__ or "").parent / "README.md"
    assert readme.is_file() and "oracle" in readme.read_text().lower()
