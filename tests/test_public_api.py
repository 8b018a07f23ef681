"""The top-level public API is exactly what ``__all__`` says, and every name resolves."""

from __future__ import annotations

import importlib

import pytest

import agentrl

PACKAGES = [
    "agentrl",
    "agentrl.envs",
    "agentrl.session",
    "agentrl.engines",
    "agentrl.trainer",
    "agentrl.models",
]


def test_top_level_all_is_exact():
    public = {
        n
        for n in dir(agentrl)
        if not n.startswith("_") and not isinstance(getattr(agentrl, n), type(agentrl))
    }
    assert public - {"annotations"} == set(agentrl.__all__) - {"__version__"}


@pytest.mark.parametrize("name", PACKAGES)
def test_all_names_resolve(name):
    mod = importlib.import_module(name)
    for symbol in getattr(mod, "__all__", []):
        assert hasattr(mod, symbol), f"{name}.__all__ lists {symbol!r} but it does not exist"
    assert len(set(getattr(mod, "__all__", []))) == len(getattr(mod, "__all__", []))
